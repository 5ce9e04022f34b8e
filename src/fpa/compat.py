"""Shims over the installed transformers version, shared by fpa.models and fpa.cache.

Imports transformers (only what it names): import it where transformers is needed anyway.
"""

from __future__ import annotations

from transformers.modeling_outputs import BaseModelOutputWithPast

# transformers >= 5.3 renamed the cache output field and generate argument "past_key_values" to
# "cache" (the old name still works there, with a deprecation warning): use the installed name.
CACHE_ARG = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def output_cache(out):
    """The cache of a model output, under whichever name the installed transformers uses."""
    return out.get(CACHE_ARG) if hasattr(out, "get") else getattr(out, CACHE_ARG, None)


__all__ = ["CACHE_ARG", "output_cache"]
