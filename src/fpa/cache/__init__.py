"""KV-cache decoding with eviction: the model's own rule (P1) against budget heuristics.

The path a long-context evaluation takes::

    from fpa.cache import FPACache, FPAEviction, prefill, generate

    policy = FPAEviction(threshold=8.0)             # or SlidingWindow(budget=256), TOVA(256), ...
    cache = FPACache(policy)
    out = generate(model, prompt_ids, cache, max_new_tokens=8, chunk_size=512)
    # = model.generate(prompt_ids, cache=cache, prefill_chunk_size=512,
    #                  max_new_tokens=8, do_sample=False)   (transformers 5.2: past_key_values=cache,
    #                  or **{fpa.compat.CACHE_ARG: cache} for both)
    policy.kept_fraction                            # keys held / keys seen (also cache.kept_fraction())
    cache.bytes_held()                              # bytes actually allocated
    cache.bytes_live()                              # bytes of the kept keys alone

FPACache is a transformers ``Cache`` (one ``LayerCache`` per layer). ``model.generate`` starts
one by itself; given one, it continues from whatever the cache holds (it feeds the tokens the
cache has not seen). ``attention_mask`` padding is stored as padding slots (no key, no walk step,
no decay), so batched prompts of different lengths decode as each would alone, under any policy.
Without ``prefill_chunk_size`` the prompt is one forward call and the policy runs once after it.
Without a policy the cache can be cropped (assisted and prompt-lookup decoding) and keeps the
field history (B, Hq, T) float32 of FPA/FoX layers for that, counted in ``bytes_held``.

The policy runs after every forward call (each prefill chunk, each decode step), so a prompt
prefilled in chunks never holds more than budget + chunk keys per head (keys held; the allocated
slots may exceed that by the compaction slack, see fpa.cache.store.storage). Each (row, KV head) keeps
its own number of keys in its own blocks of a shared pool (paged storage, fpa.cache.store.storage):
evicted slots become holes, a row is compacted once its holes reach max(block, 5% of its keys)
(checked once every block_size tokens, so that decode steps read no device value: docs/cache.md,
"Host syncs while decoding"), freed blocks are reused, so bytes held <= 1.15 x the kept keys'
bytes + 3 blocks per row after every such check. The attention reads the pool block by block
(fpa.cache.store.paged); holes never change outputs (tested against the full forward and against
dense attention over exactly the kept keys). docs/cache.md has the layout and the measured figures.

Walk mode: with threshold 0 the rule is exactly P3's stack pop (tested against a list
simulation); with threshold > 0 the same rule is applied as is, which can drop a key below the
top of the stack.

Policies (fpa.cache.policies): FPAEviction(threshold, certified=False) for attention="fpa",
FoXEviction(threshold) for attention="fox" (ValueError on any other model); SlidingWindow(budget),
StreamingLLM(budget, sinks=4), TOVA(budget), H2O(budget, recent=budget // 2) for every attention
type. budget = keys kept per KV head.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fpa.cache.cache import FPACache
    from fpa.cache.layer import LayerCache, LayerInfo
    from fpa.cache.policies import H2O, TOVA, FoXEviction, FPAEviction, Policy, SlidingWindow, StreamingLLM
    from fpa.cache.prefill import generate, prefill

# name -> the submodule that defines it. Imported on first access (PEP 562), so that importing the
# paged store (fpa.cache.store, which fpa.layers builds on) runs this file without importing the
# transformers cache (fpa.cache.cache, which imports transformers) or the policies.
_SOURCES = {
    "FPACache": "cache",
    "FPAEviction": "policies",
    "FoXEviction": "policies",
    "H2O": "policies",
    "LayerCache": "layer",
    "LayerInfo": "layer",
    "Policy": "policies",
    "SlidingWindow": "policies",
    "StreamingLLM": "policies",
    "TOVA": "policies",
    "generate": "prefill",
    "prefill": "prefill",
}

__all__ = [
    "FPACache",
    "FPAEviction",
    "FoXEviction",
    "H2O",
    "LayerCache",
    "LayerInfo",
    "Policy",
    "SlidingWindow",
    "StreamingLLM",
    "TOVA",
    "generate",
    "prefill",
]


def __getattr__(name: str) -> object:
    if name not in _SOURCES:
        raise AttributeError(f"module 'fpa.cache' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fpa.cache.{_SOURCES[name]}"), name)
    globals()[name] = value  # later reads skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """fpa.cache, whose names stay what ``_SOURCES`` says when a submodule shares one: the import
    system binds every submodule on its package once loaded, so importing fpa.cache.prefill (as
    fpa.eval does) would otherwise turn ``fpa.cache.prefill`` into that module, not the function."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _SOURCES and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
