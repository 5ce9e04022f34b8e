"""Public entry points: validate once, then run the chosen backend.

Backends for FPA: "reference" (dense, the oracle), "chunked" (CPU and GPU fallback),
"flex" (FlexAttention score_mod), "triton" (tiled kernel, CUDA; CPU only under
TRITON_INTERPRET=1, for tests), and "auto".
"""

from __future__ import annotations

import importlib
import logging

import torch
from torch import Tensor

from fpa.checks import check_number, positive_int
from fpa.ops import checks, gpu_verified
from fpa.ops.field import past_min_from_field
from fpa.ops.fox.chunked import DEFAULT_CHUNK as FOX_CHUNK
from fpa.ops.fox.chunked import fox_chunked
from fpa.ops.fox.reference import fox_reference
from fpa.ops.fpa.chunked import DEFAULT_CHUNK as FPA_CHUNK
from fpa.ops.fpa.chunked import fpa_chunked
from fpa.ops.fpa.reference import fpa_reference

_log = logging.getLogger(__name__)

FPA_BACKENDS = ("auto", "reference", "chunked", "flex", "triton")
FOX_BACKENDS = ("auto", "reference", "chunked")


def _triton_module():
    try:
        return importlib.import_module("fpa.ops.fpa.triton")
    except ImportError as e:  # triton not installed
        return e


def backend_unavailable_reason(
    backend: str, q: Tensor, needs_grad: bool, Dv: int | None = None, acc: torch.dtype | None = None
) -> str | None:
    """Why `backend` cannot run these inputs, or None if it can (Dv: v's head dim, default q's;
    acc: the math dtype, default q's)."""
    if backend in ("reference", "chunked"):
        return None
    if backend == "flex":
        from fpa.ops.fpa import flex

        return flex.unavailable_reason(q, needs_grad)
    if backend == "triton":
        mod = _triton_module()
        if isinstance(mod, ImportError):
            return f"the triton backend could not be imported ({mod})"
        return mod.unavailable_reason(q, needs_grad, Dv, acc)
    raise ValueError(f"backend must be one of {FPA_BACKENDS}, got {backend!r}")


def _pick_auto(q: Tensor, needs_grad: bool, Dv: int | None, acc: torch.dtype | None, explain: bool) -> tuple[str, str]:
    """-> (backend, why in one line if ``explain`` else ""; the reason reads the record, so only on demand)."""
    if q.device.type != "cuda":
        return "chunked", f"auto -> chunked: q is on {q.device.type}; auto runs triton or flex only on CUDA"
    skipped: list[str] = []
    for name in gpu_verified.allowed_backends(str(q.device)):  # only backends verified on this GPU
        reason = backend_unavailable_reason(name, q, needs_grad, Dv, acc)
        if reason is None:
            if not explain:
                return name, ""
            detail = ""
            if name == "triton":
                cfg = _triton_module()._cuda_config(q, q.shape[-1] if Dv is None else Dv, acc or checks.math_dtype(q))
                detail = f"; {cfg.describe()} (compiled clean ahead of time)"
            why = gpu_verified.explain(str(q.device))
            return name, f"auto -> {name}: {why}{detail}" + "".join(f"; {s}" for s in skipped)
        skipped.append(f"{name} cannot run these inputs: {reason}")
    if not explain:
        return "chunked", ""
    return "chunked", f"auto -> chunked: {gpu_verified.explain(str(q.device))}" + "".join(f"; {s}" for s in skipped)


def explain_backend(
    q: Tensor, v: Tensor | None = None, *, needs_grad: bool = False, math_dtype: torch.dtype | None = None
) -> str:
    """One line saying which backend ``backend="auto"`` runs for these inputs, and why.

    Args:
        q: (B, Hq, Tq, D), the queries (device, dtype and head dim decide).
        v: optional (B, Hkv, Tk, Dv); its head dim matters to the triton kernels (default Dv = D).
        needs_grad: whether a backward will be needed (flex has none on CPU).
        math_dtype: the dtype of the field math, default q's (float32, or float64 for float64 q).

    Returns:
        E.g. "auto -> triton: benchmarks/gpu_check.py passed triton, flex on NVIDIA H100 80GB HBM3
        (record ...); block 64, num_warps fwd 8 / dq 4 / dkdv 8 (compiled clean ahead of time)".
    """
    return _pick_auto(q, needs_grad, None if v is None else v.shape[-1], math_dtype, explain=True)[1]


