"""Dense reference for FoX (Forgetting Transformer) attention: bias(i, j) = sum_{j<u<=i} log f_u."""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops.checks import math_dtype
from fpa.ops.softmax import causal_softmax_attention


def fox_reference(q: Tensor, k: Tensor, v: Tensor, log_fgate: Tensor, scale: float) -> Tensor:
    """q (B, Hq, Tq, D); k, v (B, Hkv, Tk, *); log_fgate (B, Hq, Tk) -> (B, Hq, Tq, Dv)."""
    dt = math_dtype(q, log_fgate)
    c = torch.cumsum(log_fgate.to(dt), dim=-1)  # c[i] - c[j] = sum_{j<u<=i} log f_u
    Tq = q.shape[2]
    bias = c[..., -Tq:, None] - c[..., None, :]
    return causal_softmax_attention(q, k, v, bias, scale)
