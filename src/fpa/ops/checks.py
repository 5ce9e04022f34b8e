"""Argument validation shared by every attention op: tensor dtypes, shapes, devices and values,
the softmax scale and beta. (The number checks of settings, ``positive_int`` and the others, are
in fpa.checks.)

Every public op validates its inputs here, so that a bad call fails with a
message naming the argument and what was expected, before any backend runs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_float(name: str, x: Tensor) -> None:
    """Check that ``x`` is a floating tensor (float16, bfloat16, float32 or float64).

    Args:
        name: The argument's name, for the message.
        x: The value passed.

    Raises:
        TypeError: ``x`` is not a tensor, or not of a floating dtype.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating tensor (float16, bfloat16, float32 or float64), got {x.dtype}")


def check_rank(name: str, x: Tensor, rank: int, layout: str) -> None:
    """Check that ``x`` has ``rank`` dimensions.

    Args:
        name: The argument's name, for the message.
        x: The tensor passed.
        rank: The number of dimensions expected.
        layout: The expected shape in words, e.g. ``"(B, Hq, Tq, D)"``, for the message.

    Raises:
        ValueError: ``x.dim() != rank``.
    """
    if x.dim() != rank:
        raise ValueError(f"{name} must have shape {layout} ({rank} dims), got shape {tuple(x.shape)}")


def check_no_nan(name: str, x: Tensor) -> None:
    """Check that ``x`` holds no NaN.

    Raises:
        ValueError: ``x`` contains a NaN.
    """
    # A NaN in the field poisons every minimum that includes it, silently; this costs one
    # reduction (and on CUDA a host sync), which is small next to the attention itself.
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN")


def check_same_device(named: dict[str, Tensor]) -> None:
    """Check that all tensors are on one device.

    Args:
        named: Argument name -> tensor; at least one entry.

    Raises:
        ValueError: A tensor is on another device than the first one, naming both.
    """
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
    """Check a per-head, per-position input such as the field or the level: floating, (B, H, T),
    on the device of ``ref`` (the query tensor).

    Raises:
        TypeError: ``x`` is not a floating tensor.
        ValueError: ``x`` has another shape than (B, H, T), or is on another device than ``ref``.
    """
    check_float(name, x)
    if tuple(x.shape) == (B, T, H) != (B, H, T):  # q (B, T, H, D) was read as (B, H, T, D)
        raise ValueError(
            f"q must have shape (B, Hq, T, D), got {tuple(ref.shape)}, which is (B, T, H, D) beside {name} "
            f"{tuple(x.shape)}: pass q.transpose(1, 2) (and k, v likewise)"
        )
    if tuple(x.shape) != (B, H, T):
        raise ValueError(f"{name} must have shape (B, Hq, T) = ({B}, {H}, {T}), got {tuple(x.shape)}")
    check_same_device({"q": ref, name: x})


def beta_per_head(beta: float | Tensor, Hq: int, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    """Turn beta (a float, or a tensor broadcastable to (Hq,)) into an (Hq,) tensor.

    A Python float becomes a tensor of `dtype` (the math dtype: float64 for float64 inputs, so
    it is not rounded to float32). A tensor keeps float64 if it is float64, else float32. The
    broadcast is done with differentiable ops, so a learned beta gets its gradient. The VALUES
    of a tensor beta (finite, >= 0) are checked in check_values, not here (that needs a sync).
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
        return b.to(torch.float64 if beta.dtype == torch.float64 else torch.float32)
    if not (beta >= 0 and beta < float("inf")):
        raise ValueError(f"beta must be finite and >= 0, got {beta}")
    return torch.full((Hq,), float(beta), device=device, dtype=dtype)


def _minmax(x: Tensor) -> tuple[Tensor, Tensor]:
    """(min, max) of x as float64 scalars; NaN if x holds a NaN. x must be non-empty."""
    lo, hi = torch.aminmax(x.detach())
    return lo.double(), hi.double()


def check_values(
    dt: torch.dtype,
    scale: float,
    tensors: dict[str, Tensor],
    *,
    no_inf: tuple[str, ...] = (),
    plus_inf_ok: tuple[str, ...] = (),
    nonneg: tuple[str, ...] = (),
    nonpos: tuple[str, ...] = (),
) -> dict[str, tuple[float, float]]:
    """Value checks that cost one reduction per tensor and ONE host sync in all.

    tensors: name -> tensor (empty ones are skipped). Every tensor must be free of NaN; those in
    `no_inf` free of +-inf; those in `plus_inf_ok` may hold +inf but not -inf; `nonneg` >= 0,
    `nonpos` <= 0. Then the logits are bounded: |scale| * D * max|q| * max|k| must stay below
    half the largest value of the math dtype `dt` (so scores minus their row max cannot
    overflow), and Tk * max|v| below its largest value (the unnormalised p @ v sums).
    Raises ValueError naming the argument, what was expected and what came.
    Returns name -> (min, max) for the caller's own range checks.
    """
    names = [n for n, x in tensors.items() if x.numel() > 0]
    if not names:
        return {}
    stats = torch.stack([s for n in names for s in _minmax(tensors[n])]).tolist()  # the one sync
    mm = {n: (stats[2 * i], stats[2 * i + 1]) for i, n in enumerate(names)}
    for n, (lo, hi) in mm.items():
        if math.isnan(lo) or math.isnan(hi):
            raise ValueError(f"{n} contains NaN (expected finite values)")
        if n in no_inf and (math.isinf(lo) or math.isinf(hi)):
            raise ValueError(f"{n} must be finite, got a value of {lo if math.isinf(lo) else hi}")
        if n in plus_inf_ok and lo == -math.inf:
            raise ValueError(f"{n} must not be -inf (it is a minimum of a finite field, or +inf), got -inf")
        if n in nonneg and lo < 0:
            raise ValueError(f"{n} must be >= 0 everywhere, got a minimum of {lo}")
        if n in nonpos and hi > 0:
            raise ValueError(f"{n} must be <= 0 everywhere, got a maximum of {hi}")
    big = torch.finfo(dt).max
    if "q" in mm and "k" in mm:
        D = tensors["q"].shape[-1]
        aq = max(abs(x) for x in mm["q"])
        ak = max(abs(x) for x in mm["k"])
        if abs(scale) * D * aq * ak >= big / 2:
            raise ValueError(
                f"q and k are too large for {dt}: |scale| * D * max|q| * max|k| = "
                f"{abs(scale) * D * aq * ak:.3g} may overflow the logits (limit {big / 2:.3g}); rescale them"
                + ("" if dt == torch.float64 else " or pass float64 inputs")
            )
    if "v" in mm:
        av = max(abs(x) for x in mm["v"])
        Tk = tensors["v"].shape[-2]
        if Tk * av >= big:
            raise ValueError(f"v is too large for {dt}: Tk * max|v| = {Tk * av:.3g} may overflow (limit {big:.3g})")
    return mm


def check_scale(scale: float | None, D: int) -> float:
    """The softmax scale to use: ``scale`` itself, or D ** -0.5 when it is None (1.0 for D = 0).

    Args:
        scale: A finite number, or None for the default.
        D: The head dimension of q and k.

    Returns:
        The scale as a float.

    Raises:
        TypeError: ``scale`` is neither a number nor None (a bool included).
        ValueError: ``scale`` is infinite or NaN.
    """
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
