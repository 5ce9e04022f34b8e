"""Per-position loss on held-out data, up to several times the training length."""

from __future__ import annotations

import math

import numpy as np
import torch
from tqdm.auto import tqdm

from fpa.checks import positive_int


@torch.no_grad()
def per_position_loss(model, windows: np.ndarray, batch_size: int = 4, progress: bool = True) -> np.ndarray:
    """Mean next-token loss at each position: windows (N, T + 1) int64 -> (T,) float64, where entry p
    is the loss of predicting token p + 1 from tokens 0..p (a context of p + 1 tokens)."""
    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[0] < 1 or windows.shape[1] < 2:
        raise ValueError(f"windows must be (N >= 1, T + 1 >= 2) token ids, got shape {windows.shape}")
    positive_int("batch_size", batch_size)
    total = np.zeros(windows.shape[1] - 1)
    for a in tqdm(range(0, len(windows), batch_size), desc="per-position loss", disable=not progress, leave=False):
        x = torch.from_numpy(windows[a : a + batch_size].astype(np.int64))
        out = model(input_ids=x, labels=x, return_per_token_loss=True)
        total += out["per_token_loss"].double().sum(0).numpy()
    return total / len(windows)


def loss_summary(curve: np.ndarray, train_len: int) -> dict:
    """Held-out loss within the training length and in each doubling beyond it.

    curve: (T,) from per_position_loss. Returns {"loss": mean over contexts <= train_len,
    "ppl": exp(loss), "by_multiple": {"1": ..., "2": mean over (L, 2L], "4": (2L, 4L], ...}}.
    """
    if train_len < 1 or train_len > len(curve):
        raise ValueError(f"train_len must be in [1, {len(curve)}], got {train_len}")
    by, lo, m = {}, 0, 1
    while lo < len(curve):
        hi = min(train_len * m, len(curve))
        by[str(m)] = float(np.mean(curve[lo:hi]))
        lo, m = hi, m * 2
    loss = by["1"]
    return {"loss": loss, "ppl": math.exp(loss), "by_multiple": by}


HALVES = {"all": (0.0, 1.0), "first": (0.0, 0.5), "second": (0.5, 1.0)}


def heldout_loss(
    model, data_dir, train_len: int, multiple: int, n_windows: int, progress: bool = True, part: str = "all"
) -> dict:
    """Per-position loss on ``n_windows`` held-out windows of ``multiple`` x ``train_len`` tokens
    (evenly spread over ``part`` of the val split of a prepared data folder: "all", or its "first"
    or "second" half, so that tuning and reporting use disjoint text) -> {"curve", **loss_summary}."""
    from fpa.data import TokenShards

    if part not in HALVES:
        raise ValueError(f"part must be one of {tuple(HALVES)}, got {part!r}")
    val, n = TokenShards(data_dir, "val"), train_len * multiple
    lo_f, hi_f = HALVES[part]
    lo, hi = int(lo_f * len(val)), int(hi_f * len(val))
    if hi - lo < n + 1:
        raise ValueError(f"the {part!r} part of the val split has {hi - lo} tokens, fewer than {n + 1}")
    starts = np.linspace(lo, hi - n - 1, num=n_windows).astype(np.int64)
    w = np.stack([val[int(s) : int(s) + n + 1] for s in starts])
    curve = per_position_loss(model, w, batch_size=2, progress=progress)
    return {"curve": curve.tolist(), **loss_summary(curve, train_len)}
