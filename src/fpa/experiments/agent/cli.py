"""``fpa agent``: language models on agent sessions, long sessions decoded with the evicting cache
(fpa.experiments.agent.pipeline)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fpa.experiments.agent.preset import ARMS, PRESETS, estimate_minutes


def times_text() -> str:
    """The expected wall time of each preset with ``--jobs 2`` on 2 idle CPU cores."""
    rows = []
    for name, p in PRESETS.items():
        m = estimate_minutes(p, jobs=2)
        rows.append(f"  {name}: {'< 1' if m < 1 else f'~{m:.0f}'} min")
    return (
        "expected wall time with --jobs 2 on 2 idle CPU cores (estimate_minutes, from the per-step and\n"
        "per-token times of fpa.experiments.agent.preset.RATES and PER_TOKEN; it assumes FPA's rule\n"
        "holds a bounded number of keys, else its decodes and the equal-memory baselines cost more):\n"
        + "\n".join(rows)
    )


def run(args) -> int:
    """Run ``fpa agent`` from its parsed arguments; returns the exit status."""
    from fpa.checks import positive_int
    from fpa.cli import seed_list, writable_dir
    from fpa.experiments.agent.pipeline import run_agent
    from fpa.experiments.agent.preset import get_preset

    p = get_preset(args.preset)
    if args.seeds is not None:
        p = dataclasses.replace(p, seeds=seed_list(args.seeds))
    positive_int("--jobs", args.jobs)
    arms = ARMS if args.arms is None else tuple(a.strip() for a in args.arms.split(","))
    bad = [a for a in arms if a not in ARMS]
    if bad or len(set(arms)) != len(arms):
        raise ValueError(f"--arms must be a comma list of distinct arms from {ARMS}, got {args.arms!r}")
    if set(arms) != set(ARMS) and args.stop_after is None:
        raise ValueError("--arms with one arm needs --stop-after train or control (the long decodes compare both arms)")
    out = writable_dir(args.out, "--out")
    run_agent(p, out, jobs=args.jobs, progress=not args.no_progress, stop_after=args.stop_after, arms=arms)
    print(f"wrote {Path(out) / 'report.md'} and results.json")
    return 0


def add_parser(subparsers) -> None:
    """Register the ``fpa agent`` subcommand on the top-level parser's ``subparsers``."""
    import argparse

    from fpa.experiments.agent.pipeline import STOP_AFTER

    r = subparsers.add_parser(
        "agent",
        help="train LMs on short agent sessions, decode long ones with the evicting cache, write the report",
        epilog=times_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--preset", required=True, choices=tuple(PRESETS), help="what is trained and every budget")
    r.add_argument("--out", required=True, help="run folder (resumes if it holds an interrupted run)")
    r.add_argument("--seeds", help="comma list of model seeds instead of the preset's")
    r.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="independent stages to run at once in worker processes (each with cores/jobs threads)",
    )
    r.add_argument(
        "--stop-after",
        choices=STOP_AFTER,
        default=None,
        help="stop after the training stages, or after the 1x controls (the report covers what ran)",
    )
    r.add_argument(
        "--arms",
        help=f"comma list of the arms to train and control (default: both, {','.join(ARMS)}); one arm "
        "alone needs --stop-after (tuning one arm's recipe)",
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.set_defaults(func=run)
