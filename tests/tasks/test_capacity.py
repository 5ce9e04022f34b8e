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


def test_length_curriculum_trains_every_kth_step_on_longer_sequences(monkeypatch):
    """long_every=2: steps 1, 3, ... see batches at long_factor x the length; the others at 1x."""
    import fpa.tasks.capacity as capacity

    seen = []
    real = capacity._tensors
    monkeypatch.setattr(capacity, "_tensors", lambda b, sl: (seen.append(b.tokens.shape[-1]), real(b, sl))[1])
    cfg = TrainConfig(steps=6, batch=4, eval_n=4, log_every=1, long_every=2, long_factor=3)
    r = train_cell("stack", "fpa_walk", 2, 2, (0,), cfg)[0]
    from fpa.tasks.nested import get_task

    long = get_task("stack").sample(np.random.default_rng(0), 1, 2, 3).tokens.shape[-1]
    assert long > 2 * r["train_length"]
    assert seen[:6] == [r["train_length"], long] * 3  # then the evaluations
    with pytest.raises(ValueError, match="long_every"):
        TrainConfig(long_every=-1)
    with pytest.raises(ValueError, match="train_long"):
        train_cell("stack", "fpa_walk", 2, 2, (0,), cfg, capacity.make_cell_data("stack", 2, (0,), TINY))
