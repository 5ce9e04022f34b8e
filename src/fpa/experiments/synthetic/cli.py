"""``fpa synth``: the capacity experiment on the nested-structure tasks, and the constructive check.

    fpa synth --task stack --methods fpa-walk,fox --dims 1,4 --ms 4,16 --seeds 0,1,2,3,4 --out DIR
    fpa synth --preset quick --out DIR       # every task, a small slice (<= 5 minutes on 2 cores)
    fpa synth --preset full --out DIR        # the full grid

Writes DIR/results.json.gz (meta + one record per run; compact JSON, gzip), results.md, heatmap_<task>.png,
curves_<task>.png and constructive.json / constructive.md (P4 by construction, no training).
Explicit options override the preset's values. ``--recipe curriculum`` (default), ``dense`` or
``legacy`` picks the training recipe, the same for every method (see ``fpa.experiments.synthetic.capacity.RECIPES``).
"""

from __future__ import annotations

import argparse

from fpa.checks import check_number, non_negative_int, positive_int

ALL_METHODS = "fpa-free,fpa-walk,fox,softmax-alibi,softmax-rope,softmax-nope"
PRESETS = {
    "quick": dict(task="stack,scope,calls", methods=ALL_METHODS, dims="1,8", ms="4", seeds="0,1,2", construct_n=1000),
    "full": dict(
        task="stack,scope,calls",
        methods=ALL_METHODS,
        dims="1,2,4,8,16,32",
        ms="1,2,4,8,16,32",
        seeds="0,1,2,3,4",
        construct_n=1000,
    ),
}

DEFAULTS = dict(methods=ALL_METHODS, construct_n=0)  # without --preset


def _ints(name: str, text: str, minimum: int) -> list[int]:
    """Comma-separated integers and inclusive ranges: "0,1,2", "0-4", "10-14,20"."""
    vals: list[int] = []
    try:
        for part in (v.strip() for v in text.split(",")):
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            if sep and lo:
                if int(hi) < int(lo):
                    raise ValueError
                vals += range(int(lo), int(hi) + 1)
            else:
                vals.append(int(part))
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated integers or ranges a-b (a <= b), got {text!r}") from None
    if not vals or min(vals) < minimum:
        raise ValueError(f"--{name} must be comma-separated integers or ranges a-b, each >= {minimum}, got {text!r}")
    if len(set(vals)) != len(vals):
        raise ValueError(f"--{name} lists a value twice: {text!r}")
    return vals


def _names(name: str, text: str, allowed) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in vals if v not in allowed]
    if not vals or bad:
        raise ValueError(f"--{name} must be a comma-separated subset of {tuple(allowed)}, got {text!r}")
    return vals


def _fpa_kwargs(text: str | None, methods: list[str]) -> dict | None:
    """--fpa-kwargs: a JSON object of FPAOptions fields (``level_offset``, ``level_offset_init``,
    ...; what ``fpa train --model-overrides '{"fpa": {...}}'`` takes) for the FPA methods, checked
    on each FPA method's options before any training."""
    if text is None:
        return None
    import json

    from fpa.models.packed import method_options

    try:
        kw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--fpa-kwargs must be a JSON object, got {text!r} ({e.msg})") from None
    if not isinstance(kw, dict):
        raise ValueError(f"--fpa-kwargs must be a JSON object, got {text!r}")
    fpa = [m for m in methods if m.startswith("fpa")]
    if not fpa:
        raise ValueError(f"--fpa-kwargs needs an FPA method in --methods, got {methods}")
    for m in fpa:
        try:
            method_options(m, kw)
        except (TypeError, ValueError) as e:
            raise ValueError(f"--fpa-kwargs: {e}") from None
    return kw


def _resolve(args: argparse.Namespace) -> dict:
    if args.preset is not None and args.preset not in PRESETS:
        raise ValueError(f"--preset must be one of {tuple(PRESETS)}, got {args.preset!r}")
    base = PRESETS[args.preset] if args.preset else DEFAULTS
    out = {}
    for key in ("task", "methods", "dims", "ms", "seeds", "construct_n"):
        val = getattr(args, key)
        if val is None:
            if key not in base:
                raise ValueError(
                    f"--{key.replace('_', '-')} is required without --preset (or give --preset quick|full)"
                )
            val = base[key]
        out[key] = val
    return out


