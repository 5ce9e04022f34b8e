"""``fpa agent``: train the two arms on short agent sessions, check the 1x control, decode long
sessions under every method, write the report.

Stages (resumable, fpa.experiments.stages; every recorded stage carries the commit it ran at):
``config``, ``data`` (the text corpus the trainer needs beside the task samples),
``train-<arm>-s<seed>``, then ``control-<arm>-s<seed>`` with the rules (``decode-fpa-rule-...``,
``decode-fox-rule-...``), then FPA's full cache and the budget baselines on the FPA model
(``decode-<method>-s<seed>-L<length>``, each budget from its rule's decode at that seed and
length). Seeds that fail the control are still decoded (the budget was planned for them) and
reported, flagged; the goal is judged on the seeds where the FPA arm passed. results.json, report.md and the
plot are rewritten from the stage outputs at the end, and after ``stop_after``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fpa.checks import positive_int
from fpa.data.atomic import atomic_write_text
from fpa.experiments.agent.analysis import CONTROL_METHOD, budget_of, decode_name, summarize
from fpa.experiments.agent.preset import ARM_OF, ARMS, BUDGET_METHODS, FPA_ARM, AgentPreset
from fpa.experiments.agent.workers import control_stage, decode_stage, train_arm, train_config
from fpa.experiments.pool import Task, run_tasks
from fpa.experiments.provenance import code_state, run_provenance
from fpa.experiments.stages import Stages, read_json
from fpa.train.progress import console_line

STOP_AFTER = ("train", "control")


def run_agent(
    p: AgentPreset,
    out_dir: str | Path,
    jobs: int = 1,
    progress: bool = True,
    stop_after: str | None = None,
    command: str | None = None,
    log: Callable[[str], None] = console_line,
    arms: tuple[str, ...] = ARMS,
) -> dict:
    """Run (or resume) every stage of preset ``p`` in ``out_dir``, ``jobs`` at a time in worker
    processes; returns the results (as written to results.json). ``arms``: the arms trained and
    controlled (a subset only with ``stop_after``: tuning one arm's recipe; the decodes compare
    both).

    Raises:
        ValueError: A bad ``jobs``, ``stop_after`` or ``arms``, or an ``out_dir`` holding another
            preset's run.
    """
    positive_int("jobs", jobs)
    if stop_after not in (None, *STOP_AFTER):
        raise ValueError(f"stop_after must be None or one of {STOP_AFTER}, got {stop_after!r}")
    if not arms or len(set(arms)) != len(arms) or not set(arms) <= set(ARMS):
        raise ValueError(f"arms must be distinct names from {ARMS}, got {arms!r}")
    if set(arms) != set(ARMS) and stop_after is None:
        raise ValueError(
            f"arms {arms!r}: one arm alone needs stop_after 'train' or 'control' (the long decodes compare both arms)"
        )
    out = Path(out_dir)
    stages = Stages(out, log=log, stamp=code_state())
    atomic_write_text(out / ".gitignore", "data/\nmodels/\n")  # the corpus and models stay out of git
    saved = stages.run("config", p.to_dict)
    if json.dumps(saved, sort_keys=True) != json.dumps(p.to_dict(), sort_keys=True):
        raise ValueError(
            f"--out {out} holds a run of another configuration (preset {saved.get('name')!r}); use another"
        )
    data_dir = out / "data"
    stages.run("data", lambda: _prepare(p, data_dir))
    model_dir = {(a, s): str(out / "models" / f"{a}-s{s}") for a in arms for s in p.seeds}
    quiet = progress and jobs == 1
    train: list[Task] = [
        (f"train-{a}-s{s}", train_arm, (train_config(p, a, s, model_dir[a, s], data_dir, quiet).to_dict(),))
        for s in p.seeds
        for a in arms
    ]
    done = run_tasks(stages, train, jobs, progress, desc="train")
    model = {k: str(Path(v) / "model") for k, v in model_dir.items()}
    pd = p.to_dict()
    if stop_after != "train":
        first: list[Task] = [
            (f"control-{a}-s{s}", control_stage, (pd, model[a, s], CONTROL_METHOD[a])) for a, s in model
        ]
        if stop_after != "control":
            first += [
                (decode_name(m, s, L), decode_stage, (pd, model[ARM_OF[m], s], m, L))
                for L in reversed(p.lengths)
                for s in p.seeds
                for m in ("fpa-rule", "fox-rule")
            ]
        done.update(run_tasks(stages, first, jobs, progress, desc="control, own rules"))
    if stop_after is None:
        second: list[Task] = []
        for L in reversed(p.lengths):  # the longest first: the slowest stages start while others wait
            for s in p.seeds:
                budget = budget_of(done[decode_name("fpa-rule", s, L)])
                second.append((decode_name("fpa-full", s, L), decode_stage, (pd, model[FPA_ARM, s], "fpa-full", L)))
                second += [
                    (decode_name(m, s, L), decode_stage, (pd, model[ARM_OF[m], s], m, L, budget))
                    for m in BUDGET_METHODS
                ]
        done.update(run_tasks(stages, second, jobs, progress, desc="full cache, budgets"))
    return finish(p, out, stages, done, command)


def _prepare(p: AgentPreset, data_dir: Path) -> dict:
    from fpa.data import prepare_corpus

    # a tenth held out: the smoke's small corpus has ~10 documents, and 5% of them would leave none
    prepare_corpus(p.data_source, data_dir, tokenizer="byte", max_bytes=p.corpus_max_bytes, seed=0, val_fraction=0.1)
    return {"data_dir": "data"}


def finish(p: AgentPreset, out: Path, stages: Stages, done: dict, command: str | None) -> dict:
    """Summarise the stages present (``done`` and any other recorded one), add the training
    records and provenance, and write results.json, report.md and the plot."""
    from fpa.experiments.agent.report import write_report
    from fpa.experiments.stages import write_json

    for name in stages.state["done"]:
        if name not in done and stages.done(name) and name not in ("config", "data"):
            done[name] = read_json(stages.output_path(name))
    results = {"preset": p.to_dict(), **summarize(p, done)}
    results["training"] = {
        a: {str(s): _training(done[n]) for s in p.seeds if (n := f"train-{a}-s{s}") in done} for a in ARMS
    }
    results["budgets"] = {
        str(s): {str(L): done[n]["budget"] for L in p.lengths if (n := decode_name("window", s, L)) in done}
        for s in p.seeds
    }
    results["provenance"] = {**run_provenance(stages, command), "stage_seconds": stages.seconds()}
    write_json(out / "results.json", results)
    write_report(results, out)
    return results


def _training(summary: dict) -> dict:
    keep = ("steps", "final_train_loss", "tokens_per_s", "task_loss_curve")
    return {k: summary.get(k) for k in keep}
