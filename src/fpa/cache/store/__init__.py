"""The paged KV store: the cache's memory, and attention against it (what the layers need to decode).

- ``storage``: ``PagedStore``, the per-layer paged key store (and ``PAD_BIG``, the padding value
  of level / field);
- ``paged``: attention of new queries over a store plus the new keys, read block by block, and
  the biases of the cached keys (``fpa_past_bias``, ``alibi_past_bias``);
- ``weights``: dense attention weights and the FPA bias in the cache form (``fpa_bias``);
- ``state``: ``LayerInfo`` and ``LayerState``, one layer's decoding state, the interface the
  layers call (``configure``, ``positions``, ``attend``; ``fpa.cache.LayerCache`` is a
  ``LayerState`` that is also a transformers cache layer).

Imports nothing beyond torch, fpa.ops and fpa.checks: ``fpa.layers`` builds on it (and on nothing
else of fpa.cache), and so does the rest of ``fpa.cache`` (the transformers cache, the policies).
``fpa/cache/__init__.py`` imports its submodules lazily, so importing this store (as ``import
fpa.layers`` does) imports neither transformers nor the rest of fpa.cache.
"""

from fpa.cache.store.paged import alibi_past_bias, cached_attention, fpa_past_bias
from fpa.cache.store.state import LayerInfo, LayerState
from fpa.cache.store.storage import PAD_BIG, PagedStore
from fpa.cache.store.weights import attention_weights, causal_block_mask, fpa_bias

__all__ = [
    "PAD_BIG",
    "LayerInfo",
    "LayerState",
    "PagedStore",
    "alibi_past_bias",
    "attention_weights",
    "cached_attention",
    "causal_block_mask",
    "fpa_bias",
    "fpa_past_bias",
]
