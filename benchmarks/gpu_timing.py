"""The measured sections of benchmarks/gpu_check.py: (b) inputs, methods, timer, tile-skip figures;
(c) training throughput."""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F

SKIP_TOL = 1e-3
FLA_ROW = "FoX fla parallel_forgetting_attn"


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget = time.time(), budget_s

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)


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
    """Median time (ms) of forward + backward. CUDA: ``triton.testing.do_bench`` (CUDA events,
    L2 flushed between calls, warm-up first; about ``reps`` x 20 ms of repetitions). CPU (the dry
    run): the median wall time of ``reps`` calls after one warm-up call (meaningless as a speed)."""
    leaves = [t for n, t in x.items() if n != "dout"]

    def once():
        torch.autograd.grad(fn(x), leaves, x["dout"], allow_unused=True)

    once()  # warm-up, compiles
    if x["q"].is_cuda:
        from triton.testing import do_bench

        return float(do_bench(once, warmup=25, rep=20 * reps, return_mode="median"))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def skip_fraction(q, k, v, field, level, beta, scale) -> float:
    """Fraction of the off-diagonal (query tile, key tile) pairs the forward skips at SKIP_TOL."""
    from fpa.ops.fpa.triton import skipped_tiles

    with torch.no_grad():
        _, n = skipped_tiles(q, k, v, field, level, field[..., :0], beta, scale, SKIP_TOL)
    nq = n.shape[-1]
    return float(n.sum()) / (n.shape[0] * n.shape[1] * nq * (nq - 1) / 2) if nq > 1 else 0.0


def model_skips(model_dir: str, device: str, clock: Clock, T: int) -> list[str]:
    """Tiles skipped on a trained model's fields: each FPA layer's q, k, v, field, level on random ids."""
    from fpa.layers.attention import FirstPassageAttention
    from fpa.models import FPAForCausalLM

    model = FPAForCausalLM.from_pretrained(model_dir).to(device).eval()  # type: ignore[arg-type]  # transformers' @wraps(Module.to) stub keeps self
    captured = []

    def hook(mod, args):
        x = args[0]
        q, k, v = mod.project(x)
        field, level = mod.field_level(x)
        captured.append((q, k, v, field, level, mod.beta.float(), mod.scale))

    hooks = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, FirstPassageAttention)]
    if not hooks:
        return [f"Model {model_dir}: no FPA layers, no tile-skip figure.", ""]
    ids = torch.randint(0, model.config.vocab_size, (1, T), device=device)
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    fr = [skip_fraction(*c) for c in captured]
    return [
        f"Trained model `{model_dir}` ({model.config.fpa.mode} mode), random ids, T={T}: off-diagonal tile "
        f"pairs skipped at skip_tolerance={SKIP_TOL:g} per FPA layer: " + ", ".join(f"{f:.1%}" for f in fr),
        "",
    ]


# ---------------------------------------------------------------- (c) training throughput


def training(device: str, dry: bool, clock: Clock, fpa_backend: str) -> list[str]:
    from fpa.layers.attention import FirstPassageAttention
    from fpa.models import FPAConfig, FPAForCausalLM
    from fpa.train import parameter_groups

    batch, T, steps = (2, 64, 2) if dry else (8, 1024, 10)
    over = dict(num_hidden_layers=2) if dry else {}
    lines = [
        "## (c) Training throughput, tiny preset",
        "",
        f"batch {batch} x {T}, AdamW over fpa.train.parameter_groups, "
        f"{'bf16 autocast, ' if device == 'cuda' else ''}median of {steps} steps after 2 warm-up steps; "
        f"FPA layers on backend {fpa_backend!r}, FoX on its chunked backend.",
        "",
        "| attention | tokens/s | step ms |",
        "|---|---:|---:|",
    ]
    for att, kw in (
        ("softmax_rope", {}),
        ("fox", {}),
        ("fpa", {"fpa": {"mode": "walk"}}),
        ("fpa", {"fpa": {"mode": "free"}}),
    ):
        name = f"fpa-{kw['fpa']['mode']}" if kw else att
        if clock.left() < 30:
            lines.append(f"| {name} | not run (time budget) | |")
            continue
        torch.manual_seed(0)
        model = FPAForCausalLM(FPAConfig.from_preset("tiny", attention=att, **kw, **over)).to(device)  # type: ignore[arg-type]  # transformers' @wraps(Module.to) stub keeps self
        for m in model.modules():
            if isinstance(m, FirstPassageAttention):
                m.backend = fpa_backend
        opt = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-3)
        ids = torch.randint(0, model.config.vocab_size, (batch, T), device=device)
        times = []
        try:
            for i in range(steps + 2):
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if device == "cuda":
                    torch.cuda.synchronize()
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            lines.append(f"| {name} | {batch * T / med:,.0f} | {med * 1e3:.1f} |")
        except Exception as e:  # noqa: BLE001 - reported in the table
            lines.append(f"| {name} | failed: {type(e).__name__}: {str(e)[:100]} | |")
            traceback.print_exc()
    return lines + [""]
