"""KV-cache policies at matched kept fractions.

Budget policies (window, StreamingLLM, TOVA, H2O) keep ``budget = round(fraction * prompt
length)`` keys per head. Threshold policies (the model's own rule: FPAEviction for FPA,
FoXEviction for FoX) have no budget: their threshold tau is calibrated per prompt length on
held-out calibration prompts (never the evaluated ones) so that the kept fraction is close to the
target, and the fraction actually achieved on the evaluated prompts is reported beside the
accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

BUDGET_POLICIES = ("window", "streamingllm", "tova", "h2o")
THRESHOLD_POLICIES = {"fpa": "fpa", "fox": "fox"}  # attention type -> its own rule


def policies_for(attention: str) -> list[str]:
    """The policies that apply to a model with this attention type: its own rule (if any) first."""
    own = [THRESHOLD_POLICIES[attention]] if attention in THRESHOLD_POLICIES else []
    return own + list(BUDGET_POLICIES)


def make_policy(name: str, *, budget: int | None = None, threshold: float | None = None):
    """An fpa.cache policy object from its short name and its budget or threshold."""
    from fpa.cache import H2O, TOVA, FoXEviction, FPAEviction, SlidingWindow, StreamingLLM

    budget_cls = {"window": SlidingWindow, "streamingllm": StreamingLLM, "tova": TOVA, "h2o": H2O}
    if name in budget_cls:
        if budget is None:
            raise ValueError(f"budget is required for policy {name!r}")
        return budget_cls[name](budget=int(budget))
    if name in ("fpa", "fox"):
        if threshold is None:
            raise ValueError(f"threshold is required for policy {name!r}")
        return (FPAEviction if name == "fpa" else FoXEviction)(threshold=float(threshold))
    raise ValueError(f"policy must be one of {BUDGET_POLICIES + tuple(THRESHOLD_POLICIES)}, got {name!r}")


def budget_for(fraction: float, length: int) -> int:
    """Keys per head for a budget policy at ``fraction`` of a ``length``-token prompt (>= 1)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    return max(1, int(round(fraction * length)))


def key_penalties(cache) -> np.ndarray:
    """Every held key's penalty under the model's rule, flattened over layers, rows and KV heads:
    for a KV head the min over its query heads (the threshold rules evict a key only when every
    query head of the group agrees)."""
    from fpa.cache.policies import penalties

    out = []
    for lc in cache.layers:
        p = penalties(lc)  # (B, Hq, C)
        B, Hq, C = p.shape
        p = p.view(B, Hq // lc.info.groups, lc.info.groups, C).amin(2)
        out.append(p[lc.store["valid"]].flatten().double().numpy())
    return np.concatenate(out)


def _run(model, prompts: np.ndarray, policy, chunk_size: int):
    from fpa.cache import FPACache, prefill

    cache = FPACache(policy)
    prefill(model, torch.from_numpy(prompts), cache, chunk_size)
    return cache


def calibrate_threshold(model, name: str, prompts: np.ndarray, fraction: float, chunk_size: int,
                        refine: int = 2) -> dict:
    """tau for threshold policy ``name`` so that ``fraction`` of the keys are kept on ``prompts``
    (N, T) held-out prompts prefilled in chunks.

    Start: the ``fraction`` quantile of the key penalties after a full-cache prefill (a key is
    kept iff its penalty <= tau). Eviction changes later hidden states, so ``refine`` times the
    prompts are re-run with eviction and the quantile is rescaled by target / achieved. Returns
    {"threshold", "calibrated_kept_fraction"} (the run closest to the target).
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    pen = key_penalties(_run(model, prompts, make_policy(name, threshold=math.inf), chunk_size))
    q, best = fraction, None
    for _ in range(refine + 1):
        tau = float(np.quantile(pen, min(q, 1.0)))
        policy = make_policy(name, threshold=tau)
        _run(model, prompts, policy, chunk_size)
        got = float(policy.kept_fraction)
        if best is None or abs(got - fraction) < abs(best[1] - fraction):
            best = (tau, got)
        if got <= 0 or abs(got - fraction) < 0.01:
            break
        q = q * fraction / got
    return {"threshold": best[0], "calibrated_kept_fraction": best[1]}


def matched_policy_factories(model, attention: str, tokenizer, lengths: Sequence[int], fraction: float,
                             chunk_size: int, calib_prompts: int, seed: int, policies: Sequence[str] | None = None):
    """{policy name: (make_cache(length) -> (FPACache, policy), calibration info per length)} for
    every policy that applies to ``attention``, matched to ``fraction``."""
    from fpa.cache import FPACache
    from fpa.eval.passkey import cell_prompts

    names = policies_for(attention) if policies is None else list(policies)
    out = {}
    for name in names:
        if name in BUDGET_POLICIES:
            def make(length, name=name):
                p = make_policy(name, budget=budget_for(fraction, length))
                return FPACache(p), p
            out[name] = (make, {str(n): {"budget": budget_for(fraction, n)} for n in lengths})
            continue
        calib = {}
        for n in lengths:
            ps = cell_prompts(tokenizer, int(n), 0.5, 10_000, calib_prompts, seed + 7919)
            calib[str(n)] = calibrate_threshold(model, name, np.stack([p.ids for p in ps]), fraction, chunk_size)

        def make(length, name=name, calib=calib):
            p = make_policy(name, threshold=calib[str(length)]["threshold"])
            return FPACache(p), p
        out[name] = (make, calib)
    return out


def policy_grids(model, attention: str, tokenizer, lengths: Sequence[int], depths: Sequence[float], trials: int,
                 fraction: float, chunk_size: int, calib_prompts: int, seed: int, progress: bool = True,
                 desc: str = "") -> dict:
    """{policy: {"target", "calibration", **passkey_grid}} for every policy that applies to
    ``attention``, at kept fraction ``fraction``, on the same prompts as the full-cache grid."""
    from fpa.eval.passkey import passkey_grid

    out = {}
    for policy, (make, calib) in matched_policy_factories(model, attention, tokenizer, lengths, fraction,
                                                          chunk_size, calib_prompts, seed).items():
        g = passkey_grid(model, tokenizer, lengths, depths, trials, seed=seed, make_cache=make, chunk_size=chunk_size,
                         batch_size=trials, progress=progress, desc=f"{desc}{policy} {fraction:.0%}")
        out[policy] = {"target": fraction, "calibration": calib, **g}
    return out
