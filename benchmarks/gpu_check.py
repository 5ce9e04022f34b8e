"""The one prepared GPU check: correctness, speed and a training line, one command.

    python benchmarks/gpu_check.py --quick              # one GPU, <= 8 min: (a) and a short (b); gpu-<device>.md/.json
    python benchmarks/gpu_check.py                      # one GPU (H200: ~5 min); results/gpu-<device>.md
    python benchmarks/gpu_check.py --model DIR          # also: tiles skipped on a trained model's fields
    python benchmarks/gpu_check.py --compare --seq-lens 2048 8192  # (b) also flex and fla rows, two lengths
    python benchmarks/gpu_check.py --dry-run --out X.md # CPU, tiny shapes, triton interpreted (the tests run this)
    python benchmarks/gpu_check.py --quick --dry-run --out X.md  # the quick path on CPU (the tests run it too)

(a) Correctness of the triton and flex backends, forward and every gradient, against the dense
    reference on the same device: odd T, GQA, Tq < Tk, a decoding step, T up to 4096; float32 and
    bfloat16; FPA (random field/level, learned beta) and FoX-as-FPA (field = level = cumsum(log f),
    beta = 1, against FoX's own reference; the gradient reaches log f through the cumsum).
    The verdict per backend is recorded (fpa.ops.gpu_verified): ``backend="auto"`` on CUDA picks
    only backends whose check passed on this GPU with these torch/triton versions and sources.
(b) Forward + backward time, bf16, H=16, D=128, B*T = 32768: FPA through the triton kernel (tile
    skipping off and on), FoX through the same kernel (its field), SDPA flash; T = 1k..32k.
    --compare adds FPA through flex and FoX through flash-linear-attention (when it imports; the
    flex rows compile once per T, so give them --budget-s or fewer --seq-lens).
    Tile skipping: the fraction of off-diagonal tile pairs skipped on these fields, and with
    --model on a trained model's fields (each FPA layer, on random token ids).
(c) Training throughput of the tiny preset (batch 8 x 1024, bf16 autocast) per attention type.

--quick: (a) on four shapes (flex on two), then (b) at T = 1k, 4k, 16k without flex and fla, no
(c): about 3-5 min on an H100 (budget 420 s, the same deadline rule). Times come from
triton.testing.do_bench (median, CUDA events). Every run writes the .md and a .json beside it
(device, versions, per-case errors and verdicts, times).

Every section runs under a deadline (--budget-s, default 420 s) and reports what it skipped.
Exit status 1 when a correctness check fails (the table is still written).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_timing import FLA_ROW, SKIP_TOL, Clock, methods, model_skips, skip_fraction, time_ms, timing_inputs, training

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NAMES = ("q", "k", "v", "field", "level", "beta")
TOLS = {torch.float32: (2e-5, 2e-4), torch.bfloat16: (2e-2, 5e-2)}  # (rms, max) forward; gradients 4x / 20x
FLEX_CASES = (0, 5, 6)  # indices of the GPU correctness cases also run through flex


# ---------------------------------------------------------------- (a) correctness


def _case_inputs(kind: str, dtype, B, Hq, Hkv, Tq, Tk, D, device, seed) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device=device)  # noqa: E731
    xs = dict(q=r(B, Hq, Tq, D), k=r(B, Hkv, Tk, D), v=r(B, Hkv, Tk, D))
    if kind == "fpa":
        xs.update(
            field=torch.cumsum(0.3 * r(B, Hq, Tk), -1),
            level=torch.cumsum(0.3 * r(B, Hq, Tk), -1) + r(B, Hq, Tk),
            beta=torch.rand(Hq, generator=g, device=device) + 0.25,
        )
    else:
        xs["log_f"] = F.logsigmoid(r(B, Hq, Tk) + 2.0)
    return {n: (t.to(dtype) if n in ("q", "k", "v") else t).requires_grad_(True) for n, t in xs.items()}


def _run_case(kind: str, backend: str, xs: dict, w: torch.Tensor, grads: bool) -> list[torch.Tensor]:
    from fpa import first_passage_attention, forgetting_attention
    from fpa.ops import fox_as_fpa

    leaves = list(xs.values())
    if kind == "fpa":
        o = first_passage_attention(*(xs[n] for n in NAMES[:5]), beta=xs["beta"], backend=backend, check_inputs=False)
    elif backend == "reference":
        o = forgetting_attention(xs["q"], xs["k"], xs["v"], xs["log_f"], backend="reference")
    else:
        field, level = fox_as_fpa(xs["log_f"])
        o = first_passage_attention(
            xs["q"], xs["k"], xs["v"], field, level, beta=1.0, backend=backend, check_inputs=False
        )
    if not grads:
        return [o.detach()]
    return [o.detach(), *torch.autograd.grad((o.float() * w).sum(), leaves)]


def device_slug(name: str) -> str:
    """ "NVIDIA H100 80GB HBM3" -> "h100"; other names lower-cased with non-alphanumerics as dashes."""
    import re

    m = re.search(r"\b([AHBL]\d{2,3}[A-Z]?)\b", name)
    return m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def correctness(device: str, dry: bool, clock: Clock, quick: bool, record: dict) -> tuple[list[str], dict[str, bool]]:
    """-> table lines, verdict per backend (True: every case passed); the rows also go to record["correctness"]."""
    f32, b16 = torch.float32, torch.bfloat16
    if dry:
        cases = [("fpa", f32, 1, 2, 1, 9, 21, 16), ("fox", f32, 1, 2, 2, 17, 17, 16), ("fpa", b16, 1, 2, 1, 20, 20, 16)]
    elif quick:  # kind, dtype, B, Hq, Hkv, Tq, Tk, D; flex on the first two
        cases = [
            ("fpa", f32, 2, 4, 2, 77, 150, 64),
            ("fpa", b16, 2, 4, 2, 77, 150, 128),
            ("fox", b16, 2, 4, 2, 300, 517, 128),
            ("fpa", b16, 1, 4, 2, 2048, 2048, 64),
        ]
    else:
        cases = [
            ("fpa", f32, 2, 4, 2, 77, 150, 64),
            ("fpa", b16, 2, 4, 2, 77, 150, 128),
            ("fpa", b16, 1, 2, 1, 129, 129, 128),
            ("fpa", f32, 1, 2, 1, 1, 333, 64),
            ("fox", f32, 1, 2, 2, 1000, 1000, 64),
            ("fox", b16, 2, 4, 2, 300, 517, 128),
            ("fpa", b16, 1, 4, 2, 4096, 4096, 128),
            ("fox", b16, 1, 2, 2, 4096, 4096, 64),
        ]
    lines = [
        "## (a) Correctness against the dense reference",
        "",
        "Relative RMS / max abs error of the output and of every gradient (worst over the inputs); "
        "tolerances: forward float32 2e-5 / 2e-4, bfloat16 2e-2 / 5e-2; gradients 4x / 20x those.",
        "",
        "| backend | kind | dtype | B, Hq, Hkv, Tq, Tk, D | forward rms / max | worst gradient rms / max | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    verdict = {"triton": True, "flex": True}
    for i, (kind, dtype, B, Hq, Hkv, Tq, Tk, D) in enumerate(cases):
        xs = _case_inputs(kind, dtype, B, Hq, Hkv, Tq, Tk, D, device, seed=i)
        w = torch.randn(B, Hq, Tq, D, generator=torch.Generator(device=device).manual_seed(99), device=device)
        ref = _run_case(kind, "reference", xs, w, grads=True)
        names = ["out"] + list(xs)
        for backend in ("triton", "flex"):
            if backend == "flex" and not dry and i not in ((0, 1) if quick else FLEX_CASES):
                continue  # flex recompiles per shape (~0.5 min each): a subset keeps the check in budget
            shape = f"{B}, {Hq}, {Hkv}, {Tq}, {Tk}, {D}"
            row = f"| {backend} | {kind} | {str(dtype)[6:]} | {shape} |"
            if clock.left() < clock.budget * 0.45:  # keep more than half the budget for (b) and (c)
                lines.append(f"{row} — | — | not run (time budget; the backend counts as not verified) |")
                verdict[backend] = False
                continue
            grads = not (backend == "flex" and device == "cpu")  # FlexAttention has no backward on CPU
            try:
                with torch.set_grad_enabled(grads):
                    got = _run_case(kind, backend, xs, w, grads)
            except Exception as e:  # noqa: BLE001 - a compile or launch error is a failed check
                lines.append(f"{row} — | — | **FAIL**: {type(e).__name__}: {str(e)[:150]} |")
                record["correctness"].append(dict(backend=backend, kind=kind, shape=shape, error=repr(e)[:300]))
                verdict[backend] = False
                traceback.print_exc()
                continue
            errs = []
            for n, a, b in zip(names, got, ref):
                err = a.double() - b.double()
                rms = float(err.pow(2).mean().sqrt() / b.double().pow(2).mean().sqrt().clamp(min=1e-3))
                errs.append((n, rms, float(err.abs().max())))
            rt, mt = TOLS[dtype]
            ok = errs[0][1] <= rt and errs[0][2] <= mt and all(r <= 4 * rt and m <= 20 * mt for _, r, m in errs[1:])
            verdict[backend] &= ok
            worst = max(errs[1:], key=lambda e: e[1] / (4 * rt) + e[2] / (20 * mt)) if len(errs) > 1 else None
            gcell = f"{worst[1]:.1e} / {worst[2]:.1e} (d{worst[0]})" if worst else "n/a (no flex backward on CPU)"
            lines.append(f"{row} {errs[0][1]:.1e} / {errs[0][2]:.1e} | {gcell} | {'pass' if ok else '**FAIL**'} |")
            record["correctness"].append(
                dict(backend=backend, kind=kind, dtype=str(dtype)[6:], shape=shape, errors=errs, passed=ok)
            )
    lines += ["", "Verdict: " + ", ".join(f"{b} **{'PASS' if v else 'FAIL'}**" for b, v in verdict.items()), ""]
    return lines, verdict


# ---------------------------------------------------------------- (b) speed and tile skipping


def speed(
    device: str,
    dry: bool,
    clock: Clock,
    reps: int,
    seq_lens: list[int] | None,
    compare: bool,
    quick: bool,
    record: dict,
) -> list[str]:
    H, D, tokens = (2, 16, 32) if dry else (16, 128, 32768)
    full = [1024, 2048, 4096, 8192, 16384, 32768]
    seq_lens = seq_lens or ([32] if dry else [1024, 4096, 16384] if quick else full)
    fns = methods(H, D, compare)
    rows: dict[tuple[str, int], float | str] = {}
    skips: dict[tuple[str, int], float] = {}
    for T in seq_lens:
        x = timing_inputs(T, device, H, D, tokens)
        beta = torch.ones(H, device=device)
        for name, key in (("FPA walk", "walk"), ("FoX", "cum")):
            fld = x[key].detach()
            skips[(name, T)] = skip_fraction(x["q"], x["k"], x["v"], fld, fld, beta, D**-0.5)
        for name, fn in fns.items():
            if fn is None:
                rows[(name, T)] = "not installed"
                continue
            if clock.left() < 90:
                rows[(name, T)] = "not run (time budget)"
                continue
            try:
                rows[(name, T)] = time_ms(fn, x, reps)
            except Exception as e:  # noqa: BLE001 - reported in the table
                rows[(name, T)] = "OOM" if "out of memory" in str(e).lower() else f"failed: {type(e).__name__}"
                print(f"{name} T={T}: {e!r}", file=sys.stderr)
            if device == "cuda":
                torch.cuda.empty_cache()
            print(f"T={T} {name}: {rows[(name, T)]}", flush=True)
            record["speed_ms"].append(dict(method=name, T=T, ms=rows[(name, T)]))
        del x
    ref = "FoX via triton"
    lines = [
        "## (b) Forward + backward time (ms), bf16",
        "",
        f"H={H}, D={D}, batch = {tokens} // T; q, k L2-normalised x sqrt(D); FPA field = level = a walk "
        "(cumsum of 0.5 N(0,1) steps); FoX field = cumsum(logsigmoid(N(0,1) + 3)); beta = 1. Median of "
        f"{'triton.testing.do_bench' if device == 'cuda' else f'{reps} calls'} after a warm-up; (ratio to {ref}). "
        "Triton under its interpreter in a dry run: "
        "those times mean nothing.",
        "",
        "| method | " + " | ".join(f"T={T}" for T in seq_lens) + " |",
        "|---|" + "---:|" * len(seq_lens),
    ]
    for name in fns:
        cells = []
        for T in seq_lens:
            t, f = rows.get((name, T)), rows.get((ref, T))
            ratio = f" ({t / f:.2f}x)" if isinstance(t, float) and isinstance(f, float) else ""
            cells.append(f"{t:.2f}{ratio}" if isinstance(t, float) else str(t))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if compare:
        lines += [
            "",
            f"FPA flex: the flex backend on the FPA walk (compiled once per T). {FLA_ROW}: FoX in "
            "flash-linear-attention (`pip install flash-linear-attention`) on the same forget gates.",
        ]
    lines += [
        "",
        f"Off-diagonal tile pairs skipped at skip_tolerance={SKIP_TOL:g}: "
        + "; ".join(f"{n} T={T}: {v:.1%}" for (n, T), v in skips.items()),
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, triton in its interpreter")
    ap.add_argument("--quick", action="store_true", help="(a) on fewer shapes and a short (b); no (c); <= 8 min")
    ap.add_argument("--model", help="a trained FPA model folder: report the tiles skipped on its fields")
    ap.add_argument(
        "--out", type=Path, default=None, help="default benchmarks/results/gpu-<device>.md (dry run: gpu-dry-run.md)"
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--seq-lens", type=int, nargs="+", default=None, help="timed lengths (default 1k..32k)")
    ap.add_argument(
        "--compare", action="store_true", help="(b) also times FPA through flex and FoX through flash-linear-attention"
    )
    args = ap.parse_args(argv)
    if args.compare and args.dry_run:
        ap.error("--compare times GPU kernels (flex has no backward on CPU): not with --dry-run")
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        # triton reads TRITON_INTERPRET at import: run again in a fresh process with it set
        env = dict(
            os.environ,
            TRITON_INTERPRET="1",
            FPA_GPU_CHECK_RECORD=os.environ.get("FPA_GPU_CHECK_RECORD", str(Path(os.devnull))),
        )
        return subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=env).returncode
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check.py needs a CUDA GPU (or --dry-run on CPU)", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    clock = Clock(args.budget_s)
    dev_name = "CPU (dry run; triton in its interpreter)" if args.dry_run else torch.cuda.get_device_name()
    out = args.out or RESULTS / ("gpu-dry-run.md" if args.dry_run else f"gpu-{device_slug(dev_name)}.md")
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # the triton rows then fail and are reported as such
        triton_version = "not installed"
    from fpa.ops import gpu_verified

    flags = " ".join(f for f, on in (("--quick", args.quick), ("--dry-run", args.dry_run)) if on)
    head = [
        f"# GPU check: {dev_name}",
        "",
        f"torch {torch.__version__}, triton {triton_version}, fpa GPU sources {gpu_verified.source_hash()}. "
        f"Produced by `python benchmarks/gpu_check.py{' ' + flags if flags else ''}`.",
        "",
    ]
    record: dict = dict(
        device=dev_name,
        torch=torch.__version__,
        triton=triton_version,
        source=gpu_verified.source_hash(),
        command=f"gpu_check.py {flags}".strip(),
        correctness=[],
        speed_ms=[],
    )
    lines, verdict = correctness(device, args.dry_run, clock, args.quick, record)
    record["verdict"] = verdict
    print("\n".join(lines), flush=True)
    if not args.dry_run:
        path = gpu_verified.write_verdicts(torch.device("cuda"), verdict, "\n".join(lines))
        lines.append(
            f"Recorded in `{path}`: `auto` on this GPU now picks "
            f"{', '.join(b for b, v in verdict.items() if v) or 'neither (chunked)'}."
        )
        lines.append("")
    reps = 1 if args.dry_run else args.reps
    lines += speed(device, args.dry_run, clock, reps, args.seq_lens, args.compare, args.quick, record)
    if args.model:
        try:
            lines += model_skips(args.model, device, clock, 256 if args.dry_run else 4096)
        except Exception as e:  # noqa: BLE001
            lines += [f"Model tile skipping failed: {type(e).__name__}: {e}", ""]
    if not args.quick:
        backend = "chunked" if args.dry_run else ("triton" if verdict["triton"] else "chunked")
        lines += training(device, args.dry_run, clock, backend)
    lines.append(f"Total {time.time() - clock.t0:.0f} s.")
    record["total_s"] = round(time.time() - clock.t0, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(head + lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(lines[-12:]))
    print(f"wrote {out} and {out.with_suffix('.json').name}")
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
