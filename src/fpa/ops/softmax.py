"""Dense causal softmax attention with an additive bias: the shared core of the references."""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops.checks import math_dtype


def causal_softmax_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
    """softmax(scale * q k^T + bias) v over keys j <= P + r, the queries being the last Tq positions.

    q (B, Hq, Tq, D); k, v (B, Hkv, Tk, *) with Hq % Hkv == 0; bias (B, Hq, Tq, Tk) -> (B, Hq, Tq, Dv)
    in q's dtype, computed in float32 (float64 when q or bias is float64).
    """
    dt = math_dtype(q, bias)
    B, Hq, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    kk = k.to(dt).repeat_interleave(groups, dim=1)
    vv = v.to(dt).repeat_interleave(groups, dim=1)
    s = torch.matmul(q.to(dt), kk.transpose(-1, -2)) * scale + bias
    rows = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
    cols = torch.arange(Tk, device=q.device)[None, :]
    s = s.masked_fill(cols > rows, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, vv).to(q.dtype)
