"""Shims over the installed transformers version, shared by fpa.models and fpa.cache.

Imports transformers (only what it names): import it where transformers is needed anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from transformers.modeling_outputs import BaseModelOutputWithPast

# transformers >= 5.3 renamed the cache output field and generate argument "past_key_values" to
# "cache" (the old name still works there, with a deprecation warning): use the installed name.
CACHE_ARG = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def output_cache(out):
    """The cache of a model output, under whichever name the installed transformers uses (an
    output of another library's model may carry the other name: it is read too); None if none."""
    for name in (CACHE_ARG, "past_key_values"):
        c = out.get(name) if hasattr(out, "get") else getattr(out, name, None)
        if c is not None:
            return c
    return None


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Within the block, transformers' own progress bars (e.g. "Writing model shards" in
    ``save_pretrained``, "Loading weights" in ``from_pretrained``) are off unless ``enabled``
    (then left as they are); the switch is restored afterwards."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


__all__ = ["CACHE_ARG", "hf_progress_bars", "output_cache"]
