"""Tiled, FlashAttention-style First Passage Attention in Triton, forward and backward
(docs/fpa.md, "Computing it fast").

Per (query tile I, key tile J) the range minimum costs O(1) per score: the key tile's in-tile
suffix minimum (with past_min folded in), one running scalar for the tiles strictly between
(the kernels walk key tiles backwards from the diagonal, or query tiles forwards from it), and
the query tile's prefix minimum; the diagonal tile scans inside the tile. Online softmax, GQA,
Tq <= Tk (the cache form), float16/bfloat16 inputs with field math and softmax in float32
(float32 inputs: exact IEEE dots, no tf32; float64 inputs: float64 throughout).

Backward: each active penalty (dip > 0; relu at 0 gives no gradient, like torch.relu) sends
beta * dLoss/dlogit to its level and to the argmin of whichever term was the minimum: a field
position or a past_min entry. Ties (the field gradient is then a subgradient): between the terms
the later one wins (the query prefix over the tiles between over the key-tile suffix; within the
suffix, the field over past_min); inside a term, the diagonal scan and the query prefix pick the
latest tied position, the key-tile suffix and a tile's minimum the earliest. The chunked backend
splits ties differently; the gradient totals over tied positions agree (the tests check them).

Tile skipping (skip_tolerance=eps, off by default): a tile pair is not computed when every
penalty in it is at least beta * (min level in J - min(field strictly between J and I, field
at I's first query)) and that bound exceeds thr = 2 c + log(Tk / eps), with c the largest
possible content logit |scale| * max_{i in I} |q_i| * max_j |k_j|. The error allowed: per query
row, the skipped keys carry together less than eps of the exact softmax weight, so each
output entry is off by at most 2 * eps * max|v| (and the normalizer by a factor within
(1 - eps, 1]). The backward skips the same tile pairs, so its gradients are exactly those of
attention with the skipped (query, key) pairs removed. The bound uses norms, not the actual
logits: with QK-norm (small c) it is tight, with large unnormalized q and k it rarely skips.
Key tiles before the query block see the field between only through the query positions
(past_min is per key), so their bound is weaker there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from fpa.ops.checks import math_dtype
from fpa.ops.fpa import triton_configs as configs
from fpa.ops.fpa import triton_prep as prep

INTERPRETER_BLOCK = 16

Launcher = Callable[[str, tuple[int, int], tuple, dict, dict], None]


def _run_kernel(kernel: str, grid: tuple[int, int], args: tuple, consts: dict, options: dict) -> None:
    from fpa.ops.fpa import triton_kernels

    getattr(triton_kernels, kernel)[grid](*args, **consts, **options)


@dataclass(frozen=True)
class _Plan:
    """The tile, launch options and mode of one call: on CUDA an entry of triton_configs.CONFIGS."""

    block: int
    config: configs.LaunchConfig | None  # None: the interpreter (launch options unused)

    @property
    def interpreted(self) -> bool:
        return self.config is None

    def options(self, kernel: str) -> dict:
        return {} if self.config is None else self.config.options(kernel)


def kernel_constexprs(dtype: torch.dtype, acc: torch.dtype, D: int, Dv: int, plan: _Plan) -> dict:
    """The constexpr arguments of every kernel for inputs of ``dtype``, math dtype ``acc`` and head
    dims D, Dv. Interpreted: head dims padded to a power of two >= 16 and bfloat16 dots upcast
    (the interpreter multiplies bfloat16 wrongly); compiled: padded as triton_configs.padded_head_dim."""
    import triton.language as tl

    if plan.interpreted:
        bd, bdv = (max(16, 1 << max(n - 1, 0).bit_length()) for n in (D, Dv))
    else:
        bd = bdv = configs.padded_head_dim(D, Dv)
    return dict(
        BLOCK=plan.block,
        BD=bd,
        BDV=bdv,
        ACC=tl.float64 if acc == torch.float64 else tl.float32,
        PREC="ieee" if dtype == torch.float32 else None,
        UPCAST=plan.interpreted and dtype == torch.bfloat16,
    )


def _cuda_config(q: Tensor, Dv: int, acc: torch.dtype) -> configs.LaunchConfig | str:
    arch, name = configs.cuda_arch(q.device)
    return configs.lookup(arch, name, q.dtype, acc, q.shape[-1], Dv)


def _plan(q: Tensor, Dv: int, acc: torch.dtype, block: int | None) -> _Plan:
    """Interpreter: ``block`` (default INTERPRETER_BLOCK). CUDA: the compiled-clean configuration;
    ``block`` must then be None (the tile belongs to the configuration)."""
    if q.device.type != "cuda":
        block = INTERPRETER_BLOCK if block is None else block
        if block < 16 or block & (block - 1):
            raise ValueError(f"block must be a power of two >= 16, got {block}")
        return _Plan(block, None)
    if block is not None:
        raise ValueError(
            f"block must be None on CUDA (the tile comes with the compiled-clean configuration), got {block}"
        )
    cfg = _cuda_config(q, Dv, acc)
    if isinstance(cfg, str):
        raise ValueError(f"the triton backend cannot run these inputs: {cfg}")
    return _Plan(cfg.block, cfg)


def interpreter_active() -> bool:
    """True when Triton runs its CPU interpreter (``TRITON_INTERPRET`` set and not "0")."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def unavailable_reason(
    q: Tensor, needs_grad: bool, Dv: int | None = None, acc: torch.dtype | None = None
) -> str | None:
    """Why the triton backend cannot run q, or None. CPU tensors only under TRITON_INTERPRET=1; CUDA
    only where a compiled-clean configuration exists (triton_configs) for the GPU, q's dtype, the
    math dtype ``acc`` (default: q's) and the head dims (Dv default: q's D)."""
    try:
        import triton  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the install
        return f"triton is not installed ({e})"
    if q.device.type == "cuda":
        cfg = _cuda_config(q, q.shape[-1] if Dv is None else Dv, math_dtype(q) if acc is None else acc)
        return cfg if isinstance(cfg, str) else None
    if q.device.type == "cpu" and interpreter_active():
        return None
    return f"the triton kernel needs a CUDA tensor (q is on {q.device}); set TRITON_INTERPRET=1 to run it on CPU"


