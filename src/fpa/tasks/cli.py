"""``fpa synth``: the capacity experiment on the nested-structure tasks, and the constructive check.

    fpa synth --task stack --methods fpa_walk,fox --dims 1,4 --ms 4,16 --seeds 0,1,2,3,4 --out DIR
    fpa synth --preset quick --out DIR       # every task, a small slice (<= 5 minutes on 2 cores)
    fpa synth --preset full --out DIR        # the full grid

Writes DIR/results.json (meta + one record per run), results.md, heatmap_<task>.png,
curves_<task>.png and constructive.json / constructive.md (P4 by construction, no training).
Explicit options override the preset's values.
"""

from __future__ import annotations

import argparse

ALL_METHODS = "fpa_free,fpa_walk,fox,softmax_alibi,softmax_rope,softmax_nope"
PRESETS = {
    "quick": dict(task="stack,scope,calls", methods=ALL_METHODS, dims="1,8", ms="4", seeds="0,1,2",
                  steps=400, construct_n=1000),
    "full": dict(task="stack", methods=ALL_METHODS, dims="1,2,4,8,16,32", ms="1,2,4,8,16,32",
                 seeds="0,1,2,3,4", steps=400, construct_n=1000),
}

DEFAULTS = dict(methods=ALL_METHODS, steps=400, construct_n=0)  # without --preset


def _ints(name: str, text: str, minimum: int) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < minimum:
        raise ValueError(f"--{name} must be comma-separated integers >= {minimum}, got {text!r}")
    return vals


def _names(name: str, text: str, allowed) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in vals if v not in allowed]
    if not vals or bad:
        raise ValueError(f"--{name} must be a comma-separated subset of {tuple(allowed)}, got {text!r}")
    return vals


def _resolve(args: argparse.Namespace) -> dict:
    if args.preset is not None and args.preset not in PRESETS:
        raise ValueError(f"--preset must be one of {tuple(PRESETS)}, got {args.preset!r}")
    base = PRESETS[args.preset] if args.preset else DEFAULTS
    out = {}
    for key in ("task", "methods", "dims", "ms", "seeds", "steps", "construct_n"):
        val = getattr(args, key)
        if val is None:
            if key not in base:
                raise ValueError(f"--{key.replace('_', '-')} is required without --preset (or give --preset quick|full)")
            val = base[key]
        out[key] = val
    return out


def _synth(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from fpa.tasks.capacity import TrainConfig, run_grid
    from fpa.tasks.construct import constructive_check
    from fpa.tasks.nested import TASKS
    from fpa.tasks.packed import METHODS
    from fpa.data.atomic import atomic_write_bytes
    from fpa.tasks.report import write_all

    o = _resolve(args)
    tasks = _names("task", o["task"], TASKS)
    methods = _names("methods", o["methods"], METHODS)
    dims = _ints("dims", o["dims"], 1)
    ms = _ints("ms", o["ms"], 1)
    seeds = _ints("seeds", o["seeds"], 0)
    steps = int(o["steps"])
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if args.lr <= 0:
        raise ValueError(f"--lr must be > 0, got {args.lr}")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    cfg = TrainConfig(steps=steps, lr=args.lr)
    records = run_grid(tasks, methods, dims, ms, seeds, cfg, progress=not args.no_progress)
    import dataclasses
    import json

    meta = dict(tasks=tasks, methods=methods, dims=dims, ms=ms, seeds=seeds, preset=args.preset,
                config=dataclasses.asdict(cfg))
    files = write_all(records, out, meta)
    if int(o["construct_n"]) > 0:
        checks = [constructive_check(t, n=int(o["construct_n"])) for t in tasks]
        atomic_write_bytes(out / "constructive.json", json.dumps(checks, indent=1).encode())
        lines = ["# Constructive check (P4): explicit FPA walk head, head dim 1, no training", "",
                 f"{checks[0]['n']} random instances per (m, length) cell; m in "
                 f"{sorted({c['m'] for c in checks[0]['cells']})}, lengths 1x and 4x.", "",
                 "| task | min target mass | accuracy |", "|---|---|---|"]
        lines += [f"| {c['task']} | {c['min_target_mass']:.6f} | {c['accuracy']:.4f} |" for c in checks]
        atomic_write_bytes(out / "constructive.md", ("\n".join(lines) + "\n").encode())
        files += [out / "constructive.json", out / "constructive.md"]
    ok = sum(r["success"] for r in records)
    print(f"{ok}/{len(records)} runs succeeded; wrote " + ", ".join(str(f) for f in files))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("synth", help="nested-structure tasks: capacity experiment and constructive check")
    p.add_argument("--task", help="comma-separated tasks: stack, scope, calls")
    p.add_argument("--methods", help=f"comma-separated subset of {ALL_METHODS}")
    p.add_argument("--dims", help="comma-separated head dimensions d >= 1")
    p.add_argument("--ms", help="comma-separated numbers of live target keys / depths m >= 1")
    p.add_argument("--seeds", help="comma-separated integer seeds")
    p.add_argument("--steps", type=int, help="training steps per run (same for every method)")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (same for every method)")
    p.add_argument("--construct-n", dest="construct_n", type=int,
                   help="instances per cell of the constructive check (0: skip)")
    p.add_argument("--preset", help="quick or full: defaults for every option not given")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=_synth)
