"""run_grid / train_cell: argument checks, determinism, record contents."""

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
