"""A run's unit of work (fpa.experiments.lm.units): which stages it holds, and what a resumed run
redoes when its model is, or is not, on disk."""

import pytest

from fpa.experiments.lm.presets import get_preset
from fpa.experiments.lm.reproduce import run_id, runs_of
from fpa.experiments.lm.units import pending_plan, unit_plan
from fpa.experiments.stages import Stages


def _run(p, name: str, role: str) -> dict:
    return next(r for r in runs_of(p) if r["spec"].name == name and r["role"] == role)


def test_the_stages_of_a_run_by_phase_and_role():
    p = get_preset("smoke")
    walk, context = _run(p, "fpa-walk", "core"), _run(p, "fpa-free", "context")
    kinds = {phase: [k for _, k, _ in unit_plan(p, walk, run_id(walk), phase)] for phase in ("train", "control")}
    assert kinds == {"train": ["train"], "control": ["train", "control"]}
    report = unit_plan(p, walk, run_id(walk), "report")
    assert [k for _, k, _ in report] == ["train", "control", "loss", "passkey", "evict", "growth", "diagnose"]
    assert report[4] == (f"evict-{run_id(walk)}", "evict", p.thresholds["fpa-walk"])
    assert [k for _, k, _ in unit_plan(p, context, run_id(context), "report")] == ["train", "loss", "passkey"]
    fox = _run(p, "fox", "core")
    assert "diagnose" not in [k for _, k, _ in unit_plan(p, fox, run_id(fox), "report")]
    tune = get_preset("smoke-tune")
    r = runs_of(tune)[0]
    assert [k for _, k, _ in unit_plan(tune, r, run_id(r), "tuning")] == ["train", "validation"]
    with pytest.raises(ValueError, match="phase must be one of"):
        unit_plan(p, walk, run_id(walk), "evaluate")


def test_pending_stages_with_and_without_the_model(tmp_path):
    p = get_preset("smoke")
    walk = _run(p, "fpa-walk", "core")
    plan = unit_plan(p, walk, run_id(walk), "report")
    st = Stages(tmp_path, log=lambda m: None)
    model = tmp_path / "model"
    assert pending_plan(st, plan, model) == plan  # nothing done
    for name, _, _ in plan[:3]:
        st.record(name, {}, 0.0)
    assert pending_plan(st, plan, model) == plan  # the model is gone: redo all, training first
    model.mkdir()
    (model / "training.json").write_text("{}")
    assert pending_plan(st, plan, model) == plan[3:]
    for name, _, _ in plan[3:]:
        st.record(name, {}, 0.0)
    assert pending_plan(st, plan, model) == []
    (model / "training.json").unlink()
    assert pending_plan(st, plan, model) == []  # every stage recorded: the model is not needed
