"""The timed methods of benchmarks/gpu_check.py section (b): inputs, methods, timer, tile-skip figure."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

SKIP_TOL = 1e-3
FLA_ROW = "FoX fla parallel_forgetting_attn"

Method = Callable[[dict], torch.Tensor]


def timing_inputs(T: int, device: str, H: int, D: int, tokens: int) -> dict:
    g = torch.Generator(device=device).manual_seed(T)
    B = max(1, tokens // T)
    r = lambda *s: torch.randn(*s, generator=g, device=device)  # noqa: E731
    q, k = (F.normalize(r(B, H, T, D), dim=-1) * D**0.5 for _ in range(2))  # QK-norm-like: bounded logits
    walk = torch.cumsum(0.5 * r(B, H, T), -1)  # an FPA walk (field = level)
    log_f = F.logsigmoid(r(B, H, T) + 3.0)  # FoX's forget gates; its field is their cumsum
    x = dict(q=q.bfloat16(), k=k.bfloat16(), v=r(B, H, T, D).bfloat16(), walk=walk, cum=log_f.cumsum(-1), log_f=log_f)
    for t in x.values():
        t.requires_grad_(True)
    x["dout"] = r(B, H, T, D).bfloat16()
    return x


def _fla_fox() -> Callable | None:
    """flash-linear-attention's FoX kernel, or None where it does not import."""
    try:
        from fla.ops.forgetting_attn import parallel_forgetting_attn

        return parallel_forgetting_attn
    except Exception:  # noqa: BLE001 - not installed, or an incompatible build
        return None


def methods(H: int, D: int, compare: bool = False) -> dict[str, Method | None]:
    """name -> fn(inputs) -> output (B, H, T, D). ``compare`` adds FPA through flex and FoX through
    flash-linear-attention (None where that package does not import)."""
    from fpa.ops.fpa.flex import fpa_flex
    from fpa.ops.fpa.triton import fpa_triton

    def fpa_via(op, fieldname: str, **kw) -> Method:
        def fn(x):
            f = x[fieldname]
            beta = torch.ones(H, device=f.device)
            return op(x["q"], x["k"], x["v"], f, f, f[..., :0], beta, D**-0.5, **kw)

        return fn

    def sdpa(x):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = SDPBackend.FLASH_ATTENTION if x["q"].is_cuda else SDPBackend.MATH
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(x["q"], x["k"], x["v"], is_causal=True)

    out: dict[str, Method | None] = {
        "FPA triton": fpa_via(fpa_triton, "walk", skip_tolerance=None),
        f"FPA triton, skip {SKIP_TOL:g}": fpa_via(fpa_triton, "walk", skip_tolerance=SKIP_TOL),
    }
    if compare:
        out["FPA flex"] = fpa_via(fpa_flex, "walk")
    out["FoX via triton"] = fpa_via(fpa_triton, "cum", skip_tolerance=None)
    out[f"FoX via triton, skip {SKIP_TOL:g}"] = fpa_via(fpa_triton, "cum", skip_tolerance=SKIP_TOL)
    if compare:
        fla = _fla_fox()
        out[FLA_ROW] = None
        if fla is not None:
            out[FLA_ROW] = lambda x: fla(  # (B, T, H, D) layout
                *(x[n].transpose(1, 2).contiguous() for n in ("q", "k", "v", "log_f")), scale=D**-0.5
            ).transpose(1, 2)
    out["SDPA flash"] = sdpa
    return out


def time_ms(fn: Method, x: dict, reps: int) -> float:
    """Median wall time (ms) of forward + backward over ``reps`` calls after one warm-up call."""
    leaves = [t for n, t in x.items() if n != "dout"]

    def once():
        torch.autograd.grad(fn(x), leaves, x["dout"], allow_unused=True)

    once()  # warm-up, compiles
    times = []
    for _ in range(reps):
        if x["q"].is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        once()
        if x["q"].is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def skip_fraction(q, k, v, field, level, beta, scale) -> float:
    """Fraction of the off-diagonal (query tile, key tile) pairs the forward skips at SKIP_TOL."""
    from fpa.ops.fpa.triton import skipped_tiles

    with torch.no_grad():
        _, n = skipped_tiles(q, k, v, field, level, field[..., :0], beta, scale, SKIP_TOL)
    nq = n.shape[-1]
    return float(n.sum()) / (n.shape[0] * n.shape[1] * nq * (nq - 1) / 2) if nq > 1 else 0.0
