"""Typed calls into the CPU kernels: every array is checked (CPU, dtype, contiguous, large enough)
before its data pointer goes to C++, and a bad one raises ValueError or TypeError naming it.

Layouts: BH = B * Hq row blocks (batch-major, then query head), P = Tk - Tq earlier keys; the query
chunk [r0, r1) sees the keys [0, P + r1), K = P + r1 of them.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor


def _arr(name: str, x: Tensor | None, dtype: torch.dtype, numel: int, required: bool = True) -> int | None:
    """The data pointer of ``x`` after checking it; None for an absent optional array."""
    if x is None:
        if required:
            raise ValueError(f"{name} is required here")
        return None
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {x.device}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got shape {tuple(x.shape)} with strides {x.stride()}")
    if x.numel() < numel:
        raise ValueError(f"{name} has {x.numel()} elements, the kernel needs {numel} (shape {tuple(x.shape)})")
    return x.data_ptr()


def _dtype(name: str, x: Tensor) -> tuple[torch.dtype, str]:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype == torch.float32:
        return x.dtype, "f32"
    if x.dtype == torch.float64:
        return x.dtype, "f64"
    raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")


def _chunk(r0: int, r1: int, Tq: int) -> None:
    if not 0 <= r0 < r1 <= Tq:
        raise ValueError(f"the query chunk [r0, r1) = [{r0}, {r1}) must lie in [0, Tq = {Tq})")


def fpa_rows(
    S: Tensor,
    dP: Tensor | None,
    lse: Tensor,
    delta: Tensor | None,
    field: Tensor,
    past_min: Tensor,
    level: Tensor,
    beta: Tensor,
    Hq: int,
    r0: int,
    r1: int,
    scale: float,
    grads: tuple[Tensor, Tensor, Tensor] | None = None,
    hide: Tensor | None = None,
    *,
    lib: ctypes.CDLL,
) -> None:
    """One FPA query chunk [r0, r1), in place: forward when dP is None, else backward.

    Forward: S -> softmax probabilities P, lse rows r0:r1 written. Backward: S -> P and dP -> dS,
    accumulating the bias gradients into ``grads`` when given.

    Args:
        S: (BH, c, K) raw q.k of the chunk (c = r1 - r0), float32 or float64; every other array
            in its dtype except dbeta.
        dP: (BH, c, K) raw dO.v, or None for the forward.
        lse: (BH, Tq) log-sum-exp.
        delta: (BH, Tq) rowsum(dO * O); required with dP.
        field: (BH, Tq) the field at the query positions.
        past_min: (BH, P) the field's minimum after each earlier key.
        level: (BH, Tk) the keys' levels.
        beta: (Hq,) penalty strength per query head.
        Hq: Query heads; divides BH.
        r0: First query of the chunk.
        r1: One past its last query.
        scale: Softmax scale.
        grads: (dvirtual (BH, Tq + P), dlevel (BH, Tk), dbeta (BH,) float64), accumulated by the
            backward.
        hide: (BH, Tk) int64 or None: key j is hidden (score -inf, no gradient) from every query
            at position >= hide[j] (positions count the P earlier keys).
        lib: The loaded kernels (``loader.require()``).

    Raises:
        TypeError: An array is not a tensor or has the wrong dtype.
        ValueError: An array is missing, not on the CPU, not contiguous or too small; the chunk is
            outside [0, Tq); Hq does not divide BH.
    """
    dt, sfx = _dtype("S", S)
    if field.dim() != 2 or past_min.dim() != 2:
        raise ValueError(
            f"field and past_min must be (BH, Tq) and (BH, P), got {tuple(field.shape)}, {tuple(past_min.shape)}"
        )
    BH, Tq, P = field.shape[0], field.shape[1], past_min.shape[1]
    _chunk(r0, r1, Tq)
    n, bwd = BH * (r1 - r0) * (P + r1), dP is not None
    ptrs = [
        _arr("S", S, dt, n),
        _arr("dP", dP, dt, n, required=False),
        _arr("lse", lse, dt, BH * Tq),
        _arr("delta", delta, dt, BH * Tq, required=bwd),
        _arr("field", field, dt, BH * Tq),
        _arr("past_min", past_min, dt, BH * P),
        _arr("level", level, dt, BH * (P + Tq)),
        _arr("beta", beta, dt, Hq),
    ]
    if Hq <= 0 or BH % Hq:
        raise ValueError(f"Hq = {Hq} must divide the number of row blocks BH = {BH}")
    dv, dl, db = grads if grads is not None else (None, None, None)
    want = grads is not None and bwd
    gp = [
        _arr("dvirtual", dv, dt, BH * (Tq + P), want),
        _arr("dlevel", dl, dt, BH * (P + Tq), want),
        _arr("dbeta", db, torch.float64, BH, want),
    ]
    fn = getattr(lib, f"fpa_{'bwd' if bwd else 'fwd'}_{sfx}")
    hp = _arr("hide", hide, torch.int64, BH * (P + Tq), required=False)
    fn(*ptrs, BH, Hq, Tq, P, r0, r1, float(scale), int(want), *gp, hp)


def fox_rows(
    S: Tensor,
    dP: Tensor | None,
    lse: Tensor,
    delta: Tensor | None,
    cum: Tensor,
    Tq: int,
    r0: int,
    r1: int,
    scale: float,
    dcum: Tensor | None = None,
    *,
    lib: ctypes.CDLL,
) -> None:
    """One FoX query chunk, like :func:`fpa_rows` with the bias cum_i - cum_j.

    Args:
        S: (BH, c, K) raw q.k of the chunk.
        dP: (BH, c, K) raw dO.v, or None for the forward.
        lse: (BH, Tq) log-sum-exp.
        delta: (BH, Tq) rowsum(dO * O); required with dP.
        cum: (BH, Tk) cumulative log forget gate.
        Tq: Query positions (the last Tq of Tk).
        r0: First query of the chunk.
        r1: One past its last query.
        scale: Softmax scale.
        dcum: (BH, Tk), accumulated by the backward when given.
        lib: The loaded kernels (``loader.require()``).

    Raises:
        TypeError: An array is not a tensor or has the wrong dtype.
        ValueError: An array is missing, misplaced, not contiguous or too small; cum is not (BH, Tk)
            with Tk >= Tq; the chunk is outside [0, Tq).
    """
    dt, sfx = _dtype("S", S)
    if cum.dim() != 2 or cum.shape[1] < Tq:
        raise ValueError(f"cum must be (BH, Tk) with Tk >= Tq = {Tq}, got {tuple(cum.shape)}")
    BH, Tk = cum.shape
    _chunk(r0, r1, Tq)
    n, bwd = BH * (r1 - r0) * (Tk - Tq + r1), dP is not None
    want = dcum is not None and bwd
    fn = getattr(lib, f"fox_{'bwd' if bwd else 'fwd'}_{sfx}")
    fn(
        _arr("S", S, dt, n),
        _arr("dP", dP, dt, n, required=False),
        _arr("lse", lse, dt, BH * Tq),
        _arr("delta", delta, dt, BH * Tq, required=bwd),
        _arr("cum", cum, dt, BH * Tk),
        BH,
        Tq,
        Tk - Tq,
        r0,
        r1,
        float(scale),
        int(want),
        _arr("dcum", dcum, dt, BH * Tk, want),
    )


def _whole_common(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor | None,
    dout: Tensor | None,
    lse: Tensor,
    delta: Tensor | None,
    dq: Tensor | None,
    dk: Tensor | None,
    dv: Tensor | None,
    P: int,
    chunk: int,
    scale: float,
) -> tuple[list, str]:
    """Shared arguments: q (B, Hkv, G, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), out/dout
    (B, Hkv, G, Tq, Dv), lse/delta (B*Hq, Tq), dq/dk/dv like q/k/v; all contiguous."""
    dt, sfx = _dtype("q", q)
    if q.dim() != 5 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be (B, Hkv, G, Tq, D), (B, Hkv, Tk, D), (B, Hkv, Tk, Dv), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, Hkv, G, Tq, D = q.shape
    Dv, BKV, Tk = v.shape[-1], B * Hkv, P + Tq
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    bwd = dout is not None
    ptrs = [
        _arr("q", q, dt, BKV * G * Tq * D),
        _arr("k", k, dt, BKV * Tk * D),
        _arr("v", v, dt, BKV * Tk * Dv),
        _arr("out", out, dt, BKV * G * Tq * Dv, required=not bwd),
        _arr("dout", dout, dt, BKV * G * Tq * Dv, required=False),
        _arr("lse", lse, dt, BKV * G * Tq),
        _arr("delta", delta, dt, BKV * G * Tq, required=bwd),
        _arr("dq", dq, dt, BKV * G * Tq * D, bwd),
        _arr("dk", dk, dt, BKV * Tk * D, bwd),
        _arr("dv", dv, dt, BKV * Tk * Dv, bwd),
    ]
    return [*ptrs, BKV, G, Tq, D, Dv, chunk, float(scale)], sfx


def fpa_whole(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor | None,
    dout: Tensor | None,
    lse: Tensor,
    delta: Tensor | None,
    dq: Tensor | None,
    dk: Tensor | None,
    dv: Tensor | None,
    field: Tensor,
    past_min: Tensor,
    level: Tensor,
    beta: Tensor,
    chunk: int,
    scale: float,
    grads: tuple[Tensor, Tensor, Tensor] | None = None,
    hide: Tensor | None = None,
    *,
    lib: ctypes.CDLL,
) -> None:
    """The whole FPA op in C++: forward when dout is None (out and lse written), else backward.

    Args:
        q: (B, Hkv, G, Tq, D) queries grouped by kv head, float32 or float64.
        k: (B, Hkv, Tk, D).
        v: (B, Hkv, Tk, Dv).
        out: (B, Hkv, G, Tq, Dv), written by the forward.
        dout: (B, Hkv, G, Tq, Dv), or None for the forward.
        lse: (B * Hq, Tq) log-sum-exp, written by the forward.
        delta: (B * Hq, Tq) rowsum(dO * O); required by the backward.
        dq: Like q; written by the backward.
        dk: Like k; written by the backward.
        dv: Like v; written by the backward.
        field: (B * Hq, Tq), as in :func:`fpa_rows`.
        past_min: (B * Hq, P).
        level: (B * Hq, Tk).
        beta: (Hq,).
        chunk: Query chunk length.
        scale: Softmax scale.
        grads: (dvirtual, dlevel, dbeta) as in :func:`fpa_rows`, accumulated by the backward.
        hide: (B * Hq, Tk) int64 or None, as in :func:`fpa_rows`.
        lib: The loaded kernels (``loader.require()``).

    Raises:
        TypeError: An array is not a tensor or has the wrong dtype.
        ValueError: A bad shape or array, chunk <= 0, or beta's heads do not divide B * Hq.
    """
    P = past_min.shape[-1]
    common, sfx = _whole_common(q, k, v, out, dout, lse, delta, dq, dk, dv, P, chunk, scale)
    dt, BH, Tq, Hq = q.dtype, q.shape[0] * q.shape[1] * q.shape[2], q.shape[3], beta.numel()
    if Hq <= 0 or BH % Hq:
        raise ValueError(f"beta's {Hq} heads must divide the number of row blocks BH = {BH}")
    want = grads is not None and dout is not None
    dv_, dl, db = grads if grads is not None else (None, None, None)
    fn = getattr(lib, f"fpa_whole_{'fwd' if dout is None else 'bwd'}_{sfx}")
    fn(
        *common,
        _arr("field", field, dt, BH * Tq),
        _arr("past_min", past_min, dt, BH * P),
        _arr("level", level, dt, BH * (P + Tq)),
        _arr("beta", beta, dt, Hq),
        Hq,
        P,
        int(want),
        _arr("dvirtual", dv_, dt, BH * (Tq + P), want),
        _arr("dlevel", dl, dt, BH * (P + Tq), want),
        _arr("dbeta", db, torch.float64, BH, want),
        _arr("hide", hide, torch.int64, BH * (P + Tq), required=False),
    )


def fox_whole(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor | None,
    dout: Tensor | None,
    lse: Tensor,
    delta: Tensor | None,
    dq: Tensor | None,
    dk: Tensor | None,
    dv: Tensor | None,
    cum: Tensor,
    chunk: int,
    scale: float,
    dcum: Tensor | None = None,
    *,
    lib: ctypes.CDLL,
) -> None:
    """The whole FoX op in C++, with the arrays of :func:`fpa_whole` up to ``dv``.

    Args:
        q: (B, Hkv, G, Tq, D).
        k: (B, Hkv, Tk, D).
        v: (B, Hkv, Tk, Dv).
        out: (B, Hkv, G, Tq, Dv), written by the forward.
        dout: (B, Hkv, G, Tq, Dv), or None for the forward.
        lse: (B * Hq, Tq).
        delta: (B * Hq, Tq); required by the backward.
        dq: Like q; written by the backward.
        dk: Like k; written by the backward.
        dv: Like v; written by the backward.
        cum: (B * Hq, Tk) cumulative log forget gate.
        chunk: Query chunk length.
        scale: Softmax scale.
        dcum: Like cum, accumulated by the backward when given.
        lib: The loaded kernels (``loader.require()``).

    Raises:
        TypeError: An array is not a tensor or has the wrong dtype.
        ValueError: A bad shape or array, cum shorter than Tq, or chunk <= 0.
    """
    Tq = q.shape[3]
    P = cum.shape[-1] - Tq
    if cum.dim() != 2 or P < 0:
        raise ValueError(f"cum must be (B*Hq, Tk) with Tk >= Tq = {Tq}, got {tuple(cum.shape)}")
    common, sfx = _whole_common(q, k, v, out, dout, lse, delta, dq, dk, dv, P, chunk, scale)
    BH, want = q.shape[0] * q.shape[1] * q.shape[2], dcum is not None and dout is not None
    fn = getattr(lib, f"fox_whole_{'fwd' if dout is None else 'bwd'}_{sfx}")
    fn(
        *common,
        _arr("cum", cum, q.dtype, BH * (P + Tq)),
        P,
        int(want),
        _arr("dcum", dcum, q.dtype, BH * (P + Tq), want),
    )
