"""Compile every Triton kernel ahead of time (no GPU) for every candidate launch configuration.

    python benchmarks/triton_aot.py                  # full sweep (~15-25 min on 2 cores)
    python benchmarks/triton_aot.py --launcher-only  # only what the launcher picks (~1-2 min)

For sm_80 and sm_90, float32/bfloat16/float16 inputs, head dims 32/64/128, and each candidate
(tile in triton_configs.CANDIDATE_BLOCKS x num_warps in CANDIDATE_WARPS), compiles the forward,
dq and dk/dv kernels exactly as the launcher calls them (fpa.ops.fpa.triton_aot) and records
registers per thread, spill bytes, shared memory and compile time. A configuration is clean
when nothing spills and shared memory fits the architecture's per-block limit. Picks per
(arch, dtype, head dim) by triton_configs.choose and compares with triton_configs.CONFIGS (the
table the launcher uses): a difference is printed as the literal to paste, and the exit status
is 1. Writes benchmarks/results/triton-aot.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from fpa.ops.fpa import triton_aot as aot
from fpa.ops.fpa import triton_configs as configs

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "triton-aot.md"
NAMES = {v: k for k, v in configs.DTYPES.items()}


def sweep_jobs(archs, dtypes, dims) -> list[tuple]:
    return [
        (a, NAMES[dt], d, k, configs.LaunchConfig(b, (w, w, w)))
        for a in archs
        for dt in dtypes
        for d in dims
        for b in configs.CANDIDATE_BLOCKS[dt]
        for w in configs.CANDIDATE_WARPS
        for k in configs.KERNELS
    ]


def chosen(results: list[aot.Compiled]) -> dict[tuple[int, str, int], configs.LaunchConfig | None]:
    clean: dict[tuple[int, str, int], dict] = {}
    for r in results:
        clean.setdefault((r.arch, r.dtype, r.head_dim), {})[(r.block, r.num_warps, r.kernel)] = not r.problems()
    return {key: configs.choose(key[1], c) for key, c in clean.items()}


def markdown(results: list[aot.Compiled], picks: dict, wall: float, launcher_only: bool) -> str:
    import triton

    used = {
        (a, dt, d, cfg.block, k, cfg.options(k)["num_warps"])
        for (a, dt, d), cfg in configs.CONFIGS.items()
        for k in configs.KERNELS
    }
    n_bad = sum(bool(r.problems()) for r in results)
    worst_smem = max(results, key=lambda r: r.shared)
    launch = [r for r in results if (r.arch, r.dtype, r.head_dim, r.block, r.kernel, r.num_warps) in used]
    worst_reg = max(launch, key=lambda r: r.regs) if launch else None
    lines = [
        "# Triton kernels compiled ahead of time",
        "",
        f"`python benchmarks/triton_aot.py{' --launcher-only' if launcher_only else ''}`: torch {torch.__version__}, "
        f"triton {triton.__version__} (its ptxas), no GPU. {len(results)} compilations in {wall:.0f} s on this "
        "machine's CPUs (compile s is per kernel, with other compilations running beside it). "
        f"Shared-memory limits per block: sm_80 {configs.SMEM_LIMIT[80]} B, sm_90 {configs.SMEM_LIMIT[90]} B. "
        "Spills: bytes stored / loaded to local memory (SASS STL/LDL). 'used' marks the configuration the "
        "launcher runs (fpa.ops.fpa.triton_configs.CONFIGS); 'pruned' ones spill or do not fit.",
        "",
        f"Not clean: {n_bad} of {len(results)}. Largest shared memory: {worst_smem.shared / 1024:.1f} KiB "
        f"({worst_smem.kernel}, sm_{worst_smem.arch}, {worst_smem.dtype}, D={worst_smem.head_dim}, "
        f"block {worst_smem.block}). "
        + (
            f"Used configurations ({len(launch)} kernels): most registers {worst_reg.regs} ({worst_reg.kernel}, "
            f"sm_{worst_reg.arch}, {worst_reg.dtype}, D={worst_reg.head_dim}); largest shared memory "
            f"{max(r.shared for r in launch) / 1024:.1f} KiB; "
            f"spills {sum(r.spill_stores + r.spill_loads for r in launch)} B."
            if worst_reg
            else ""
        ),
        "",
        "## The launcher's configurations",
        "",
        "| arch | dtype | head dim | configuration | chosen by the rule from these results |",
        "|---|---|---:|---|---|",
    ]
    for (a, dt, d), cfg in sorted(picks.items()):
        mine = configs.CONFIGS.get((a, dt, d))
        same = "same" if mine == cfg else f"**differs**: {cfg.describe() if cfg else 'none clean'}"
        cell = mine.describe() if mine else "none: the triton backend refuses these inputs"
        lines.append(f"| sm_{a} | {dt} | {d} | {cell} | {same} |")
    lines += [
        "",
        "## Every compilation",
        "",
        "| kernel | arch | dtype | head dim | block, warps | regs | spills st / ld (B) | shared KiB | compile s "
        "| status |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        key = (r.arch, r.dtype, r.head_dim, r.block, r.kernel, r.num_warps)
        bad = r.problems()
        status = ("pruned: " + "; ".join(bad)) if bad else ("**used**" if key in used else "clean")
        if r.error:
            lines.append(
                f"| {r.kernel} | sm_{r.arch} | {r.dtype} | {r.head_dim} | {r.block}, {r.num_warps} | "
                f"| | | {r.compile_s:.1f} | {status} |"
            )
            continue
        lines.append(
            f"| {r.kernel} | sm_{r.arch} | {r.dtype} | {r.head_dim} | {r.block}, {r.num_warps} | {r.regs} | "
            f"{r.spill_stores} / {r.spill_loads} | {r.shared / 1024:.1f} | {r.compile_s:.1f} | {status} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launcher-only", action="store_true", help="compile only the launcher's configurations")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--archs", type=int, nargs="+", default=list(configs.SMEM_LIMIT))
    ap.add_argument("--dtypes", nargs="+", default=list(NAMES))
    ap.add_argument("--head-dims", type=int, nargs="+", default=list(configs.HEAD_DIMS))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--render", type=Path, help="no compiling: rewrite the tables from this script's earlier .json")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.render:
        saved = json.loads(args.render.read_text())
        results, wall = [aot.Compiled(**r) for r in saved["results"]], saved["wall_s"]
        args.launcher_only = saved.get("launcher_only", False)
    else:
        if args.launcher_only:
            jobs = aot.launcher_jobs(args.archs, [NAMES[d] for d in args.dtypes], args.head_dims)
        else:
            jobs = sweep_jobs(args.archs, args.dtypes, args.head_dims)
        results = aot.compile_all(jobs, args.workers)
        wall = time.perf_counter() - t0
    picks = {} if args.launcher_only else chosen(results)
    if args.launcher_only:
        picks = {key: cfg for key, cfg in configs.CONFIGS.items() if key[0] in args.archs}
    text = markdown(results, picks, wall, args.launcher_only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {"wall_s": round(wall, 1), "launcher_only": args.launcher_only, "results": [r.row() for r in results]},
            indent=1,
        )
        + "\n"
    )
    print(text)
    differs = {k: v for k, v in picks.items() if configs.CONFIGS.get(k) != v}
    if differs and not args.launcher_only:
        print("triton_configs.CONFIGS differs from the rule; the rule's table:", file=sys.stderr)
        for (a, dt, d), cfg in sorted(picks.items()):
            lit = f"_c({cfg.block}, {', '.join(map(str, cfg.warps))})" if cfg else "None"
            print(f"    ({a}, {dt!r}, {d}): {lit},", file=sys.stderr)
    print(f"wrote {args.out} ({wall:.0f} s)")
    bad_used = [r for r in results if r.problems() and args.launcher_only]
    return 1 if (differs and not args.launcher_only) or bad_used else 0


if __name__ == "__main__":
    sys.exit(main())
