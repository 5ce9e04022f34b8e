"""The field side of FPA: walks, dips, live keys and the FoX conversion (docs/fpa.md, "Definition"
and "Properties").

Positions are 0-based here. For a query i and key j <= i,

    dip(i, j) = max(0, level[j] - min_{j < t <= i} field[t]),   dip(i, i) = 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops.checks import check_float, check_no_nan


def walk(increments: Tensor) -> Tensor:
    """Cumulative sum of signed increments (..., T) -> field (..., T), accumulated in >= float32.

    With level = walk(increments) as well, the live keys form a stack (P3).
    """
    check_float("increments", increments)
    acc = torch.float64 if increments.dtype == torch.float64 else torch.float32
    return torch.cumsum(increments.to(acc), dim=-1)


def fox_as_fpa(log_fgate: Tensor) -> tuple[Tensor, Tensor]:
    """P2: FoX's log forget gates (..., T) (<= 0) -> (field, level) with FPA == FoX at beta = 1.

    field = level = cumsum(log_fgate); the field is non-increasing, so its minimum over
    (j, i] is field[i] and dip(i, j) = field[j] - field[i] = -sum_{j<u<=i} log f_u.
    """
    check_float("log_fgate", log_fgate)
    if (log_fgate > 0).any():
        raise ValueError("log_fgate must be <= 0 (the log of a forget gate in (0, 1])")
    phi = walk(log_fgate)
    return phi, phi


def range_min(field: Tensor) -> Tensor:
    """Dense M[..., i, j] = min_{j < t <= i} field[t] (+inf where the range is empty). O(T^2).

    field: (..., T) -> (..., T, T) with rows = queries i, columns = keys j.
    """
    T = field.shape[-1]
    t = torch.arange(T, device=field.device)
    after_key = t[:, None] > t[None, :]  # (t, j): t > j
    x = torch.where(
        after_key, field[..., :, None], torch.full((), float("inf"), dtype=field.dtype, device=field.device)
    )
    return torch.cummin(x, dim=-2).values


def dip(field: Tensor, level: Tensor) -> Tensor:
    """Dense penalty dip[..., i, j] (0 for j >= i), from field and level (..., T). O(T^2) memory.

    For inspection and plots; the attention backends never build it.
    """
    check_float("field", field)
    check_float("level", level)
    if field.shape != level.shape:
        raise ValueError(f"field and level must have the same shape, got {tuple(field.shape)} and {tuple(level.shape)}")
    check_no_nan("field", field)
    check_no_nan("level", level)
    return torch.relu(level[..., None, :] - range_min(field))


def live_keys(field: Tensor, level: Tensor) -> Tensor:
    """Boolean (..., T, T): key j is live at query i iff j <= i and dip(i, j) == 0."""
    T = field.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=field.device).tril()
    return (dip(field, level) == 0) & causal


def past_min_from_field(field: Tensor) -> Tensor:
    """Running minimum after each key up to the end: out[..., j] = min_{j < t < T} field[t], +inf at T-1.

    field: (..., P) -> (..., P). Differentiable (gradient goes to the argmin position).
    This is the per-key state a KV cache keeps (docs/fpa.md, "Eviction rule").
    """
    if field.shape[-1] == 0:
        return field.clone()
    suffix = torch.cummin(field.flip(-1), dim=-1).values.flip(-1)  # min_{t >= j}
    inf = torch.full_like(field[..., :1], float("inf"))
    return torch.cat([suffix[..., 1:], inf], dim=-1)
