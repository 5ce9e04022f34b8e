"""P4 by construction: the explicit head-dimension-1 FPA head covers the target set."""

import pytest

from fpa.tasks.construct import constructive_check
from fpa.tasks.nested import get_task


@pytest.mark.parametrize("task,n", [("stack", 1000), ("scope", 300), ("calls", 300)])
def test_constructed_head_reaches_bound(task, n):
    r = constructive_check(task, n=n, ms=(1, 8, 32), length_factors=(1, 4))
    assert r["head_dim"] == 1
    assert r["min_target_mass"] >= 0.99
    assert r["accuracy"] == 1.0
    assert max(c["T"] for c in r["cells"]) >= 4 * get_task(task).length(32) - 2  # 4x the training length


def test_without_the_penalty_it_fails(monkeypatch):
    """beta ~ 0: popped keys stay in the softmax, so the same check must fail (the test can fail)."""
    import fpa.tasks.construct as c

    orig = c.constructed_head
    monkeypatch.setattr(c, "constructed_head", lambda task: orig(task, beta=1e-3))
    r = c.constructive_check("stack", n=100, ms=(8,), length_factors=(4,))
    assert r["min_target_mass"] < 0.99
