"""``fpa reproduce``: the paper's claims at one preset, from one command (fpa.experiments.lm.reproduce)."""

from __future__ import annotations

from pathlib import Path

from fpa.experiments.lm.presets import PRESETS, ReproducePreset

# Measured in the committed tuning run (results/tune-cpu; 2 AMD EPYC cores without AVX-512, `--jobs
# 2`): 457-499 s per 1500-step plain run, the rule-trained runs 524-587 s with the rule on for the
# last 500 steps; an earlier machine trained at half these times. Evaluation: 30-37 s for a
# validation stage, 128-136 s for a threshold sweep; a reported core run's stages (control, loss,
# passkey, evict with its window, growth, diagnose) are guessed at about 2 minutes.
SECONDS_PER_STEP = 0.32  # one model, one core (`--jobs 2` on 2 cores), evaluations during training included
EVAL_SECONDS_PER_RUN = 120.0  # a run's evaluation stages at the CPU recipe (one core)
RULE_STEP_FACTOR = 1.35  # a step under the rule / a plain step, in the same run


def estimate_minutes(p: ReproducePreset, jobs: int = 2) -> float:
    """Rough wall time of preset ``p`` on a CPU with ``jobs`` cores, ``--jobs jobs``: every run's
    training (SECONDS_PER_STEP per step and model; steps under a training rule RULE_STEP_FACTOR
    times that) and its evaluation stages (EVAL_SECONDS_PER_RUN), ``jobs`` at a time. CPU presets
    only (the 110m preset runs on a GPU)."""
    groups = ((p.tuning, p.tuning_seeds), (p.core, p.seeds), (p.context, p.context_seeds))
    runs = [s for specs, seeds in groups for s in specs for _ in seeds]
    train = 0.0
    for s in runs:
        under_rule = p.steps - min(p.steps, s.train.get("evict_from_step", 0)) if s.training_threshold else 0
        train += SECONDS_PER_STEP * (p.steps + (RULE_STEP_FACTOR - 1.0) * under_rule)
    return (train + EVAL_SECONDS_PER_RUN * len(runs)) / jobs / 60


def customise(preset, seeds: str | None = None, selection: str | None = None):
    """The preset with ``--seeds`` (the reported seeds; the gate's ``control_min_pass`` scaled to
    the same share of them) and ``--selection`` (core arms and thresholds from a tuning run's
    folder or tuning.json) applied; checked before any work.

    Raises:
        ValueError: Bad seeds, seeds overlapping the tuning seeds, a preset without reported seeds,
            or a selection that is not a tuning run's output.
    """
    import dataclasses
    import math

    from fpa.cli import seed_list
    from fpa.experiments.lm.grid import load_selection, selected_specs
    from fpa.experiments.lm.presets import PRESETS

    if seeds is not None:
        new = seed_list(seeds)
        if preset.is_tuning:
            raise ValueError(f"--seeds: preset {preset.name!r} is a tuning preset (its tuning seeds are fixed)")
        tuning = set(preset.tuning_seeds) | set(PRESETS["cpu-tune"].tuning_seeds)
        if set(new) & tuning:
            raise ValueError(
                f"--seeds {seeds}: seeds {sorted(set(new) & tuning)} are tuning seeds {sorted(tuning)}; the "
                "reported seeds must be others (the configurations were chosen on the tuning seeds)"
            )
        if preset.core:
            need = math.ceil(preset.control_min_pass / len(preset.seeds) * len(new))
            preset = dataclasses.replace(preset, seeds=new, control_min_pass=need)
        else:
            preset = dataclasses.replace(preset, context_seeds=new)
    if selection is not None:
        if not preset.core:
            raise ValueError(f"--selection: preset {preset.name!r} has no core arms to select")
        core, thresholds = selected_specs(load_selection(selection))
        source = str(Path(selection).parent if Path(selection).is_file() else Path(selection))
        preset = dataclasses.replace(
            preset, core=core, thresholds=thresholds, tuning_source=source, selection_pending=False
        )
    elif preset.selection_pending:
        raise ValueError(
            f"--selection: preset {preset.name!r} has no frozen selection yet (its tuning grid changed after "
            f"the tuning run {preset.tuning_source}); run `fpa reproduce --preset cpu-tune --out DIR` and pass "
            "--selection DIR"
        )
    return preset


