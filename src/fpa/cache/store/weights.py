"""Dense attention weights of the new queries over a cache (for TOVA and H2O).

The decoding outputs come from the attention ops; these weights are computed beside them,
densely over the cache (O(T * C) for T new tokens), and tests check weights @ v against the ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops.fpa.reference import penalty


def causal_block_mask(Tq: int, Tk: int, device) -> Tensor:
    """(Tq, Tk) bool: the first Tk - Tq (cached) keys are visible to every query, the last Tq causally."""
    rows = torch.arange(Tq, device=device)[:, None] + (Tk - Tq)
    return torch.arange(Tk, device=device)[None, :] <= rows


def fpa_bias(field: Tensor, level: Tensor, past_min: Tensor, beta: Tensor | float) -> Tensor:
    """-beta * dip for the cache form, with -inf above the diagonal: (B, H, Tq, Tk) float32.

    field (B, H, Tq) at the new positions, level (B, H, Tk), past_min (B, H, Tk - Tq).
    """
    Tq, Tk = field.shape[-1], level.shape[-1]
    # a number stays a Python float: torch.as_tensor of it on an accelerator is a host-to-device copy (a sync)
    b = (
        float(beta)
        if not torch.is_tensor(beta)
        else beta.to(device=field.device, dtype=torch.float32).reshape(-1)[None, :, None, None]
    )
    bias = -b * penalty(field.float(), level.float(), Tq, past_min.float())
    return bias.masked_fill(~causal_block_mask(Tq, Tk, field.device), float("-inf"))


def attention_weights(q: Tensor, k: Tensor, bias: Tensor, scale: float) -> Tensor:
    """softmax(scale * q k^T + bias) in float32: q (B, Hq, Tq, D), k (B, Hkv, Tk, D), bias
    broadcastable to (B, Hq, Tq, Tk) (-inf where not allowed) -> (B, Hq, Tq, Tk)."""
    groups = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(groups, dim=1)
    return torch.softmax(torch.matmul(q.float(), kk.transpose(-1, -2)) * scale + bias, dim=-1)
