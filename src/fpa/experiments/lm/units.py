"""One run of ``fpa reproduce`` as one unit of work: its training, then every evaluation of the
model it trained, in one worker.

A unit keeps a trained model's life to the unit: when a machine is reclaimed before the run ends,
the stages already recorded (small JSON files) are all a later machine needs, and only the units
in flight are redone. A unit whose stages are partly recorded reruns what is missing if its model
is still on disk; if the model is gone, the whole unit is redone (training included), so that
every stage of a run comes from one model.

The stages of a run, by phase (``unit_plan``):

- "train": ``train-<run>``.
- "control": and, for a core run, ``control-<run>`` (the 1x control as served).
- "tuning": ``train-<run>``, ``validation-<run>``.
- "report": ``train``, then for a core run ``control``, then ``loss``, ``passkey``; a core run of a
  core arm adds ``evict`` and ``growth`` at its frozen threshold; a core FPA walk run (either walk
  arm) adds ``diagnose`` (fpa.experiments.lm.diagnosis; ``{"skipped": why}`` where there is nothing
  to diagnose).
"""

from __future__ import annotations

import time
from pathlib import Path

from fpa.experiments.lm.methods import CORE_ARMS
from fpa.experiments.lm.presets import ReproducePreset
from fpa.experiments.lm.train_eval import model_ready
from fpa.experiments.stages import Stages, read_json

PHASES = ("train", "control", "tuning", "report")

Step = tuple[str, str, float | None]  # (stage name, kind, threshold)


def unit_plan(p: ReproducePreset, run: dict, rid: str, phase: str) -> list[Step]:
    """The stages of run ``run`` (id ``rid``) in ``phase`` (see the module docstring), in order."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    steps: list[Step] = [(f"train-{rid}", "train", None)]
    core = run["role"] == "core"
    if phase == "tuning":
        return [*steps, (f"validation-{rid}", "validation", None)]
    if core and phase in ("control", "report"):
        steps.append((f"control-{rid}", "control", None))
    if phase != "report":
        return steps
    steps += [(f"loss-{rid}", "loss", None), (f"passkey-{rid}", "passkey", None)]
    spec = run["spec"]
    if core and spec.arm in CORE_ARMS:
        threshold = p.thresholds[spec.name]
        steps += [(f"evict-{rid}", "evict", threshold), (f"growth-{rid}", "growth", threshold)]
    if core and spec.base == "fpa-walk":
        steps.append((f"diagnose-{rid}", "diagnose", None))
    return steps


def pending_plan(stages: Stages, plan: list[Step], model_dir: str | Path) -> list[Step]:
    """What of ``plan`` still has to run: nothing when every stage is recorded; the missing stages
    when the model is on disk; else the whole plan, training first."""
    missing = [s for s in plan if not stages.done(s[0])]
    if not missing:
        return []
    if stages.done(plan[0][0]) and model_ready(model_dir):
        return missing
    return plan


def run_unit(
    steps: list[Step], train_cfg: dict, p_dict: dict, model_dir: str, data_dir: str, attention: str, stages_dir: str
) -> dict[str, dict]:
    """Worker entry point: run ``steps`` of one run in order; {stage name: {"output", "seconds"}}.

    A "diagnose" step reads the run's passkey grid from this unit's output or, when it was recorded
    earlier, from ``stages_dir``.
    """
    from fpa.experiments.lm.diagnosis import diagnose_run
    from fpa.experiments.lm.train_eval import eval_stage, train_stage

    out: dict[str, dict] = {}
    for name, kind, threshold in steps:
        t0 = time.perf_counter()
        if kind == "train":
            result = train_stage(train_cfg)
        elif kind == "diagnose":
            passkey = name.replace("diagnose-", "passkey-", 1)
            grid = out[passkey]["output"] if passkey in out else read_json(Path(stages_dir) / f"{passkey}.json")
            result = diagnose_run(model_dir, p_dict, grid)
        else:
            result = eval_stage(kind, p_dict, model_dir, data_dir, attention, threshold)
        out[name] = {"output": result, "seconds": time.perf_counter() - t0}
    return out
