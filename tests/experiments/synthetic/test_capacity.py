"""run_grid / train_cell: argument checks, determinism, record contents."""

import numpy as np
import pytest

from fpa.experiments.synthetic.capacity import SynthRecipe, run_grid, train_cell

TINY = SynthRecipe(steps=2, batch=4, eval_n=8, log_every=1)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(tasks=["dyck"]), "task must be one of"),
        (dict(methods=["softmax"]), "method must be one of"),
        (dict(dims=[0]), "dims must be"),
        (dict(ms=[]), "ms must be"),
        (dict(seeds=[]), "seeds must be"),
    ],
)
def test_run_grid_rejects_bad_arguments(kw, match):
    args = dict(tasks=["stack"], methods=["fox"], dims=[1], ms=[2], seeds=[0])
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        run_grid(**args, cfg=TINY, progress=False)


def test_train_cell_is_deterministic_and_complete():
    a = train_cell("calls", "fpa-walk", 2, 3, (0, 1), TINY)
    b = train_cell("calls", "fpa-walk", 2, 3, (0, 1), TINY)
    assert [r["target_mass"] for r in a] == [r["target_mass"] for r in b]
    assert [r["seed"] for r in a] == [0, 1]
    for r in a:
        assert set(r["per_length"]) == {"1x", "4x"}
        assert r["target_mass"] == min(v["target_mass"] for v in r["per_length"].values())
        assert len(r["curve"]) == TINY.steps


def test_lr_schedule_warmup_cosine_and_constant():
    from fpa.experiments.synthetic.capacity import lr_factor

    cos = SynthRecipe(steps=100, warmup=10)
    assert lr_factor(cos, 0) == pytest.approx(0.1) and lr_factor(cos, 9) == pytest.approx(1.0)
    assert lr_factor(cos, 10) == pytest.approx(1.0) and lr_factor(cos, 55) == pytest.approx(0.5)
    assert lr_factor(cos, 99) < 0.01
    const = SynthRecipe(steps=100, warmup=0, schedule="constant")
    assert {lr_factor(const, s) for s in (0, 50, 99)} == {1.0}
    with pytest.raises(ValueError, match="schedule must be"):
        lr_factor(SynthRecipe(schedule="linear", warmup=0), 5)


@pytest.mark.parametrize("recipe", ["dense", "legacy"])
def test_both_recipes_train(recipe):
    """The dense loss (default) and the legacy final-query loss both run and lower the loss."""
    from fpa.experiments.synthetic.capacity import RECIPES

    cfg = SynthRecipe(
        **{**RECIPES[recipe], "steps": 30, "batch": 8, "warmup": min(5, RECIPES[recipe]["warmup"])},
        eval_n=8,
        log_every=1,
    )
    r = train_cell("stack", "fpa-walk", 2, 2, (0,), cfg)[0]
    assert r["config"]["dense"] == (recipe == "dense")
    assert np.mean(r["curve"][-5:]) < np.mean(r["curve"][:5])


def test_length_curriculum_trains_every_kth_step_on_longer_sequences(monkeypatch):
    """long_every=2: steps 1, 3, ... see batches at long_factor x the length; the others at 1x."""
    import fpa.experiments.synthetic.capacity as capacity

    seen = []
    real = capacity._tensors
    monkeypatch.setattr(capacity, "_tensors", lambda b, sl: (seen.append(b.tokens.shape[-1]), real(b, sl))[1])
    cfg = SynthRecipe(steps=6, batch=4, eval_n=4, log_every=1, long_every=2, long_factor=3)
    r = train_cell("stack", "fpa-walk", 2, 2, (0,), cfg)[0]
    from fpa.tasks.nested import get_task

    long = get_task("stack").sample(np.random.default_rng(0), 1, 2, 3).tokens.shape[-1]
    assert long > 2 * r["train_length"]
    assert seen[:6] == [r["train_length"], long] * 3  # then the evaluations
    with pytest.raises(ValueError, match="long_every"):
        SynthRecipe(long_every=-1)
    with pytest.raises(ValueError, match="train_long"):
        train_cell("stack", "fpa-walk", 2, 2, (0,), cfg, capacity.make_cell_data("stack", 2, (0,), TINY))


def test_train_cell_trains_the_field_heads_at_their_lr_multiplier(monkeypatch):
    """layer_kwargs field_lr_multiplier=0.1: the walk's increment head, beta and level offset train
    at 0.1x the rate of the other parameters, as in `fpa train` (fpa.train.parameter_groups)."""
    import torch

    made = []
    real = torch.optim.Adam
    monkeypatch.setattr(torch.optim, "Adam", lambda groups, lr: (made.append((groups, lr)), real(groups, lr=lr))[1])
    cfg = SynthRecipe(steps=1, batch=2, eval_n=2, log_every=1, lr=0.02)
    train_cell("stack", "fpa-walk", 2, 2, (0, 1), cfg, layer_kwargs={"field_lr_multiplier": 0.1})
    ((groups, lr),) = made
    rates = sorted(g["initial_lr"] for g in groups)  # the scheduler scales "lr" from these
    assert lr == 0.02 and rates[0] == pytest.approx(0.002) and rates[-1] == pytest.approx(0.02)
    slow = [p for g in groups if g["initial_lr"] == pytest.approx(0.002) for p in g["params"]]
    assert sum(p.numel() for p in slow) > 0 and all(p.dim() <= 2 for p in slow)