def _check_chunk(chunk_size: int | None, default: int) -> int:
    if chunk_size is None:
        return default
    return positive_int("chunk_size", chunk_size, "or None")


def _check_skip_tolerance(tol: float | None) -> None:
    if tol is None:
        return
    check_number("skip_tolerance", tol, low=0, high=1, low_open=True, high_open=True, what="or None")


def _empty_output(q: Tensor, v: Tensor, inputs: tuple[Tensor, ...]) -> Tensor:
    """Zeros (B, Hq, Tq, Dv) for a call with nothing to compute (B, Hq, Tq or Dv is 0).

    Connected to every input that requires grad, so backward gives each of them a zero
    gradient of its own shape (instead of "One of the differentiated Tensors appears to not
    have been used in the graph").
    """
    B, Hq, Tq, _ = q.shape
    out = q.new_zeros(B, Hq, Tq, v.shape[-1])
    for x in inputs:
        if x.requires_grad:
            out = out + (x * 0).sum().to(out.dtype)
    return out


def _nonempty_head_dim(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """D = 0: every score is 0; a zero column gives the same scores, and backends need D >= 1."""
    if q.shape[-1] > 0:
        return q, k
    return torch.nn.functional.pad(q, (0, 1)), torch.nn.functional.pad(k, (0, 1))


def _check_dip_range(mm: dict[str, tuple[float, float]], dt: torch.dtype) -> None:
    """max(level) - min(field, past_min) must be finite in dt (else 0 * inf = NaN at beta = 0)."""
    if "level" not in mm:
        return
    lows = [mm[n][0] for n in ("field", "past_min") if n in mm and mm[n][0] != float("inf")]
    if not lows:
        return
    span = mm["level"][1] - min(lows)
    if span >= torch.finfo(dt).max:
        raise ValueError(
            f"field and level are too far apart for {dt}: max(level) - min(field) = {span:.3g} overflows "
            f"(limit {torch.finfo(dt).max:.3g}); rescale them"
            + ("" if dt == torch.float64 else " or pass float64 inputs")
        )


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
    check_inputs: bool = True,
) -> Tensor:
    """First Passage Attention, causal: o_i = sum_j softmax_j(scale <q_i, k_j> - beta * dip(i, j)) v_j.

    dip(i, j) = max(0, level[j] - min_{j < t <= i} field[t]), and dip(i, i) = 0.

    Args:
        q: (B, Hq, Tq, D), the queries at the LAST Tq of the Tk positions (Tq <= Tk), so one call
            serves a whole sequence, a chunk of a prefill, or a decoding step.
        k: (B, Hkv, Tk, D), Hq % Hkv == 0 (grouped-query attention).
        v: (B, Hkv, Tk, Dv).
        field: (B, Hq, Tk), one scalar per position. With past_min, (B, Hq, Tq): the field at the
            query positions only.
        level: (B, Hq, Tk), one scalar per key.
        beta: penalty strength >= 0, a float or a tensor broadcastable to (Hq,); differentiable.
            A Python float is used in the math dtype (float64 for float64 inputs, not rounded).
        scale: logit scale, default 1 / sqrt(D).
        backend: "auto", "reference", "chunked", "flex" or "triton". "auto" picks triton, then
            flex on CUDA where verified on that GPU (fpa.ops.gpu_verified: benchmarks/gpu_check.py's
            record or FPA_GPU_BACKENDS) and able to run the inputs (triton: a launch configuration
            compiled clean for this GPU, dtype and head dim, fpa.ops.fpa.triton_configs), else
            chunked; chunked on CPU. ``explain_backend`` (and a DEBUG log line of logger
            ``fpa.ops.dispatch``) says why. An explicit backend that cannot run raises a
            ValueError saying why.
        past_min: optional (B, Hq, Tk - Tq), the cache form: for each of the first Tk - Tq keys,
            the field's minimum after that key up to just before the first query (+inf where
            that range is empty). The keys need not be contiguous positions (an evicting cache).
        chunk_size: query chunk of the chunked backend (memory O(B*H*chunk*Tk)); default 64.
        skip_tolerance: None (default, exact) or eps in (0, 1): the triton backend then skips key
            tiles whose penalties are certainly so large that, per query row, the skipped keys
            together carry less than eps of the softmax weight (each output entry off by at most
            2 * eps * max|v|; see fpa.ops.fpa.triton). The other backends are exact, which is
            within any tolerance, and ignore it.
        check_inputs: True (default): also check the VALUES (one reduction per tensor and one
            host sync in all): q, k, v, field, level finite; past_min not NaN or -inf; a tensor
            beta finite and >= 0; and the magnitudes bounded so that nothing overflows the math
            dtype (logits: |scale| * D * max|q| * max|k| < max/2; max(level) - min(field) < max;
            Tk * max|v| < max). False skips every check that costs a reduction or a host sync
            (for torch.compile and inner loops whose inputs are known good); shapes, dtypes,
            devices and Python arguments are still checked (free). Bad values then give NaN.

    Returns:
        (B, Hq, Tq, Dv) in q's dtype. Field minima and softmax are computed in float32
        (float64 for float64 inputs). When B, Hq, Tq or Dv is 0 the result is an empty tensor
        of that shape, and backward gives every input requiring grad a zero gradient.

    Raises:
        TypeError: Wrong types or dtypes.
        ValueError: Wrong shapes, devices or values. Each message names the argument, what was
            expected and what came; every check runs before any work.

    Gradient conventions (every backend): at dip exactly 0 (level[j] equal to the field's
    minimum over (j, i]) the penalty max(0, .) has gradient 0, like torch.relu: such a key sends
    no gradient to field, level or beta through that entry. (So on fox_as_fpa's field, where a
    forget gate of exactly 1 makes the dip exactly 0, the log-gate gradient differs from FoX's.)
    Where several positions t in (j, i] tie for the minimum, the field gradient of that entry goes
    to ONE of them (positions are absolute, 0..Tk-1; P = Tk - Tq):
      - "reference": the LATEST tied t (torch.cummin). In the cache form a tie between past_min[j]
        and the new field's running minimum splits the gradient equally (torch.minimum).
      - "chunked": for the query chunk starting at position c0 = P + r0: the latest tied t >= c0
        if the minimum is attained there, else the EARLIEST tied t (all < c0). (Keys inside the
        chunk thus always take the latest.) Where that t is before P, the cache form's gradient
        goes to past_min[j] instead.
      - "triton": its own tile-wise choice (fpa.ops.fpa.triton; tested per row under ties).
      - "flex": no backward on CPU; on CUDA through FlexAttention's captured-buffer gradients.
    Each is a valid subgradient; tests/ops/test_oracle.py checks reference and chunked per
    position against a loop oracle run with the same rule.
    """
    B, Hq, Hkv, Tq, Tk, D = checks.check_qkv(q, k, v)
    P = Tk - Tq
    checks.check_per_position("level", level, B, Hq, Tk, q)
    if past_min is None:
        checks.check_per_position("field", field, B, Hq, Tk, q)
    else:
        checks.check_per_position("field", field, B, Hq, Tq, q)
        checks.check_per_position("past_min", past_min, B, Hq, P, q)
    if not isinstance(check_inputs, bool):
        raise TypeError(f"check_inputs must be a bool, got {type(check_inputs).__name__}")
    dt = checks.math_dtype(q, field, level)
    betas = checks.beta_per_head(beta, Hq, q.device, dt)
    scale = checks.check_scale(scale, D)
    _check_skip_tolerance(skip_tolerance)
    if backend not in FPA_BACKENDS:
        raise ValueError(f"backend must be one of {FPA_BACKENDS}, got {backend!r}")
    chunk = _check_chunk(chunk_size, FPA_CHUNK)
    if check_inputs:
        named = {"q": q, "k": k, "v": v, "field": field, "level": level}
        if past_min is not None:
            named["past_min"] = past_min
        if isinstance(beta, Tensor):
            named["beta"] = betas
        mm = checks.check_values(
            dt,
            scale,
            named,
            no_inf=("q", "k", "v", "field", "level", "beta"),
            plus_inf_ok=("past_min",),
            nonneg=("beta",),
        )
        _check_dip_range(mm, dt)

    tensors = (q, k, v, field, level, betas) + (() if past_min is None else (past_min,))
    if B == 0 or Tq == 0 or v.shape[-1] == 0:
        return _empty_output(q, v, tensors if isinstance(beta, Tensor) else tensors[:5] + tensors[6:])
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    q, k = _nonempty_head_dim(q, k)
    if backend == "auto":
        # torch.compile cannot trace a logger: a compiled call explains nothing (explain_backend still can)
        debug = not torch.compiler.is_compiling() and _log.isEnabledFor(logging.DEBUG)
        backend, why = _pick_auto(q, needs_grad, v.shape[-1], dt, explain=debug)
        if debug:
            _log.debug(why)
    else:
        reason = backend_unavailable_reason(backend, q, needs_grad, v.shape[-1], dt)
        if reason is not None:
            raise ValueError(f"backend={backend!r} cannot run here: {reason}")

    if backend == "reference":
        return fpa_reference(q, k, v, field, level, betas, scale, past_min)
    if past_min is None:
        past_min = past_min_from_field(field[..., :P])
        field = field[..., P:]
    if backend == "chunked":
        return fpa_chunked(q, k, v, field, level, past_min, betas, scale, chunk)
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
    check_inputs: bool = True,
) -> Tensor:
    """FoX: o_i = sum_j softmax_j(scale <q_i, k_j> + sum_{j<u<=i} log f_u) v_j, causal.

    q (B, Hq, Tq, D) at the last Tq positions; k, v (B, Hkv, Tk, *); log_fgate (B, Hq, Tk) <= 0.
    backend: "auto" (= "chunked"), "reference" or "chunked". Returns (B, Hq, Tq, Dv); empty
    (with zero gradients) when B, Hq, Tq or Dv is 0.
    check_inputs: True (default) checks the values (one reduction per tensor, one host sync):
    q, k, v, log_fgate finite, log_fgate <= 0, and magnitudes that cannot overflow the math
    dtype (see first_passage_attention; also Tk * max|log_fgate| < max). False skips them.
    By P2 this equals first_passage_attention on fox_as_fpa(log_fgate) with beta = 1 (values;
    the log-gate gradient differs where log f == 0 exactly, see first_passage_attention).
    """
    B, Hq, Hkv, Tq, Tk, D = checks.check_qkv(q, k, v)
    checks.check_per_position("log_fgate", log_fgate, B, Hq, Tk, q)
    if not isinstance(check_inputs, bool):
        raise TypeError(f"check_inputs must be a bool, got {type(check_inputs).__name__}")
    scale = checks.check_scale(scale, D)
    if backend not in FOX_BACKENDS:
        raise ValueError(f"backend must be one of {FOX_BACKENDS}, got {backend!r}")
    chunk = _check_chunk(chunk_size, FOX_CHUNK)
    dt = checks.math_dtype(q, log_fgate)
    if check_inputs:
        mm = checks.check_values(
            dt,
            scale,
            {"q": q, "k": k, "v": v, "log_fgate": log_fgate},
            no_inf=("q", "k", "v", "log_fgate"),
            nonpos=("log_fgate",),
        )
        if "log_fgate" in mm and Tk * -mm["log_fgate"][0] >= torch.finfo(dt).max / 2:
            raise ValueError(
                f"log_fgate is too negative for {dt}: its cumulative sum may overflow "
                f"(Tk * min(log_fgate) = {Tk * mm['log_fgate'][0]:.3g}, limit {-torch.finfo(dt).max / 2:.3g}); clamp it"
            )
    if B == 0 or Tq == 0 or v.shape[-1] == 0:
        return _empty_output(q, v, (q, k, v, log_fgate))
    q, k = _nonempty_head_dim(q, k)
    if backend == "reference":
        return fox_reference(q, k, v, log_fgate, scale)
    return fox_chunked(q, k, v, log_fgate, scale, chunk)