def _synth(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from fpa.experiments.synthetic.capacity import RECIPES
    from fpa.models.packed import METHODS
    from fpa.tasks.nested import TASKS

    if args.merge:
        return _merge(args)
    o = _resolve(args)
    tasks = _names("task", o["task"], TASKS)
    for m in o["methods"].split(","):
        if m.strip() and m.strip() not in METHODS and m.strip().replace("_", "-") in METHODS:
            raise ValueError(
                f"--methods must be a comma-separated subset of {tuple(METHODS)}, got {m.strip()!r} "
                f"(did you mean {m.strip().replace('_', '-')!r}?)"
            )
    methods = _names("methods", o["methods"], METHODS)
    dims = _ints("dims", o["dims"], 1)
    ms = _ints("ms", o["ms"], 1)
    seeds = _ints("seeds", o["seeds"], 0)
    non_negative_int("--construct-n", o["construct_n"], "0: skip the constructive check")
    positive_int("--threads", args.threads)
    from fpa.cli import writable_dir

    writable_dir(args.out, "--out")
    if args.recipe not in RECIPES:
        raise ValueError(f"--recipe must be one of {tuple(RECIPES)}, got {args.recipe!r}")
    recipe = dict(RECIPES[args.recipe])
    for key in ("steps", "batch", "lr"):
        if getattr(args, key) is not None:
            recipe[key] = getattr(args, key)
    positive_int("--steps", recipe["steps"])
    positive_int("--batch", recipe["batch"])
    check_number("--lr", recipe["lr"], low=0, low_open=True)
    o["fpa_kwargs"] = _fpa_kwargs(args.fpa_kwargs, methods)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    created = not out.exists()
    try:
        return _run(args, o, tasks, methods, dims, ms, seeds, recipe, out)
    except BaseException:
        if created:  # a failed run leaves no half-written output folder
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        raise


def _run(args, o, tasks, methods, dims, ms, seeds, recipe, out) -> int:
    import dataclasses
    import json

    from fpa.data.atomic import atomic_write_bytes
    from fpa.experiments.synthetic.capacity import SynthRecipe, run_grid
    from fpa.experiments.synthetic.report import write_all
    from fpa.models.packed import method_options
    from fpa.tasks.construct import constructive_check

    cfg = SynthRecipe(**recipe)
    fkw = o["fpa_kwargs"]
    records = run_grid(
        tasks,
        methods,
        dims,
        ms,
        seeds,
        cfg,
        progress=not args.no_progress,
        fpa_kwargs=fkw,
    )
    meta = dict(
        tasks=tasks,
        methods=methods,
        dims=dims,
        ms=ms,
        seeds=seeds,
        preset=args.preset,
        recipe=args.recipe,
        config=dataclasses.asdict(cfg),
        fpa_kwargs=fkw,
        fpa_options={m: method_options(m, fkw).to_dict() for m in methods if m.startswith("fpa")},
    )
    files = write_all(records, out, meta)
    if int(o["construct_n"]) > 0:
        checks = [constructive_check(t, n=int(o["construct_n"])) for t in tasks]
        atomic_write_bytes(out / "constructive.json", json.dumps(checks, indent=1).encode())
        lines = [
            "# Constructive check (P4): explicit FPA walk head, head dim 1, no training",
            "",
            f"{checks[0]['n']} random instances per (m, length) cell; m in "
            f"{sorted({c['m'] for c in checks[0]['cells']})}, lengths 1x and 4x.",
            "",
            "| task | min target mass | accuracy |",
            "|---|---|---|",
        ]
        lines += [f"| {c['task']} | {c['min_target_mass']:.6f} | {c['accuracy']:.4f} |" for c in checks]
        atomic_write_bytes(out / "constructive.md", ("\n".join(lines) + "\n").encode())
        files += [out / "constructive.json", out / "constructive.md"]
    ok = sum(r["success"] for r in records)
    print(f"{ok}/{len(records)} runs succeeded; wrote " + ", ".join(str(f) for f in files))
    return 0


def _merge(args: argparse.Namespace) -> int:
    """Write the records of several run folders (a grid split across processes) as one run."""
    from pathlib import Path

    from fpa.cli import writable_dir
    from fpa.experiments.synthetic.report import read_results, results_path, write_all

    dirs = [Path(d.strip()) for d in args.merge.split(",") if d.strip()]
    missing = [str(d) for d in dirs if results_path(d) is None]
    if not dirs or missing:
        raise ValueError(
            f"--merge must list run folders that hold results.json.gz (or results.json); "
            f"missing: {missing or args.merge!r}"
        )
    writable_dir(args.out, "--out")
    runs = [read_results(d) for d in dirs]
    records = [r for run in runs for r in run["records"]]
    seen = {(r["task"], r["method"], r["dim"], r["m"], r["seed"]) for r in records}
    if len(seen) != len(records):
        raise ValueError("--merge: the folders hold the same (task, method, d, m, seed) run twice")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    cwd = Path.cwd().resolve()  # record folders under the working directory relative to it
    meta = dict(
        merged_from=[str(d.resolve().relative_to(cwd)) if d.resolve().is_relative_to(cwd) else str(d) for d in dirs],
        parts=[run["meta"] for run in runs],
    )
    files = write_all(records, Path(args.out), meta)
    print(f"merged {len(records)} runs from {len(dirs)} folders; wrote " + ", ".join(str(f) for f in files))
    return 0


def add_parser(sub) -> None:
    """Register the ``fpa synth`` subcommand on the top-level parser's subparsers ``sub``."""
    p = sub.add_parser("synth", help="nested-structure tasks: capacity experiment and constructive check")
    p.add_argument("--task", help="comma-separated tasks: stack, scope, calls")
    p.add_argument("--methods", help=f"comma-separated subset of {ALL_METHODS}")
    p.add_argument("--dims", help="comma-separated head dimensions d >= 1")
    p.add_argument("--ms", help="comma-separated numbers of live target keys / depths m >= 1")
    p.add_argument("--seeds", help="integer seeds >= 0: a comma list and/or ranges, e.g. 0-4 or 10-14,20")
    p.add_argument(
        "--recipe",
        default="curriculum",
        choices=("curriculum", "dense", "legacy"),
        help="training recipe, the same for every method: curriculum (default: loss at every "
        "position with a defined answer, 2400 x 16, every 4th batch at 2x the training length, "
        "lr 3e-2, warm-up + cosine, per-model clip 1), dense (the same at 1600 steps, every "
        "batch at 1x) or legacy (final-query loss, 400 x 32, constant lr 1e-2)",
    )
    p.add_argument("--steps", type=int, help="training steps per run (default: the recipe's)")
    p.add_argument("--batch", type=int, help="sequences per step and seed (default: the recipe's)")
    p.add_argument("--lr", type=float, help="peak Adam learning rate (default: the recipe's)")
    p.add_argument(
        "--construct-n",
        dest="construct_n",
        type=int,
        help="instances per cell of the constructive check, >= 0 (0: skip)",
    )
    p.add_argument("--preset", choices=tuple(PRESETS), help="defaults for every option not given")
    p.add_argument("--threads", type=int, default=1, help="torch threads (>= 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--fpa-kwargs",
        help="JSON object of FPAOptions fields for the FPA methods (variants), e.g. "
        '\'{"level_offset_init": 2.0}\' or \'{"level_offset": "none"}\' (docs/fpa.md, "Options"); '
        "recorded in results.json.gz",
    )
    p.add_argument("--merge", help="comma list of run folders: write their records together to --out, no training")
    p.add_argument("--out", required=True, help="output folder (removed again if this run made it and fails)")
    p.set_defaults(func=_synth)
