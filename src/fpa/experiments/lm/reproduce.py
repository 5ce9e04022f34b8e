"""``fpa reproduce``: train every configuration of a preset on its seeds, evaluate, report.

Stages (each resumable, fpa.experiments.stages): ``config``, ``data``, then one unit of work per
run (fpa.experiments.lm.units): ``train-<run>`` (the trainer resumes from its own checkpoints),
then every evaluation of the model it trained: in a reported preset ``control-<run>`` for a core
run (the 1x control as served), ``loss-``/``passkey-<run>``, ``evict-``/``growth-<run>`` for the
core arms and ``diagnose-<run>`` for every core FPA walk run (either walk arm); in a tuning preset
``validation-<run>`` (then ``sweep-<run>`` on the selected configurations' models). A model
trained under a threshold rule is scored under it in every stage
(fpa.experiments.lm.train_eval.served_rule). Because a unit evaluates its model before the next
run starts, a run interrupted on one machine resumes on another from the recorded stages alone,
redoing only the units in flight. results.json, report.md and the PNGs are rewritten from the stage
outputs at the end.

The gate: if a core arm passes the 1x control on fewer than ``control_min_pass`` seeds, nothing but
the training and the controls is reported: the evaluations the units made are discarded unread (the
gate is decided by the controls alone); the folder gets a report of the controls, and with
``retry_steps`` the preset is trained again at that many steps, nothing else changed, in the
sibling folder ``<out>-steps<N>``, whose report names the failed attempt. ``jobs`` > 1 runs units
in that many worker processes (fpa.experiments.pool). Under torchrun (WORLD_SIZE > 1) every rank
trains every run first; rank 0 alone evaluates. Every recorded stage carries the commit of the code
that produced it; stages from different commits are refused at aggregation.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from fpa.checks import positive_int
from fpa.compat import hf_progress_bars
from fpa.data.atomic import atomic_write_text
from fpa.experiments.lm.methods import CONTROL, MethodSpec
from fpa.experiments.lm.presets import ReproducePreset
from fpa.experiments.lm.train_eval import eval_stage, train_stage
from fpa.experiments.lm.units import pending_plan, run_unit, unit_plan
from fpa.experiments.provenance import code_state, run_provenance
from fpa.experiments.stages import Stages, read_json
from fpa.train.progress import console_line


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _wait_for(stages: Stages, name: str, poll_s: float = 2.0) -> None:
    """Block until stage ``name`` is recorded in the state file (written by rank 0)."""
    while True:
        if stages.state_path.is_file() and name in read_json(stages.state_path)["done"]:
            return
        time.sleep(poll_s)


def runs_of(p: ReproducePreset, methods: tuple[str, ...] | None = None) -> list[dict]:
    """Every (configuration, seed) run of preset ``p``: {"spec" (MethodSpec), "seed", "role"
    ("core", "context" or "tuning")}; ``methods`` keeps only the named configurations."""
    groups = [("tuning", p.tuning, p.tuning_seeds), ("core", p.core, p.seeds), ("context", p.context, p.context_seeds)]
    known = [s.name for _, specs, _ in groups for s in specs]
    if methods is not None:
        bad = sorted(set(methods) - set(known))
        if bad or not methods:
            raise ValueError(f"methods must name some of {known}, got {list(methods)!r}")
    runs = [
        dict(spec=s, seed=seed, role=role)
        for role, specs, seeds in groups
        for seed in seeds
        for s in specs
        if methods is None or s.name in methods
    ]
    return sorted(runs, key=lambda r: ({"tuning": 0, "core": 0, "context": 1}[r["role"]], r["seed"]))


def run_id(run: dict) -> str:
    """A file-name-safe id of a run: its method spec's name and its seed, e.g. ``fox-bias2-s10``."""
    name = run["spec"].name.replace("[", "-").replace("]", "").replace(",", "-").replace("=", "")
    return f"{name}-s{run['seed']}"


