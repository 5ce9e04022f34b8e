"""The one chunked forward loop (``run_chunks``: the prompt fed in chunks so that the cache's policy
runs after each), chunked prefill, and greedy generation through ``model.generate``.
fpa.eval.decode.greedy_decode and fpa.eval.growth drive ``run_chunks`` too."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fpa.cache.cache import FPACache
from fpa.checks import positive_int
from fpa.compat import CACHE_ARG, output_cache


@torch.no_grad()
def run_chunks(model: Any, input_ids: Tensor, cache: Any, chunk_size: int | None) -> tuple[Tensor, Any]:
    """Feed ``input_ids`` (B, T >= 1) through ``model`` in chunks of ``chunk_size`` tokens (all at
    once if None), each call ``model(input_ids=chunk, cache=cache, use_cache=True)`` (the cache
    argument under its installed name, fpa.compat.CACHE_ARG).
    ``cache``: None lets the model make one. Returns (the logits of the last position (B, vocab),
    the cache the last output carries). Callers validate their arguments."""
    step = input_ids.shape[1] if chunk_size is None else chunk_size
    out = None
    for a in range(0, input_ids.shape[1], step):
        out = model(input_ids=input_ids[:, a : a + step], **{CACHE_ARG: cache}, use_cache=True)
        cache = output_cache(out)
    assert out is not None  # T >= 1: at least one chunk
    return out.logits[:, -1], cache


@torch.no_grad()
def prefill(model: Any, input_ids: Tensor, cache: FPACache, chunk_size: int = 512) -> Tensor:
    """Run input_ids (B, T) through the model in chunks of chunk_size tokens, filling ``cache``
    (the policy is applied after each chunk, so at most budget + chunk_size keys are ever held).
    Returns the logits of the last position, (B, vocab)."""
    if not isinstance(cache, FPACache):
        raise ValueError(f"cache must be an FPACache, got {type(cache).__name__}")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must have shape (B, T) with T >= 1, got {tuple(input_ids.shape)}")
    return run_chunks(model, input_ids, cache, positive_int("chunk_size", chunk_size))[0]


@torch.no_grad()
def generate(
    model: Any,
    input_ids: Tensor,
    cache: FPACache,
    max_new_tokens: int,
    chunk_size: int = 512,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Greedy ``model.generate`` with ``cache``, the prompt prefilled in chunks of ``chunk_size``
    tokens (the policy running after each chunk, as ``prefill`` does).

    Exactly ``model.generate(input_ids, attention_mask=..., cache=cache,
    prefill_chunk_size=chunk_size, max_new_tokens=..., do_sample=False)``: the helper and
    ``model.generate`` agree for every policy when given the same ``prefill_chunk_size``; without
    it ``model.generate`` feeds the whole prompt in one call and the policy runs once, after it.
    Returns the sequences (B, T + max_new_tokens), as ``model.generate`` does.
    """
    if not isinstance(cache, FPACache):
        raise ValueError(f"cache must be an FPACache, got {type(cache).__name__}")
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape (B, T) with T >= 1, got {tuple(input_ids.shape)}")
    positive_int("max_new_tokens", max_new_tokens)
    chunk_size = positive_int("chunk_size", chunk_size)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    return model.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        prefill_chunk_size=chunk_size,
        pad_token_id=getattr(model.config, "pad_token_id", None) or 0,
        **{CACHE_ARG: cache},
    )
