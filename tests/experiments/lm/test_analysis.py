"""Paired statistics against values computed by hand from their definitions."""

import math

import pytest

from fpa.experiments.lm.analysis import bootstrap_ci, paired, sign_test_p, verdict


def test_sign_test_matches_the_binomial_definition():
    assert sign_test_p([1] * 10) == pytest.approx(2 / 2**10)  # all ten positive: 2 * P(X = 0)
    assert sign_test_p([1] * 8 + [-1] * 2) == pytest.approx(2 * (1 + 10 + 45) / 1024)
    assert sign_test_p([1, -1]) == 1.0
    assert sign_test_p([0, 0, 0]) == 1.0  # ties only
    assert sign_test_p([0.5, 0, -0.0, 0.2]) == pytest.approx(2 / 4)  # ties dropped: n = 2, both positive


def test_bootstrap_interval_holds_the_mean_and_shrinks_with_less_spread():
    d = [0.1, 0.3, -0.2, 0.5, 0.0, 0.2, 0.4, -0.1, 0.3, 0.1]
    lo, hi = bootstrap_ci(d)
    mean = sum(d) / len(d)
    assert lo <= mean <= hi and hi - lo < max(d) - min(d)
    lo2, hi2 = bootstrap_ci([x / 10 for x in d])
    assert hi2 - lo2 == pytest.approx((hi - lo) / 10, rel=1e-9)  # same resamples, scaled data
    assert bootstrap_ci([0.3] * 5) == [pytest.approx(0.3)] * 2
    assert all(math.isnan(x) for x in bootstrap_ci([]))


def test_paired_and_its_verdicts():
    a, b = [1.0] * 10, [0.0] * 10
    res = paired(a, b)
    assert res["n"] == 10 and res["mean_diff"] == 1.0 and res["wins_a"] == 10 and res["ties"] == 0
    assert "x ahead at n = 10" in verdict(res, "x", "y", "Passkey")
    assert "y ahead" in verdict(paired(b, a), "x", "y", "Passkey")
    # lower is better for a loss: a smaller loss of x puts x ahead
    assert "x ahead" in verdict(paired([1.0] * 10, [2.0] * 10, higher_is_better=False), "x", "y", "Loss")
    mixed = paired([1, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 1])
    assert "no difference detectable at n = 6" in verdict(mixed, "x", "y", "Passkey")
    with pytest.raises(ValueError, match="same length"):
        paired([1, 2], [1])


def test_wins_are_oriented_by_the_metric():
    """x has the lower loss on 7 seeds and the higher on 2 (one tie): for a loss (lower is better)
    x wins 7; read as a higher-is-better metric, the same numbers give x 2 wins."""
    x = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 2.0]
    y = [2.0] * 10
    loss = paired(x, y, higher_is_better=False)
    assert (loss["wins_a"], loss["wins_b"], loss["ties"]) == (7, 2, 1) and not loss["higher_is_better"]
    acc = paired(x, y)
    assert (acc["wins_a"], acc["wins_b"], acc["ties"]) == (2, 7, 1)
    assert "x better on 7 seeds, y on 2, 1 tied" in verdict(loss, "x", "y", "Loss", scale=1.0, digits=4)
    assert "lower is better" in verdict(loss, "x", "y", "Loss")
