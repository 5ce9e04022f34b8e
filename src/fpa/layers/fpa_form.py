"""The FPA form of attention, shared by FPA and FoX (P2: FoX is FPA with field = level =
cumsum(log f) and beta = 1): the walk continued across cache calls, padding, dense weights for
inspection, and attention against the paged KV cache."""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.cache.layer import LayerCache
from fpa.cache.paged import fpa_past_bias
from fpa.cache.storage import PAD_BIG
from fpa.cache.weights import attention_weights, fpa_bias


def pad_out(field: Tensor, level: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """field, level (B, H, T) with +PAD_BIG at padding positions (mask (B, T) False)."""
    if mask is None:
        return field, level
    pad = ~mask[:, None, :]
    return field.masked_fill(pad, PAD_BIG), level.masked_fill(pad, PAD_BIG)


def dense_weights(q: Tensor, k: Tensor, field: Tensor, level: Tensor, beta) -> Tensor:
    """Attention probabilities (B, Hq, T, T) of a whole sequence, FPA penalties included."""
    b = beta.detach() if torch.is_tensor(beta) else beta
    return attention_weights(q, k, fpa_bias(field, level, field[..., :0], b), q.shape[-1] ** -0.5)


def continue_walk(increments: Tensor, state: LayerCache | None) -> Tensor:
    """field = cumsum(increments) (B, H, T), continued from the cached walk's last value."""
    field = torch.cumsum(increments, dim=-1)
    if state is not None:
        if state.last_field is not None:
            field = field + state.last_field[..., None]
        state.last_field = field[..., -1]
    return field


def fpa_cached(q, k, v, field, level, beta, state: LayerCache, backend="auto", mask=None, pos=None,
                need_weights=False):
    """Cache form of FPA: attend over the paged cache (level and pm_j = min of the field after key j
    up to before the new tokens, docs/fpa.md) and the new keys, then store the new keys.
    q (B, Hq, T, D), k, v (B, Hkv, T, D), field/level (B, Hq, T) -> ((B, Hq, T, D), weights or None).
    ``backend`` is unused: the cache is read block by block by fpa.cache.paged."""
    b = beta.detach() if torch.is_tensor(beta) else beta
    new_bias = fpa_bias(field, level, field[..., :0], b)  # (B, Hq, T, T), -inf above the diagonal
    return state.attend(q, k, v, fpa_past_bias(state.store, field, b), new_bias, need_weights,
                        field=field, level=level, pos=pos, mask=mask)

