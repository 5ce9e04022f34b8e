"""Passkey accuracy against kept fraction under one KV-cache policy (one curve).

A threshold rule (the model's own: ``fpa`` = FPAEviction, ``fox`` = FoXEviction) is swept over
fixed thresholds tau and each point reports the kept fraction it achieved: there is no calibration
to a target fraction, which would choose tau from the penalties of the keys and so decide for the
rule which heads it may cut into. A budget policy (window, StreamingLLM, TOVA, H2O) is swept over
kept fractions (budget = round(f x prompt length) keys per head). A hybrid ``<own>+<budget>``
(fpa.cache.hybrid) applies the own rule at a fixed threshold, then a budget of f x prompt length
per head on its survivors, and is swept over f. ``full`` is the full cache on the same prompts
(one point, kept fraction 1). Every point sees exactly the same prompts
(fpa.eval.passkey.cell_prompts), so curves are paired.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fpa.eval.kv import BUDGET_POLICIES, HYBRID_BUDGETS, THRESHOLD_POLICIES, THRESHOLD_RULES, budget_for, make_policy
from fpa.eval.passkey import passkey_grid

HYBRID_POLICIES = tuple(f"{own}+{b}" for own in THRESHOLD_POLICIES.values() for b in HYBRID_BUDGETS)
CURVE_POLICIES = ("full",) + THRESHOLD_RULES + BUDGET_POLICIES + HYBRID_POLICIES


def _factory(policy: str, setting: float | None, hybrid_threshold: float):
    from fpa.cache import FPACache

    if policy == "full":
        return None
    if setting is None:
        raise ValueError(f"setting must be a number for policy {policy!r}, got None")
    value = float(setting)

    def make(length: int):
        if policy in THRESHOLD_RULES:
            p = make_policy(policy, threshold=value)
        else:
            p = make_policy(policy, budget=budget_for(value, length), threshold=hybrid_threshold)
        return FPACache(p), p

    return make


def sweep_of(policy: str, thresholds: Sequence[float], fractions: Sequence[float]) -> list:
    """The settings a curve of ``policy`` sweeps: thresholds for an own rule, kept fractions for a
    budget or hybrid policy, [None] for the full cache."""
    if policy not in CURVE_POLICIES:
        raise ValueError(f"policy must be one of {CURVE_POLICIES}, got {policy!r}")
    if policy == "full":
        return [None]
    return list(thresholds if policy in THRESHOLD_RULES else fractions)


def policy_curve(
    model,
    tokenizer,
    policy: str,
    train_len: int,
    multiples: Sequence[int],
    depths: Sequence[float],
    trials: int,
    thresholds: Sequence[float],
    fractions: Sequence[float],
    chunk_size: int,
    seed: int = 0,
    hybrid_threshold: float = 16.0,
) -> list[dict]:
    """Points of ``policy`` on ``model``: [{"setting" (tau, fraction, or None for full),
    "kept_fraction" (achieved, mean over cells), "kept_by_multiple": {"8": ...},
    "accuracy_by_multiple": {"8": ...}, "correct": per multiple x depth counts}], one per setting.
    Hybrids use the own rule at ``hybrid_threshold`` and sweep ``fractions``."""
    settings = sweep_of(policy, thresholds, fractions)
    if not settings:
        raise ValueError(f"no settings to sweep for policy {policy!r} (empty thresholds or fractions)")
    lengths = [train_len * int(m) for m in multiples]
    points = []
    for s in settings:
        g = passkey_grid(
            model,
            tokenizer,
            lengths,
            depths,
            trials,
            seed=seed,
            make_cache=_factory(policy, s, hybrid_threshold),
            chunk_size=chunk_size,
            batch_size=trials,
            progress=False,
        )
        kept = np.asarray(g["kept_fraction"]).mean(1)
        points.append(
            {
                "setting": s,
                "kept_fraction": float(kept.mean()),
                "kept_by_multiple": {str(m): float(k) for m, k in zip(multiples, kept)},
                "accuracy_by_multiple": {str(m): float(a) for m, a in zip(multiples, g["accuracy_by_length"])},
                "correct": g["correct"],
            }
        )
    return points
