"""Kept keys against context length: how fast an evicting KV cache grows on long text.

A threshold rule whose kept fraction is flat in the context length still keeps a linear number of
keys; the memory claim is about the exponent ``a`` in kept keys ~ L^a, fitted on a log-log scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from fpa.cache.prefill import run_chunks
from fpa.eval.passkey import ReportsKeptFraction


def fit_exponent(lengths: Sequence[float], kept: Sequence[float]) -> float:
    """Least-squares slope of log(kept) against log(length) (NaN with fewer than two usable points)."""
    x = np.asarray(lengths, float)
    y = np.asarray(kept, float)
    ok = (x > 0) & (y > 0) & np.isfinite(y)
    if ok.sum() < 2:
        return math.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


@torch.no_grad()
def kept_keys_growth(
    model,
    ids: torch.Tensor,
    make_cache: Callable[[], tuple[object, ReportsKeptFraction]],
    lengths: Sequence[int],
    chunk_size: int,
) -> dict:
    """Stream ``ids`` (1, N) through ``model`` in chunks of ``chunk_size`` tokens with the cache and
    policy from ``make_cache()``; after ``L`` tokens for each L in ``lengths`` (multiples of
    ``chunk_size``, at most N), record the policy's kept fraction.

    Returns {"lengths", "kept_fraction": per L, "kept_keys": kept fraction x L (keys per head,
    averaged over layers and heads), "exponent": the fitted a in kept_keys ~ L^a}.
    """
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"ids must be (1, N) token ids, got shape {tuple(ids.shape)}")
    lengths = sorted(int(x) for x in lengths)
    if not lengths or lengths[0] < 1 or lengths[-1] > ids.shape[1]:
        raise ValueError(f"lengths must be in [1, {ids.shape[1]}] (the text's length), got {lengths}")
    if any(x % chunk_size for x in lengths):
        raise ValueError(f"lengths must be multiples of chunk_size={chunk_size}, got {lengths}")
    cache, policy = make_cache()
    fractions, at = [], 0
    for L in lengths:
        _, cache = run_chunks(model, ids[:, at:L], cache, chunk_size)
        at = L
        fractions.append(float(policy.kept_fraction))
    kept = [f * L for f, L in zip(fractions, lengths)]
    return {"lengths": lengths, "kept_fraction": fractions, "kept_keys": kept, "exponent": fit_exponent(lengths, kept)}
