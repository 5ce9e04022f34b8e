"""Paired statistics over seeds, and the verdict sentences derived from them.

Each seed trains both methods on the same data order and initialisation seed, so the unit of
analysis is the per-seed difference. The interval is a percentile bootstrap over seeds; the test
is the two-sided exact sign test (ties dropped).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def sign_test_p(diffs: Sequence[float]) -> float:
    """Two-sided exact sign test of median 0 (ties dropped); 1.0 when every difference is a tie."""
    d = [x for x in diffs if x != 0]
    n, k = len(d), sum(x > 0 for x in d)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(0, min(k, n - k) + 1)) / 2**n
    return float(min(1.0, 2 * tail))


def bootstrap_ci(diffs: Sequence[float], level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> list[float]:
    """Percentile bootstrap interval of the mean of ``diffs`` (resampling seeds with replacement)."""
    d = np.asarray(diffs, float)
    if d.size == 0:
        return [math.nan, math.nan]
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return [float(min(lo, d.mean())), float(max(hi, d.mean()))]


def paired(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True) -> dict:
    """Paired comparison of a and b (same seeds, same order): {"n", "mean_diff" (a - b), "ci95",
    "sign_p", "diffs", "higher_is_better", "wins_a", "wins_b", "ties"}. The wins are oriented by
    the metric: a wins a seed where its value is better (higher, or lower when
    ``higher_is_better`` is False, e.g. a loss)."""
    if len(a) != len(b):
        raise ValueError(f"paired samples must have the same length, got {len(a)} and {len(b)}")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    sign = 1 if higher_is_better else -1
    return {
        "n": len(diffs),
        "mean_diff": float(np.mean(diffs)) if diffs else math.nan,
        "ci95": bootstrap_ci(diffs),
        "sign_p": sign_test_p(diffs),
        "diffs": diffs,
        "higher_is_better": higher_is_better,
        "wins_a": sum(sign * x > 0 for x in diffs),
        "wins_b": sum(sign * x < 0 for x in diffs),
        "ties": sum(x == 0 for x in diffs),
    }


def verdict(res: dict, a: str, b: str, what: str, unit: str = " points", scale: float = 100.0, digits: int = 1) -> str:
    """One sentence from a paired result: who is ahead (the 95% interval excludes 0; "ahead" in the
    metric's own direction, ``res["higher_is_better"]``), or that no difference is detectable; the
    sign test's p and the seeds each side wins are quoted beside it."""
    lo, hi = (scale * x for x in res["ci95"])
    mean = scale * res["mean_diff"]
    f = f"+.{digits}f"
    better = "higher" if res.get("higher_is_better", True) else "lower"
    interval = (
        f"mean {a} - {b} {mean:{f}}{unit}, 95% interval [{lo:{f}}, {hi:{f}}], sign test p = "
        f"{res['sign_p']:.2g}; {better} is better: {a} better on {res['wins_a']} seeds, {b} on "
        f"{res['wins_b']}, {res['ties']} tied"
    )
    if lo > 0 or hi < 0:
        ahead = a if (lo > 0) == res.get("higher_is_better", True) else b
        return f"{what}: {ahead} ahead at n = {res['n']} ({interval})."
    return f"{what}: no difference detectable at n = {res['n']} ({interval})."
