"""GPU benchmark: FPA (triton, skipping off and on; flex) vs FoX vs SDPA flash, forward+backward, bf16.

Superseded by benchmarks/gpu_check.py, which also checks flex, FoX-as-FPA and T up to 4k,
times FoX through the same triton kernel, adds a training line, and records the verdicts that let
``backend="auto"`` pick triton/flex on that GPU (fpa.ops.gpu_verified). Kept for its flex/fla rows.

One command, meant to finish within 8 minutes on one H200:

    python benchmarks/bench_gpu.py                 # T = 2k..32k, writes benchmarks/results/gpu-h200.md
    python benchmarks/bench_gpu.py --seq-lens 2048 --reps 3 --out /tmp/x.md

First a correctness check of the triton backend against the dense reference on small shapes
(forward and the gradients of q, k, v, field, level, beta; float32 and bfloat16; GQA; Tq < Tk);
if it fails, the script stops before timing anything (exit status 1).

Inputs: B * H * T = 16 * 32768 tokens-heads (B = 32768 // T, H = 16), D = 128, bf16. The
field is a FoX-like walk: field = level = cumsum(log sigmoid(x + 3)), so FPA equals FoX (P2)
and the two run on identical logits; q and k are L2-normalised and scaled by sqrt(D) (QK-norm,
content logits bounded by sqrt(D)), which is what lets the skipping bound bite.
Each method: fn() then backward with a fixed output gradient; one warm-up call (compiles),
then --reps timed calls (CUDA events), median reported. The FPA triton/flex rows time the
backend functions directly in the cache form (no argument validation, which syncs the host),
including their O(T) field preparation. A method that fails or exceeds memory is reported as such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

H, D = 16, 128
TOKENS = 32768
DEADLINE_S = 7 * 60
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu-h200.md"
SKIP_TOL = 1e-3


def make_inputs(T: int, device: str = "cuda", dtype=torch.bfloat16, seed: int = 0) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)
    B = max(1, TOKENS // T)

    def r(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32)

    q, k = (F.normalize(r(B, H, T, D), dim=-1) * D**0.5 for _ in range(2))
    v = r(B, H, T, D)
    log_f = F.logsigmoid(r(B, H, T) + 3.0)
    walk = log_f.cumsum(-1)
    x = dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), field=walk.clone(), level=walk.clone(), log_f=log_f)
    for t in x.values():
        t.requires_grad_(True)
    x["dout"] = r(B, H, T, D).to(dtype)
    return x


def _fla_fox():
    try:
        from fla.ops.forgetting_attn import parallel_forgetting_attn

        return parallel_forgetting_attn
    except Exception:  # noqa: BLE001 - not installed, or an incompatible build
        return None


def methods() -> dict:
    """name -> fn(x) returning the output (B, H, T, D)."""
    from fpa.ops import forgetting_attention
    from fpa.ops.fpa.flex import fpa_flex
    from fpa.ops.fpa.triton import fpa_triton

    def fpa_args(x: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, float]:
        """(q, k, v, field, level, past_min, beta, scale): the positional arguments of the FPA ops."""
        empty = x["field"][..., :0]
        beta = torch.ones(H, device=x["q"].device)
        return (x["q"], x["k"], x["v"], x["field"], x["level"], empty, beta, D**-0.5)

    out = {
        "FPA triton": lambda x: fpa_triton(*fpa_args(x)),
        f"FPA triton, skip {SKIP_TOL:g}": lambda x: fpa_triton(*fpa_args(x), skip_tolerance=SKIP_TOL),
        "FPA flex": lambda x: fpa_flex(*fpa_args(x)),
    }
    fla = _fla_fox()
    if fla is not None:
        out["FoX (fla parallel_forgetting_attn)"] = lambda x: fla(
            *(x[n].transpose(1, 2).contiguous() for n in ("q", "k", "v")),
            x["log_f"].transpose(1, 2).contiguous(),
            scale=D**-0.5,
        ).transpose(1, 2)
    else:
        out["FoX (fpa chunked; fla not importable)"] = lambda x: forgetting_attention(
            x["q"], x["k"], x["v"], x["log_f"]
        )

    def sdpa(x):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(x["q"], x["k"], x["v"], is_causal=True)

    out["SDPA flash"] = sdpa
    return out


def fwd_bwd(fn, x) -> None:
    leaves = [t for n, t in x.items() if n != "dout"]
    out = fn(x)
    torch.autograd.grad(out, leaves, x["dout"], allow_unused=True)


def time_ms(fn, x, reps: int) -> float:
    fwd_bwd(fn, x)  # warm-up and compile
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fwd_bwd(fn, x)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def correctness_check() -> list[str]:
    """Triton vs the dense reference on small shapes; returns the failures (empty: pass)."""
    from fpa import first_passage_attention

    failures = []
    tols = {torch.float32: (2e-5, 2e-4), torch.bfloat16: (2e-2, 5e-2)}
    # (dtype, B, Hq, Hkv, Tq, Tk, D): GQA, Tq < Tk with P not a multiple of the tile, partial tiles
    cases = [
        (torch.float32, 2, 4, 2, 77, 150, 64),
        (torch.bfloat16, 2, 4, 2, 77, 150, 128),
        (torch.bfloat16, 1, 2, 1, 130, 130, 128),
    ]
    for dtype, B, Hq, Hkv, Tq, Tk, Dh in cases:
        g = torch.Generator(device="cuda").manual_seed(Tq)
        r = lambda *s, g=g: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
        xs = dict(
            q=r(B, Hq, Tq, Dh),
            k=r(B, Hkv, Tk, Dh),
            v=r(B, Hkv, Tk, Dh),
            field=3 * r(B, Hq, Tk),
            level=3 * r(B, Hq, Tk),
            beta=torch.rand(Hq, device="cuda") + 0.25,
        )
        xs = {n: (t.to(dtype) if n in ("q", "k", "v") else t).requires_grad_(True) for n, t in xs.items()}
        w = r(B, Hq, Tq, Dh)
        res = {}
        try:
            for backend in ("reference", "triton"):
                o = first_passage_attention(
                    *(xs[n] for n in ("q", "k", "v", "field", "level")), beta=xs["beta"], backend=backend
                )
                res[backend] = [o] + list(torch.autograd.grad((o.float() * w).sum(), list(xs.values())))
        except Exception as e:  # noqa: BLE001 - a compile or launch error is a failed check
            failures.append(f"{dtype} B{B} Hq{Hq} Hkv{Hkv} Tq{Tq} Tk{Tk} D{Dh}: {e!r}")
            continue
        for name, a, b in zip(["out"] + list(xs), res["triton"], res["reference"]):
            err = a.double() - b.double()
            rms = err.pow(2).mean().sqrt() / b.double().pow(2).mean().sqrt().clamp(min=1e-3)
            rms_tol, max_tol = tols[dtype] if name == "out" else (4 * tols[dtype][0], 20 * tols[dtype][1])
            if not (rms <= rms_tol and err.abs().max() <= max_tol):
                failures.append(
                    f"{dtype} B{B} Hq{Hq} Hkv{Hkv} Tq{Tq} Tk{Tk} D{Dh} {name}: rms {rms:.2e}, max {err.abs().max():.2e}"
                )
    return failures


def skip_fraction(x) -> float:
    """Fraction of the off-diagonal (query tile, key tile) pairs the forward skipped."""
    from fpa.ops.fpa.triton import skipped_tiles

    with torch.no_grad():
        empty = x["field"][..., :0]
        _, n = skipped_tiles(
            x["q"],
            x["k"],
            x["v"],
            x["field"],
            x["level"],
            empty,
            torch.ones(H, device=x["q"].device),
            D**-0.5,
            SKIP_TOL,
        )
    nq = n.shape[-1]
    return float(n.sum()) / (n.shape[0] * n.shape[1] * nq * (nq - 1) / 2) if nq > 1 else 0.0


def render(rows: dict, seq_lens: list[int], names: list[str], skips: dict, device: str, reps: int) -> str:
    fox = next(n for n in names if n.startswith("FoX"))
    lines = [
        f"# FPA vs FoX vs SDPA on {device}: forward+backward, bf16, H={H}, D={D}, B*T={TOKENS}",
        "",
        f"Median of {reps} timed calls (ms) after one warm-up; ratio = time / {fox}. "
        "Generated by `python benchmarks/bench_gpu.py`.",
        "",
        "| method | " + " | ".join(f"T={T}" for T in seq_lens) + " |",
        "|---|" + "---|" * len(seq_lens),
    ]
    for n in names:
        cells = []
        for T in seq_lens:
            t, f = rows.get((n, T)), rows.get((fox, T))
            if isinstance(t, float):
                ratio = f" ({t / f:.2f}x)" if isinstance(f, float) else ""
                cells.append(f"{t:.2f}{ratio}")
            else:
                cells.append(str(t) if t is not None else "-")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Skipped off-diagonal tile pairs (skip_tolerance={SKIP_TOL:g}): "
        + ", ".join(f"T={T}: {skips[T]:.1%}" for T in seq_lens if T in skips),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit(
            "bench_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); "
            "on CPU, the triton backend is tested in the interpreter by tests/ops/test_triton.py"
        )
    start = time.time()
    failures = correctness_check()
    if failures:
        print("CORRECTNESS CHECK FAILED, no table written:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    print(f"correctness check passed ({time.time() - start:.0f} s)", flush=True)
    fns = methods()
    rows: dict[tuple[str, int], float | str] = {}
    skips: dict[int, float] = {}
    for T in args.seq_lens:
        x = make_inputs(T)
        skips[T] = skip_fraction(x)
        for name, fn in fns.items():
            if time.time() - start > DEADLINE_S:
                rows[(name, T)] = "not run (time limit)"
                continue
            try:
                rows[(name, T)] = time_ms(fn, x, args.reps)
            except torch.cuda.OutOfMemoryError:
                rows[(name, T)] = "OOM"
            except Exception as e:  # noqa: BLE001 - reported in the table
                rows[(name, T)] = f"failed: {type(e).__name__}"
                print(f"{name} T={T}: {e!r}", file=sys.stderr)
            torch.cuda.empty_cache()
            print(f"T={T} {name}: {rows[(name, T)]}", flush=True)
        del x
    table = render(rows, args.seq_lens, list(fns), skips, torch.cuda.get_device_name(), args.reps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
