"""``fpa reproduce``: the paper's claims at one preset, from one command (fpa.experiments.reproduce)."""

from __future__ import annotations

from pathlib import Path

from fpa.experiments.presets import PRESETS


def run_reproduce(args) -> int:
    """Run ``fpa reproduce`` from its parsed arguments; returns the exit status."""
    from fpa.experiments.presets import get_preset
    from fpa.experiments.reproduce import reproduce

    preset = get_preset(args.preset)
    if args.data_source:
        import dataclasses

        preset = dataclasses.replace(preset, data_source=args.data_source, corpus_max_bytes=args.max_bytes)
    methods = tuple(args.methods.split(",")) if args.methods else None
    res = reproduce(
        preset, args.out, progress=not args.no_progress, methods=methods, jobs=args.jobs, stop_after=args.stop_after
    )
    if res:
        print(f"wrote {Path(args.out) / 'report.md'} and {Path(args.out) / 'results.json'}")
    return 0


def add_parser(subparsers) -> None:
    """Register the ``fpa reproduce`` subcommand on the top-level parser's ``subparsers``."""
    r = subparsers.add_parser("reproduce", help="train a preset's methods on its seeds, evaluate, write the report")
    r.add_argument(
        "--preset",
        required=True,
        choices=tuple(PRESETS),
        help="what is trained and every budget (fpa.experiments.presets): cpu-tune selects the "
        "configurations that cpu reports",
    )
    r.add_argument("--out", required=True, help="run folder (resumes if it holds an interrupted run)")
    r.add_argument("--methods", help="comma list of the preset's configurations to run (default: all of them)")
    r.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="independent stages to run at once in worker processes (each with cores/jobs threads)",
    )
    r.add_argument(
        "--stop-after",
        choices=("train",),
        default=None,
        help="stop after the training stages (evaluate later, e.g. on another machine)",
    )
    r.add_argument(
        "--data-source",
        help="corpus instead of the preset's (a path, a list file or hf:NAME; "
        "see fpa prepare-data); recorded in the run's config",
    )
    r.add_argument("--max-bytes", type=int, help="with --data-source: cap on the corpus size in bytes")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.set_defaults(func=run_reproduce)