def _train_config(p: ReproducePreset, out: Path, data_dir: Path, run: dict, progress: bool):
    from fpa.train import TrainConfig

    spec: MethodSpec = run["spec"]
    return TrainConfig(
        out_dir=str(out),
        data_dir=str(data_dir),
        preset=p.model_preset,
        attention=spec.attention,
        fpa_mode=spec.fpa_mode,
        model_overrides={**p.model_overrides, **spec.model},
        seq_len=p.train_len,
        batch_size=p.batch_size,
        grad_accum=p.grad_accum,
        steps=p.steps,
        lr=p.lr,
        warmup_steps=p.warmup_steps,
        seed=run["seed"],
        ckpt_every=max(1, p.steps // 4),
        eval_every=p.eval_every or p.steps,
        log_every=max(1, p.steps // 20),
        device=p.device,
        mix_task=p.mix_task,
        mix_rate=p.mix_rate,
        progress=progress,
        tokenizer=p.tokenizer,
        **spec.train,
    )


def _same_config(saved: dict, p: ReproducePreset) -> bool:
    return json.dumps(saved, sort_keys=True) == json.dumps(p.to_dict(), sort_keys=True)


STOP_AFTER = (None, "train", "control")


def reproduce(
    p: ReproducePreset,
    out_dir: str | Path,
    progress: bool = True,
    methods: tuple[str, ...] | None = None,
    log: Callable[[str], None] = console_line,
    jobs: int = 1,
    stop_after: str | None = None,
    command: str | None = None,
    retry_of: dict | None = None,
) -> dict:
    """Run (or resume) every stage of preset ``p`` in ``out_dir``; returns the results dict ({}
    when ``stop_after="train"`` stops it after the training stages; kind "control" when
    ``stop_after="control"`` stops it after the gate, whatever the gate says; kind "gate-failed"
    when the gate stopped it, after the retry if there was one). ``retry_of``: the failed attempt this run
    retrains (set by the gate). ``progress=False``: no progress bars, transformers' included;
    ``log`` prints the ``[stage]`` lines (default: ``tqdm.write``, which keeps a bar intact)."""
    with hf_progress_bars(progress):
        return _reproduce(p, out_dir, progress, methods, log, jobs, stop_after, command, retry_of)


def _reproduce(
    p: ReproducePreset,
    out_dir: str | Path,
    progress: bool,
    methods: tuple[str, ...] | None,
    log: Callable[[str], None],
    jobs: int,
    stop_after: str | None,
    command: str | None,
    retry_of: dict | None,
) -> dict:
    from fpa.data import prepare_corpus
    from fpa.experiments.pool import run_tasks, run_units

    if stop_after not in STOP_AFTER:
        raise ValueError(f"stop_after must be None or one of {STOP_AFTER[1:]}, got {stop_after!r}")
    if stop_after == "control" and (p.is_tuning or not p.core):
        raise ValueError(f"stop_after='control' needs a preset with core arms and a gate; {p.name!r} has none")
    positive_int("jobs", jobs)
    out = Path(out_dir)
    runs = runs_of(p, methods)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and jobs > 1:
        raise ValueError("jobs > 1 is for one machine; under torchrun the ranks already share the training")
    stages = Stages(out, log=log, write=_is_main(), stamp=code_state())
    if _is_main():  # the corpus and the trained models stay out of git; the report and results go in
        atomic_write_text(out / ".gitignore", "data/\nmodels/\n")
    cfg = stages.run("config", p.to_dict)
    if not _same_config({k: v for k, v in cfg.items() if k != "_code"}, p):
        raise ValueError(
            f"out_dir {out} holds a run of another configuration (preset {cfg.get('name')!r}); "
            f"use another --out or delete it"
        )
    data_dir = out / "data"
    if _is_main():
        stages.run("data", lambda: {"data_dir": "data", **_prepare(prepare_corpus, p, data_dir)})
    else:
        _wait_for(stages, "data")
    quiet = progress and jobs == 1
    train_cfg = {run_id(r): _train_config(p, out / "models" / run_id(r), data_dir, r, quiet).to_dict() for r in runs}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or stop_after == "train":  # every rank trains; rank 0 goes on
        trains = [(f"train-{rid}", train_stage, (c,)) for rid, c in train_cfg.items()]
        run_tasks(stages, trains, jobs, progress, "train")
        if not _is_main() or stop_after == "train":
            return {}
    model_dir = {run_id(r): str(out / "models" / run_id(r) / "model") for r in runs}
    p_dict, data = p.to_dict(), str(data_dir)
    phase = "tuning" if p.is_tuning else "control" if stop_after == "control" else "report"
    plans = {run_id(r): unit_plan(p, r, run_id(r), phase) for r in runs}
    units = []
    for r in runs:
        rid = run_id(r)
        steps = pending_plan(stages, plans[rid], model_dir[rid])
        if steps:
            args = (steps, train_cfg[rid], p_dict, model_dir[rid], data, r["spec"].attention, str(out / "stages"))
            units.append((f"{rid}: {', '.join(kind for _, kind, _ in steps)}", run_unit, args))
    run_units(stages, units, jobs, progress, desc="runs")
    outputs = {name: read_json(stages.output_path(name)) for plan in plans.values() for name, _, _ in plan}
    trained = {n: o for n, o in outputs.items() if n.startswith("train-")}

    def task(kind: str, r: dict, threshold: float | None = None):
        args = (kind, p_dict, model_dir[run_id(r)], data, r["spec"].attention, threshold)
        return (f"{kind}-{run_id(r)}", eval_stage, args)

    gate = None
    if not p.is_tuning and any(r["role"] == "core" for r in runs):
        core = [r for r in runs if r["role"] == "core"]
        gate = control_gate(p, core, outputs, run_id)
        if stop_after == "control":  # recorded whatever the gate says; no evaluation, no retrain
            return _gate_results(p, "control", gate, None, None, stages, command)
        if not gate["passed"]:
            kept = ("train-", "control-")
            stages.discard([n for n in outputs if not n.startswith(kept)])  # evaluated with the control, unread
            return _gate_failed(p, out, gate, stages, command, retry_of, methods, log, jobs, progress)
    if p.is_tuning:
        from fpa.experiments.lm.tuning import finish_tuning

        results = finish_tuning(p, runs, trained, outputs, stages, jobs, progress, task, run_id)
    else:
        from fpa.experiments.lm.aggregate import aggregate
        from fpa.experiments.lm.diagnosis import collect_diagnosis

        results = aggregate(p, runs, trained, outputs, run_id, lambda n: stages.stamp_of(n).get("commit"))
        results["diagnosis"] = collect_diagnosis(runs, outputs, run_id)
        results["gate"], results["retry_of"] = gate, retry_of
    results["provenance"] = run_provenance(stages, command)
    from fpa.experiments.lm.report import write_report

    write_report(results, out)
    return results


def control_gate(p: ReproducePreset, core: list[dict], controls: dict, run_id: Callable[[dict], str]) -> dict:
    """The gate after training: per core arm, the seeds whose 1x passkey accuracy (as served) is
    >= CONTROL. {"min_pass", "steps", "passed" (every arm at least min_pass), "by_arm": {arm:
    {"passed", "n", "accuracy_by_seed": {seed: accuracy}}}}."""
    by_arm: dict[str, dict] = {}
    for r in core:
        acc = float(controls[f"control-{run_id(r)}"]["accuracy_by_length"][0])
        arm = by_arm.setdefault(r["spec"].name, {"passed": 0, "n": 0, "accuracy_by_seed": {}})
        arm["n"] += 1
        arm["passed"] += acc >= CONTROL
        arm["accuracy_by_seed"][str(r["seed"])] = acc
    return {
        "min_pass": p.control_min_pass,
        "steps": p.steps,
        "passed": all(a["passed"] >= p.control_min_pass for a in by_arm.values()),
        "by_arm": by_arm,
    }


def gate_summary(gate: dict) -> str:
    """The gate's passes per core arm, e.g. "fpa-walk 6/10, fox 10/10"."""
    return ", ".join(f"{a} {g['passed']}/{g['n']}" for a, g in gate["by_arm"].items())


def _gate_results(p: ReproducePreset, kind: str, gate: dict, retry, retry_of, stages: Stages, command) -> dict:
    """The results of a run that stopped at the gate (``kind`` "control" or "gate-failed"), written
    to results.json and report.md in the run's folder."""
    from fpa.experiments.lm.report import write_report

    results = {
        "kind": kind,
        "preset": p.to_dict(),
        "train_len": p.train_len,
        "gate": gate,
        "retry": retry,
        "retry_of": retry_of,
        "provenance": run_provenance(stages, command),
    }
    write_report(results, stages.dir)
    return results


def _gate_failed(p, out: Path, gate: dict, stages: Stages, command, retry_of, methods, log, jobs, progress):
    """Record the failed gate in ``out`` (results.json and report.md), then retrain at
    ``p.retry_steps`` in the sibling folder (if set) and return that run's results."""
    import dataclasses

    log(
        f"[gate] the 1x control (>= {CONTROL:.0%} at the training length) passed on {gate_summary(gate)} seeds at "
        f"{p.steps} steps; {p.control_min_pass} needed per core arm: nothing but the controls is reported"
    )
    retry = None
    if p.retry_steps is not None:
        retry = {"steps": p.retry_steps, "out": str(out.parent / f"{out.name}-steps{p.retry_steps}")}
    results = _gate_results(p, "gate-failed", gate, retry, retry_of, stages, command)
    if retry is None:
        return results
    log(f"[gate] retraining at {p.retry_steps} steps, nothing else changed, in {retry['out']}")
    again = dataclasses.replace(p, steps=p.retry_steps, retry_steps=None)
    first = {"out": str(out), "steps": p.steps, "gate": gate}
    return reproduce(again, retry["out"], progress, methods, log, jobs, None, command, retry_of=first)


def _prepare(prepare_corpus, p: ReproducePreset, data_dir: Path) -> dict:
    prepare_corpus(p.data_source, data_dir, tokenizer=p.tokenizer, max_bytes=p.corpus_max_bytes, seed=p.seed)
    return {}