def run_reproduce(args) -> int:
    """Run ``fpa reproduce`` from its parsed arguments; returns the exit status (1 when the 1x
    control gate stopped the run)."""
    from fpa.experiments.lm.corpus_budget import check_corpus_budget
    from fpa.experiments.lm.presets import get_preset
    from fpa.experiments.lm.reproduce import gate_summary, reproduce

    preset = customise(get_preset(args.preset), args.seeds, args.selection)
    check_corpus_budget(preset, args.data_source, args.max_bytes)  # before any device check or stage
    if args.data_source:
        import dataclasses

        preset = dataclasses.replace(preset, data_source=args.data_source, corpus_max_bytes=args.max_bytes)
    methods = tuple(args.methods.split(",")) if args.methods else None
    res = reproduce(
        preset, args.out, progress=not args.no_progress, methods=methods, jobs=args.jobs, stop_after=args.stop_after
    )
    if res.get("kind") == "control":
        print(f"1x control passed on {gate_summary(res['gate'])} seeds (see {Path(args.out) / 'report.md'})")
        return 0 if res["gate"]["passed"] else 1
    if res.get("kind") == "gate-failed":
        print(f"stopped by the 1x control gate: see {Path(args.out) / 'report.md'}")
        return 1
    if res:
        print(f"wrote the report and results.json (report: {Path(args.out) / 'report.md'})")
    return 0


def times_text() -> str:
    """The expected wall time of each CPU preset with ``--jobs 2`` on 2 cores (``estimate_minutes``)."""
    rows = [
        f"  {n}: ~{estimate_minutes(p):.0f} min" if not n.startswith("smoke") else f"  {n}: ~1-2 min"
        for n, p in PRESETS.items()
        if p.device == "cpu"
    ]
    return (
        "expected wall time with --jobs 2 on 2 CPU cores (the committed tuning run's ~0.32 s per step\n"
        "and model, one core each, plus ~2 min of evaluation per model; a retrain after a failed gate\n"
        "adds the preset's time again at the retry's steps):\n"
        + "\n".join(rows)
        + "\n  110m: GPU node (docs/reproduce.md)"
    )


def add_parser(subparsers) -> None:
    """Register the ``fpa reproduce`` subcommand on the top-level parser's ``subparsers``."""
    import argparse

    r = subparsers.add_parser(
        "reproduce",
        help="train a preset's methods on its seeds, evaluate, write the report",
        epilog=times_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument(
        "--preset",
        required=True,
        choices=tuple(PRESETS),
        help="what is trained and every budget (fpa.experiments.lm.presets): cpu-tune selects the "
        "configurations that cpu reports",
    )
    r.add_argument("--out", required=True, help="run folder (resumes if it holds an interrupted run)")
    r.add_argument("--methods", help="comma list of the preset's configurations to run (default: all of them)")
    r.add_argument(
        "--seeds",
        help="comma list of reported seeds instead of the preset's (not the tuning seeds 0-2); the gate needs "
        "the same share of them to pass",
    )
    r.add_argument(
        "--selection",
        help="a tuning run's folder (or its tuning.json): report its selected configurations and thresholds "
        "instead of the ones frozen in the preset",
    )
    r.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="independent stages to run at once in worker processes (each with cores/jobs threads)",
    )
    r.add_argument(
        "--stop-after",
        choices=("train", "control"),
        default=None,
        help="stop after the training stages (evaluate later, e.g. on another machine), or after the 1x "
        "control gate (a recipe's control checked on many seeds; exit status 1 if it failed)",
    )
    r.add_argument(
        "--data-source",
        help="corpus instead of the preset's (a path, a list file or hf:NAME; "
        "see fpa prepare-data); recorded in the run's config",
    )
    r.add_argument("--max-bytes", type=int, help="with --data-source: cap on the corpus size in bytes")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.set_defaults(func=run_reproduce)
