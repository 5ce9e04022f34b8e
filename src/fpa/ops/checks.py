"""Argument validation shared by every attention op.

Every public op validates its inputs here, so that a bad call fails with a
message naming the argument and what was expected, before any backend runs.
"""

from __future__ import annotations

import torch
from torch import Tensor

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_float(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating tensor (float16, bfloat16, float32 or float64), got {x.dtype}"
        )


def check_rank(name: str, x: Tensor, rank: int, layout: str) -> None:
    if x.dim() != rank:
        raise ValueError(f"{name} must have shape {layout} ({rank} dims), got shape {tuple(x.shape)}")


def check_no_nan(name: str, x: Tensor) -> None:
    # A NaN in the field poisons every minimum that includes it, silently; this costs one
    # reduction (and on CUDA a host sync), which is small next to the attention itself.
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN")


def check_same_device(named: dict[str, Tensor]) -> None:
    devices = {n: t.device for n, t in named.items()}
    first_name, first = next(iter(devices.items()))
    for n, d in devices.items():
        if d != first:
            raise ValueError(f"{n} is on {d} but {first_name} is on {first}: all inputs must be on one device")


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int, int, int]:
    """Validate q (B, Hq, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv).

    Returns (B, Hq, Hkv, Tq, Tk, D).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float(name, x)
    check_rank("q", q, 4, "(B, Hq, Tq, D)")
    check_rank("k", k, 4, "(B, Hkv, Tk, D)")
    check_rank("v", v, 4, "(B, Hkv, Tk, Dv)")
    check_same_device({"q": q, "k": k, "v": v})
    B, Hq, Tq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    Hkv, Tk = k.shape[1], k.shape[2]
    if k.shape[3] != D:
        raise ValueError(f"k must have head dim D={D} like q, got shape {tuple(k.shape)}")
    if v.shape[1] != Hkv or v.shape[2] != Tk:
        raise ValueError(f"v must have shape (B, Hkv={Hkv}, Tk={Tk}, Dv), got {tuple(v.shape)}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(
            f"the number of query heads (q.shape[1]={Hq}) must be a multiple of the number of "
            f"key/value heads (k.shape[1]={Hkv})"
        )
    if Tq > Tk:
        raise ValueError(
            f"q has Tq={Tq} positions but k has only Tk={Tk}: the queries are the last Tq of the Tk positions"
        )
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return B, Hq, Hkv, Tq, Tk, D


def check_per_position(name: str, x: Tensor, B: int, H: int, T: int, ref: Tensor) -> None:
    check_float(name, x)
    if tuple(x.shape) != (B, H, T):
        raise ValueError(f"{name} must have shape (B, Hq, T) = ({B}, {H}, {T}), got {tuple(x.shape)}")
    check_same_device({"q": ref, name: x})
    check_no_nan(name, x)


def beta_per_head(beta: float | Tensor, Hq: int, device: torch.device) -> Tensor:
    """Turn beta (a float, or a tensor broadcastable to (Hq,)) into a float32/64 (Hq,) tensor.

    The broadcast is done with differentiable ops, so a learned beta gets its gradient.
    """
    if isinstance(beta, bool) or not isinstance(beta, (int, float, Tensor)):
        raise TypeError(f"beta must be a float or a tensor broadcastable to (Hq,), got {type(beta).__name__}")
    if isinstance(beta, Tensor):
        if beta.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"beta must be a floating tensor, got {beta.dtype}")
        if beta.device != device:
            raise ValueError(f"beta is on {beta.device} but q is on {device}")
        try:
            b = torch.broadcast_to(beta, (Hq,))
        except RuntimeError:
            raise ValueError(f"beta must be broadcastable to (Hq,) = ({Hq},), got shape {tuple(beta.shape)}") from None
        bad = ~torch.isfinite(b) | (b < 0)
        if bad.any():
            raise ValueError("beta must be finite and >= 0 for every head")
        return b.to(torch.float64 if beta.dtype == torch.float64 else torch.float32)
    if not (beta >= 0 and beta < float("inf")):
        raise ValueError(f"beta must be finite and >= 0, got {beta}")
    return torch.full((Hq,), float(beta), device=device, dtype=torch.float32)


def check_scale(scale: float | None, D: int) -> float:
    if scale is None:
        return D**-0.5 if D > 0 else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not (abs(scale) < float("inf")):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def math_dtype(*xs: Tensor) -> torch.dtype:
    """Field minima and softmax run in float32, or float64 when any input is float64."""
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32
