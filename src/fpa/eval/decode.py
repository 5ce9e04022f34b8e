"""Greedy decoding with an (optionally evicting) KV cache and chunked prefill."""

from __future__ import annotations

import torch
from torch import Tensor


def output_cache(out):
    """The cache a model output carries (transformers >= 5.3 names the field ``cache``, earlier
    versions ``past_key_values``)."""
    c = getattr(out, "cache", None) if "cache" in getattr(out, "keys", lambda: ())() else None
    return c if c is not None else out.past_key_values


@torch.no_grad()
def greedy_decode(
    model, input_ids: Tensor, max_new_tokens: int, cache=None, chunk_size: int | None = None
) -> tuple[Tensor, object]:
    """Greedy continuation of ``input_ids`` (B, T) -> (new ids (B, max_new_tokens), final cache).

    ``model(input_ids=..., past_key_values=cache, use_cache=True)`` must return ``.logits``
    (B, t, V) and ``.past_key_values`` (or ``.cache``). The prompt is fed in chunks of ``chunk_size`` tokens
    (all at once if None) so an evicting cache applies its policy after every chunk, as it would
    while streaming a long prompt; each new token is then one forward call.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be (B, T) with T >= 1, got {tuple(input_ids.shape)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    T = input_ids.shape[1]

    step = T if chunk_size is None else chunk_size
    for a in range(0, T, step):
        out = model(input_ids=input_ids[:, a : a + step], past_key_values=cache, use_cache=True)
        cache = output_cache(out)
    logits = out.logits[:, -1]  # T >= 1, so the prefill ran at least once
    new = []
    for i in range(max_new_tokens):
        tok = logits.argmax(-1, keepdim=True)  # (B, 1)
        new.append(tok)
        if i + 1 < max_new_tokens:
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache, logits = output_cache(out), out.logits[:, -1]
    return torch.cat(new, 1), cache
