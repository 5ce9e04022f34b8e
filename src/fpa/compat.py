"""Shims over the installed transformers version, shared by fpa.models and fpa.cache.

Imports transformers (only what it names): import it where transformers is needed anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.utils import ModelOutput

# transformers >= 5.3 renamed the cache argument of forward and generate, and the cache field of
# model outputs, "past_key_values" -> "cache"; the old name still works there but warns (generate:
# a FutureWarning; forward and outputs: the logged "`past_key_values`/`cache_params` are
# deprecated"). Every call that passes a cache to a model or to generate spells it
# ``**{CACHE_ARG: cache}``, the installed name. (FPA's own models take both names on every version.)
CACHE_ARG = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def output_cache(out):
    """The cache a model output carries, None if none. A transformers ``ModelOutput`` is read under
    ``CACHE_ARG`` only (on >= 5.3 an output built with the old name holds it under the new one, and
    reading the old name logs the deprecation); any other object (another library's output, a
    dict) under either name, ``cache`` or ``past_key_values``, whatever transformers is installed."""
    if isinstance(out, ModelOutput):
        return out.get(CACHE_ARG)
    for name in (CACHE_ARG, "cache", "past_key_values"):
        c = out.get(name) if isinstance(out, dict) else getattr(out, name, None)
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
