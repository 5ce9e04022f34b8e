"""Dense reference for First Passage Attention: the definition, written plainly. O(T^2) memory.

It works in float64 when any input is float64, else float32, and returns the dtype of q.
It shares field.range_min with other code, so the tests also compare it with an independent
loop oracle (tests/ops/fpa_oracle.py).

Gradient conventions (autograd through torch.relu and torch.cummin): at dip exactly 0 the
penalty's gradient is 0 (torch.relu); where several t in (j, i] tie for the field's minimum, the
gradient goes to the LATEST of them (torch.cummin returns the last index of a tie). In the cache
form, a tie between past_min[j] and the running minimum of the new field splits the gradient
equally between them (torch.minimum).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops.checks import math_dtype
from fpa.ops.field import dip, range_min
from fpa.ops.softmax import causal_softmax_attention


def penalty(field: Tensor, level: Tensor, Tq: int, past_min: Tensor | None) -> Tensor:
    """dip for the last Tq queries against all Tk keys: (B, H, Tq, Tk).

    Without past_min, field and level are (B, H, Tk). With past_min (B, H, P), P = Tk - Tq,
    field is (B, H, Tq) (the query positions only) and past_min[j] is the field's minimum after
    cached key j up to just before the first query.
    """
    if past_min is None:
        return dip(field, level)[..., level.shape[-1] - Tq :, :]
    running = torch.cummin(field, dim=-1).values  # min over the new positions 0..r
    m_past = torch.minimum(past_min[..., None, :], running[..., :, None])  # (Tq, P)
    m_new = range_min(field)  # (Tq, Tq)
    m = torch.cat([m_past, m_new], dim=-1)
    return torch.relu(level[..., None, :] - m)


def fpa_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    beta: Tensor,
    scale: float,
    past_min: Tensor | None = None,
) -> Tensor:
    """q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D/Dv); level (B, Hq, Tk); beta (Hq,) -> (B, Hq, Tq, Dv).

    field is (B, Hq, Tk), or (B, Hq, Tq) together with past_min (B, Hq, Tk - Tq).
    """
    dt = math_dtype(q, field, level)
    cast = [x.to(dt) for x in (field, level)]
    pm = None if past_min is None else past_min.to(dt)
    pen = penalty(cast[0], cast[1], q.shape[2], pm)
    bias = -beta.to(dt)[None, :, None, None] * pen
    return causal_softmax_attention(q, k, v, bias, scale)
