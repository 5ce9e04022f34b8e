"""Greedy decoding with an (optionally evicting) KV cache and chunked prefill."""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.cache.prefill import run_chunks
from fpa.checks import positive_int


@torch.no_grad()
def greedy_decode(
    model, input_ids: Tensor, max_new_tokens: int, cache=None, chunk_size: int | None = None
) -> tuple[Tensor, object]:
    """Greedy continuation of ``input_ids`` (B, T) -> (new ids (B, max_new_tokens), final cache).

    ``model(input_ids=..., cache=cache, use_cache=True)`` (``past_key_values=`` on transformers
    5.2: fpa.compat.CACHE_ARG) must return ``.logits`` (B, t, V) and the cache under the same name
    (fpa.compat.output_cache). The prompt is fed in chunks of
    ``chunk_size`` tokens (all at once if None) by ``fpa.cache.prefill.run_chunks``, so an evicting
    cache applies its policy after every chunk, as it would while streaming a long prompt; each new
    token is then one forward call.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be (B, T) with T >= 1, got {tuple(input_ids.shape)}")
    positive_int("max_new_tokens", max_new_tokens)
    if chunk_size is not None:
        positive_int("chunk_size", chunk_size, "or None")
    logits, cache = run_chunks(model, input_ids, cache, chunk_size)
    new = []
    for i in range(max_new_tokens):
        tok = logits.argmax(-1, keepdim=True)  # (B, 1)
        new.append(tok)
        if i + 1 < max_new_tokens:
            logits, cache = run_chunks(model, tok, cache, None)
    return torch.cat(new, 1), cache