class _Launch:
    """Everything both passes need: flattened contiguous inputs, the tiling, prepared field rows."""

    def __init__(
        self, q, k, v, field, level, past_min, beta, scale, plan: _Plan, skip_tolerance, with_src, launcher=_run_kernel
    ):
        B, Hq, Tq, D = q.shape
        Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
        self.shape = (B, Hq, Hkv, Tq, Tk, D, Dv)
        self.acc = math_dtype(q, field, level)
        self.plan, self.launcher = plan, launcher
        self.t = prep.make_tiling(Tq, Tk, plan.block)
        self.q = q.reshape(B * Hq, Tq, D).contiguous()
        self.k = k.reshape(B * Hkv, Tk, D).contiguous()
        self.v = v.reshape(B * Hkv, Tk, Dv).contiguous()
        rows = [
            x.reshape(B * Hq, n).to(self.acc).contiguous() for x, n in ((field, Tq), (level, Tk), (past_min, Tk - Tq))
        ]
        self.field, self.level = rows[0], rows[1]
        self.tiles = prep.field_tiles(rows[0], rows[2], rows[1], self.t, with_src)
        self.beta = beta.to(self.acc).contiguous()
        self.scale = scale
        if skip_tolerance is None:
            self.thr = torch.full((B * Hq, self.t.nQ), float("inf"), dtype=self.acc, device=q.device)
        else:
            self.thr = prep.skip_thresholds(q, k, scale, skip_tolerance, self.t, self.acc)

    def grid_args(self):
        """(prepared tensors..., scalars...) shared by all three kernels, after the tensor-specific ones."""
        tl_ = self.tiles
        return (
            self.q,
            self.k,
            self.v,
            self.field,
            self.level,
            tl_.sfx,
            tl_.tmin,
            tl_.pref,
            tl_.minlvl,
            tl_.fq0,
            self.thr,
            self.beta,
        )

    def scalars(self):
        B, Hq, Hkv, Tq, Tk, D, Dv = self.shape
        t = self.t
        return (self.scale, Tq, Tk, t.pad, t.nP, t.nQ, t.nK, Hq, Hq // Hkv, D, Dv)

    def consts(self) -> dict:
        return kernel_constexprs(self.q.dtype, self.acc, self.shape[5], self.shape[6], self.plan)

    def launch(self, kernel: str, grid: tuple[int, int], *args) -> None:
        """Run ``kernel`` (a name in KERNELS) with these constexprs and the plan's launch options."""
        self.launcher(kernel, grid, args, self.consts(), self.plan.options(kernel))


def _forward(L: _Launch) -> tuple[Tensor, Tensor, Tensor]:
    """-> out (BH, Tq, Dv) in q's dtype, lse (BH, Lq) in the math dtype, skipped-tile counts (BH, nQ)."""
    B, Hq, Hkv, Tq, Tk, D, Dv = L.shape
    BH, t = B * Hq, L.t
    out = L.q.new_empty(BH, Tq, Dv)
    lse = torch.empty(BH, t.Lq, dtype=L.acc, device=L.q.device)
    nskip = torch.zeros(BH, t.nQ, dtype=torch.int32, device=L.q.device)
    L.launch("_fwd_kernel", (t.nQ, BH), *L.grid_args(), out, lse, nskip, *L.scalars())
    return out, lse, nskip


def _backward(L: _Launch, out: Tensor, lse: Tensor, dout: Tensor):
    """-> dq, dk, dv (flattened layouts, input dtypes), dfield (BH, Tq), dpast (BH, P), dlevel (BH, Tk), dbeta (Hq,)."""
    B, Hq, Hkv, Tq, Tk, D, Dv = L.shape
    BH, t, dev = B * Hq, L.t, L.q.device
    dout = dout.reshape(BH, Tq, Dv).contiguous()
    delta = torch.zeros(BH, t.Lq, dtype=L.acc, device=dev)
    delta[:, :Tq] = (dout.to(L.acc) * out.to(L.acc)).sum(-1)
    common = (dout, lse, delta)
    new = lambda *shape: torch.zeros(*shape, dtype=L.acc, device=dev)  # noqa: E731
    dq = torch.empty_like(L.q)
    dpref, ddiag, dtile, dbeta = new(BH, t.Lq), new(BH, t.Lq), new(BH, t.nK), new(BH, t.nQ)
    L.launch("_bwd_dq_kernel", (t.nQ, BH), *L.grid_args(), *common, dq, dpref, ddiag, dtile, dbeta, *L.scalars())
    dk, dv = torch.empty_like(L.k), torch.empty_like(L.v)
    dlevel, dsfx = new(BH, t.Lk), new(BH, t.Lk)
    L.launch("_bwd_dkdv_kernel", (t.nK, B * Hkv), *L.grid_args(), *common, dk, dv, dlevel, dsfx, *L.scalars())
    dfield, dpast = prep.route_field_grads(L.tiles, t, dsfx, dtile, dpref, ddiag)
    dbeta = dbeta.view(B, Hq, t.nQ).sum(dim=(0, 2))
    return dq, dk, dv, dfield, dpast, dlevel[:, t.pad : t.pad + Tk], dbeta


class FPATritonFunction(torch.autograd.Function):
    """Autograd function of the tiled Triton kernels (the arguments of ``fpa_triton``); the backward
    recomputes the tiles with the sources of the minima and returns gradients in the inputs' dtypes."""

    @staticmethod
    def forward(ctx, q, k, v, field, level, past_min, beta, scale: float, plan: _Plan, skip_tolerance):
        """q (B, Hq, Tq, D), k, v (B, Hkv, Tk, D/Dv), field (B, Hq, Tq), level (B, Hq, Tk),
        past_min (B, Hq, Tk - Tq), beta (Hq,) -> out (B, Hq, Tq, Dv) in q's dtype."""
        L = _Launch(q, k, v, field, level, past_min, beta, scale, plan, skip_tolerance, with_src=False)
        out, lse, _ = _forward(L)
        ctx.save_for_backward(q, k, v, field, level, past_min, beta, out, lse)
        ctx.args = (scale, plan, skip_tolerance)
        B, Hq, Tq = q.shape[:3]
        return out.view(B, Hq, Tq, -1)

    @staticmethod
    def backward(ctx, dout):
        """dout (B, Hq, Tq, Dv) -> the gradients of q, k, v, field, level, past_min and beta (None for
        scale, plan and skip_tolerance)."""
        q, k, v, field, level, past_min, beta, out, lse = ctx.saved_tensors
        scale, plan, skip_tolerance = ctx.args
        L = _Launch(q, k, v, field, level, past_min, beta, scale, plan, skip_tolerance, with_src=True)
        dq, dk, dv, dfield, dpast, dlevel, dbeta = _backward(L, out, lse, dout)
        cast = lambda g, x: g.reshape(x.shape).to(x.dtype)  # noqa: E731
        grads = (
            cast(dq, q),
            cast(dk, k),
            cast(dv, v),
            cast(dfield, field),
            cast(dlevel, level),
            cast(dpast, past_min),
            cast(dbeta, beta),
        )
        return grads + (None, None, None)


def fpa_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    past_min: Tensor,
    beta: Tensor,
    scale: float,
    skip_tolerance: float | None = None,
    block: int | None = None,
) -> Tensor:
    """Cache form: q (B, Hq, Tq, D); k, v (B, Hkv, Tk, D/Dv); field (B, Hq, Tq) at the query
    positions; level (B, Hq, Tk); past_min (B, Hq, Tk - Tq); beta (Hq,) -> (B, Hq, Tq, Dv) in q's dtype.

    skip_tolerance: None (exact) or eps in (0, 1): see the module docstring for the error allowed.
    block: the tile under the interpreter (a power of two >= 16, default 16). On CUDA it must be
        None: the tile and num_warps come from the compiled-clean table (triton_configs.CONFIGS),
        and inputs without an entry there raise a ValueError saying why.
    """
    plan = _plan(q, v.shape[-1], math_dtype(q, field, level), block)
    return FPATritonFunction.apply(q, k, v, field, level, past_min, beta, scale, plan, skip_tolerance)


