"""Public entry points: validate once, then run the chosen backend.

Backends for FPA: "reference" (dense, the oracle), "chunked" (CPU and GPU fallback),
"flex" (FlexAttention score_mod), "triton" (tiled kernel, CUDA; CPU only under
TRITON_INTERPRET=1, for tests), and "auto".
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from fpa.ops import checks
from fpa.ops.field import past_min_from_field
from fpa.ops.fox.chunked import DEFAULT_CHUNK as FOX_CHUNK
from fpa.ops.fox.chunked import fox_chunked
from fpa.ops.fox.reference import fox_reference
from fpa.ops.fpa.chunked import DEFAULT_CHUNK as FPA_CHUNK
from fpa.ops.fpa.chunked import fpa_chunked
from fpa.ops.fpa.reference import fpa_reference

FPA_BACKENDS = ("auto", "reference", "chunked", "flex", "triton")
FOX_BACKENDS = ("auto", "reference", "chunked")


def _triton_module():
    try:
        return importlib.import_module("fpa.ops.fpa.triton")
    except ImportError as e:  # triton not installed
        return e


def backend_unavailable_reason(backend: str, q: Tensor, needs_grad: bool) -> str | None:
    """Why `backend` cannot run these inputs, or None if it can."""
    if backend in ("reference", "chunked"):
        return None
    if backend == "flex":
        from fpa.ops.fpa import flex

        return flex.unavailable_reason(q, needs_grad)
    if backend == "triton":
        mod = _triton_module()
        if isinstance(mod, ImportError):
            return f"the triton backend could not be imported ({mod})"
        return mod.unavailable_reason(q, needs_grad)
    raise ValueError(f"backend must be one of {FPA_BACKENDS}, got {backend!r}")


def _pick_auto(q: Tensor, needs_grad: bool) -> str:
    if q.device.type == "cuda":
        for name in ("triton", "flex"):
            if backend_unavailable_reason(name, q, needs_grad) is None:
                return name
    return "chunked"


def _check_chunk(chunk_size: int | None, default: int) -> int:
    if chunk_size is None:
        return default
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    return chunk_size


def _check_skip_tolerance(tol: float | None) -> None:
    if tol is None:
        return
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
        raise ValueError(f"skip_tolerance must be None or a float in (0, 1), got {tol!r}")


def _empty_output(q: Tensor, v: Tensor) -> Tensor:
    B, Hq, Tq, _ = q.shape
    out = q.new_zeros(B, Hq, Tq, v.shape[-1])
    if q.requires_grad or v.requires_grad:
        out = out + 0.0 * (q.sum() + v.sum())
    return out


def first_passage_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    *,
    beta: float | Tensor = 1.0,
    scale: float | None = None,
    backend: str = "auto",
    past_min: Tensor | None = None,
    chunk_size: int | None = None,
    skip_tolerance: float | None = None,
) -> Tensor:
    """First Passage Attention, causal: o_i = sum_j softmax_j(scale <q_i, k_j> - beta * dip(i, j)) v_j.

    dip(i, j) = max(0, level[j] - min_{j < t <= i} field[t]), and dip(i, i) = 0.

    Args:
        q: (B, Hq, Tq, D), the queries at the LAST Tq of the Tk positions (Tq <= Tk), so one call
            serves a whole sequence, a chunk of a prefill, or a decoding step.
        k, v: (B, Hkv, Tk, D) and (B, Hkv, Tk, Dv), Hq % Hkv == 0 (grouped-query attention).
        field: (B, Hq, Tk), one scalar per position. With past_min, (B, Hq, Tq): the field at the
            query positions only.
        level: (B, Hq, Tk), one scalar per key.
        beta: penalty strength >= 0, a float or a tensor broadcastable to (Hq,); differentiable.
        scale: logit scale, default 1 / sqrt(D).
        backend: "auto", "reference", "chunked", "flex" or "triton". "auto" picks triton, then
            flex on CUDA, and chunked on CPU. An explicit backend that cannot run raises a
            ValueError saying why.
        past_min: optional (B, Hq, Tk - Tq), the cache form: for each of the first Tk - Tq keys,
            the field's minimum after that key up to just before the first query (+inf where
            that range is empty). The keys need not be contiguous positions (an evicting cache).
        chunk_size: query chunk of the chunked backend (memory O(B*H*chunk*Tk)); default 256.
        skip_tolerance: None (default, exact) or eps in (0, 1): the triton backend then skips key
            tiles whose penalties are certainly so large that, per query row, the skipped keys
            together carry less than eps of the softmax weight (each output entry off by at most
            2 * eps * max|v|; see fpa.ops.fpa.triton). The other backends are exact, which is
            within any tolerance, and ignore it.

    Returns:
        (B, Hq, Tq, Dv) in q's dtype. Field minima and softmax are computed in float32
        (float64 for float64 inputs).
    """
    B, Hq, Hkv, Tq, Tk, D = checks.check_qkv(q, k, v)
    P = Tk - Tq
    checks.check_per_position("level", level, B, Hq, Tk, q)
    if past_min is None:
        checks.check_per_position("field", field, B, Hq, Tk, q)
    else:
        checks.check_per_position("field", field, B, Hq, Tq, q)
        checks.check_per_position("past_min", past_min, B, Hq, P, q)
        if (past_min == float("-inf")).any():
            raise ValueError("past_min must not be -inf (it is a minimum of a finite field, or +inf)")
    for name, x in (("field", field), ("level", level)):
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} must be finite (no inf)")
    betas = checks.beta_per_head(beta, Hq, q.device)
    scale = checks.check_scale(scale, D)
    _check_skip_tolerance(skip_tolerance)
    if backend not in FPA_BACKENDS:
        raise ValueError(f"backend must be one of {FPA_BACKENDS}, got {backend!r}")
    if Tq == 0:
        return _empty_output(q, v)

    tensors = (q, k, v, field, level, betas) + (() if past_min is None else (past_min,))
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if backend == "auto":
        backend = _pick_auto(q, needs_grad)
    else:
        reason = backend_unavailable_reason(backend, q, needs_grad)
        if reason is not None:
            raise ValueError(f"backend={backend!r} cannot run here: {reason}")

    if backend == "reference":
        return fpa_reference(q, k, v, field, level, betas, scale, past_min)
    if past_min is None:
        past_min = past_min_from_field(field[..., :P])
        field = field[..., P:]
    if backend == "chunked":
        return fpa_chunked(q, k, v, field, level, past_min, betas, scale, _check_chunk(chunk_size, FPA_CHUNK))
    if backend == "flex":
        from fpa.ops.fpa.flex import fpa_flex

        return fpa_flex(q, k, v, field, level, past_min, betas, scale)
    return _triton_module().fpa_triton(q, k, v, field, level, past_min, betas, scale, skip_tolerance)


def forgetting_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_fgate: Tensor,
    *,
    scale: float | None = None,
    backend: str = "auto",
    chunk_size: int | None = None,
) -> Tensor:
    """FoX: o_i = sum_j softmax_j(scale <q_i, k_j> + sum_{j<u<=i} log f_u) v_j, causal.

    q (B, Hq, Tq, D) at the last Tq positions; k, v (B, Hkv, Tk, *); log_fgate (B, Hq, Tk) <= 0.
    backend: "auto" (= "chunked"), "reference" or "chunked". Returns (B, Hq, Tq, Dv).
    By P2 this equals first_passage_attention on fox_as_fpa(log_fgate) with beta = 1.
    """
    B, Hq, Hkv, Tq, Tk, D = checks.check_qkv(q, k, v)
    checks.check_per_position("log_fgate", log_fgate, B, Hq, Tk, q)
    if not torch.isfinite(log_fgate).all():
        raise ValueError("log_fgate must be finite (a forget gate of exactly 0 is not allowed)")
    if (log_fgate > 0).any():
        raise ValueError("log_fgate must be <= 0 (the log of a forget gate in (0, 1])")
    scale = checks.check_scale(scale, D)
    if backend not in FOX_BACKENDS:
        raise ValueError(f"backend must be one of {FOX_BACKENDS}, got {backend!r}")
    if Tq == 0:
        return _empty_output(q, v)
    if backend == "reference":
        return fox_reference(q, k, v, log_fgate, scale)
    return fox_chunked(q, k, v, log_fgate, scale, _check_chunk(chunk_size, FOX_CHUNK))
