"""run_grid / train_cell: argument checks, determinism, record contents."""

import numpy as np
import pytest

from fpa.tasks.capacity import TrainConfig, run_grid, train_cell

TINY = TrainConfig(steps=2, batch=4, eval_n=8, log_every=1)


@pytest.mark.parametrize("kw,match", [
    (dict(tasks=["dyck"]), "task must be one of"),
    (dict(methods=["softmax"]), "method must be one of"),
    (dict(dims=[0]), "dims must be"),
    (dict(ms=[]), "ms must be"),
    (dict(seeds=[]), "seeds must be"),
])
def test_run_grid_rejects_bad_arguments(kw, match):
    args = dict(tasks=["stack"], methods=["fox"], dims=[1], ms=[2], seeds=[0])
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        run_grid(**args, cfg=TINY, progress=False)


def test_train_cell_is_deterministic_and_complete():
    a = train_cell("calls", "fpa_walk", 2, 3, (0, 1), TINY)
    b = train_cell("calls", "fpa_walk", 2, 3, (0, 1), TINY)
    assert [r["target_mass"] for r in a] == [r["target_mass"] for r in b]
    assert [r["seed"] for r in a] == [0, 1]
    for r in a:
        assert set(r["per_length"]) == {"1x", "4x"}
        assert r["target_mass"] == min(v["target_mass"] for v in r["per_length"].values())
        assert len(r["curve"]) == TINY.steps


def test_lr_schedule_warmup_cosine_and_constant():
    from fpa.tasks.capacity import lr_factor

    cos = TrainConfig(steps=100, warmup=10)
    assert lr_factor(cos, 0) == pytest.approx(0.1) and lr_factor(cos, 9) == pytest.approx(1.0)
    assert lr_factor(cos, 10) == pytest.approx(1.0) and lr_factor(cos, 55) == pytest.approx(0.5)
    assert lr_factor(cos, 99) < 0.01
    const = TrainConfig(steps=100, warmup=0, schedule="constant")
    assert {lr_factor(const, s) for s in (0, 50, 99)} == {1.0}
    with pytest.raises(ValueError, match="schedule must be"):
        lr_factor(TrainConfig(schedule="linear", warmup=0), 5)


@pytest.mark.parametrize("recipe", ["dense", "legacy"])
def test_both_recipes_train(recipe):
    """The dense loss (default) and the legacy final-query loss both run and lower the loss."""
    from fpa.tasks.capacity import RECIPES

    cfg = TrainConfig(**{**RECIPES[recipe], "steps": 30, "batch": 8, "warmup": min(5, RECIPES[recipe]["warmup"])},
                      eval_n=8, log_every=1)
    r = train_cell("stack", "fpa_walk", 2, 2, (0,), cfg)[0]
    assert r["config"]["dense"] == (recipe == "dense")
    assert np.mean(r["curve"][-5:]) < np.mean(r["curve"][:5])