def skipped_tiles(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    past_min: Tensor,
    beta: Tensor,
    scale: float,
    skip_tolerance: float | None,
    block: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Forward only, for tests and benchmarks: -> (out (B, Hq, Tq, Dv), skipped key tiles per query tile
    (B, Hq, nQ))."""
    plan = _plan(q, v.shape[-1], math_dtype(q, field, level), block)
    L = _Launch(q, k, v, field, level, past_min, beta, scale, plan, skip_tolerance, with_src=False)
    out, _, nskip = _forward(L)
    B, Hq, Tq = q.shape[:3]
    return out.view(B, Hq, Tq, -1), nskip.view(B, Hq, -1)


def planned_launches(
    arch: int, dtype: torch.dtype, head_dim: int, config: configs.LaunchConfig | None = None
) -> list[tuple[str, tuple, dict, dict]]:
    """What the launcher passes to each kernel on ``arch`` (a key of triton_configs.SMEM_LIMIT) for
    inputs of ``dtype`` and head dim D = Dv = ``head_dim``, recorded from a forward and a backward
    on small CPU tensors with the kernels not run: [(kernel, args, constexprs, launch options)],
    one per kernel. The ints are chosen to be none of 1 or a multiple of 16 except D and Dv (Triton
    specializes on those values; D and Dv are multiples of 16 in every covered head dim), so the
    kernels compiled from this are the general case. ``config``: a candidate instead of the
    launcher's own choice (triton_configs.CONFIGS). For ahead-of-time compilation (triton_aot)."""
    cfg = config or configs.lookup(
        arch, f"sm_{arch}", dtype, math_dtype(torch.empty(0, dtype=dtype)), head_dim, head_dim
    )
    if isinstance(cfg, str):
        raise ValueError(cfg)
    calls: list[tuple[str, tuple, dict, dict]] = []
    record: Launcher = lambda name, grid, args, consts, opts: calls.append((name, args, consts, opts))  # noqa: E731
    B, Hq, Hkv = 1, 6, 2
    Tq = 2 * cfg.block + 3  # three query tiles, the last partial
    Tk = Tq + 2 * cfg.block + 5  # P not a multiple of the tile
    g = torch.Generator().manual_seed(0)
    r = lambda *s, dt=torch.float32: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    q, k, v = r(B, Hq, Tq, head_dim, dt=dtype), r(B, Hkv, Tk, head_dim, dt=dtype), r(B, Hkv, Tk, head_dim, dt=dtype)
    field, level, past_min, beta = r(B, Hq, Tq), r(B, Hq, Tk), r(B, Hq, Tk - Tq), r(Hq).abs()
    plan = _Plan(cfg.block, cfg)
    L = _Launch(q, k, v, field, level, past_min, beta, head_dim**-0.5, plan, 1e-3, with_src=True, launcher=record)
    out, lse, _ = _forward(L)
    _backward(L, out, lse, torch.zeros_like(out))
    return calls
