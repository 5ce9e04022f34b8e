"""Passkey retrieval grids: lengths (multiples of the training length) x needle depths x trials.

Every cell's prompts are drawn from ``numpy.random.default_rng([seed, length, depth index])``, so
the full-cache grid and every cache-policy grid see exactly the same prompts and keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from fpa.checks import positive_int
from fpa.eval.decode import greedy_decode
from fpa.tasks.passkey import is_correct, make_prompt, max_answer_tokens


class ReportsKeptFraction(Protocol):
    """A cache policy that reports, after its latest application, the keys held over the keys seen."""

    @property
    def kept_fraction(self) -> float:
        """Keys held divided by keys seen (NaN before any application)."""
        ...


# make_cache(length) -> (cache object passed as past_key_values, its policy, or None for the full cache)
CacheFactory = Callable[[int], tuple[object, ReportsKeptFraction | None]]


def cell_prompts(tokenizer, length: int, depth: float, depth_index: int, trials: int, seed: int):
    """The ``trials`` prompts of one cell: a list of PasskeyPrompt of ``length`` tokens."""
    rng = np.random.default_rng([seed, length, depth_index])
    return [make_prompt(tokenizer, length, depth, rng) for _ in range(trials)]


def run_cell(
    model,
    tokenizer,
    prompts,
    make_cache: CacheFactory | None = None,
    chunk_size: int | None = None,
    batch_size: int | None = None,
) -> tuple[int, float, list[str]]:
    """Decode a cell's prompts greedily -> (number correct, mean achieved kept fraction (1.0 for the
    full cache, NaN if the policy reports none), the generated texts)."""
    n_new = max_answer_tokens(tokenizer, len(prompts[0].key))
    bs = len(prompts) if batch_size is None else batch_size
    correct, kept, texts = 0, [], []
    for a in range(0, len(prompts), bs):
        group = prompts[a : a + bs]
        ids = torch.from_numpy(np.stack([p.ids for p in group]))
        cache, policy = (None, None) if make_cache is None else make_cache(ids.shape[1])
        new, _ = greedy_decode(model, ids, n_new, cache=cache, chunk_size=chunk_size)
        for p, row in zip(group, new.tolist()):
            text = tokenizer.decode(row)
            texts.append(text)
            correct += is_correct(text, p.key)
        kept.append(1.0 if policy is None else float(policy.kept_fraction))
    return correct, float(np.mean(kept)), texts


def passkey_grid(
    model,
    tokenizer,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int,
    seed: int = 0,
    make_cache: CacheFactory | None = None,
    chunk_size: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    desc: str = "passkey",
) -> dict:
    """Exact-match passkey accuracy over lengths x depths.

    The prompts of one length (every depth, ``trials`` each) are decoded in batches of
    ``batch_size`` (default: ``trials``); a batch may span cells, and each cell is credited with
    the kept fraction of the batch its prompts ran in.

    Returns {"lengths", "depths", "trials", "correct": (n_len, n_depth) ints, "accuracy": same as
    fractions, "accuracy_by_length": (n_len,), "kept_fraction": (n_len, n_depth) achieved
    (1.0 = full cache), "kept_fraction_mean", "examples": one generated text per length}.
    """
    positive_int("trials", trials)
    if not lengths or not depths:
        raise ValueError("lengths and depths must be non-empty")
    bs = trials if batch_size is None else batch_size
    positive_int("batch_size", bs, "or None")
    correct = np.zeros((len(lengths), len(depths)), dtype=np.int64)
    kept = np.ones((len(lengths), len(depths)))
    examples = []
    bar = tqdm(total=len(lengths) * len(depths) * trials, desc=desc, disable=not progress, leave=False)
    model.eval()
    for i, length in enumerate(lengths):
        prompts, cells = [], []
        for j, depth in enumerate(depths):
            prompts += cell_prompts(tokenizer, int(length), float(depth), j, trials, seed)
            cells += [j] * trials
        kept_sum, texts = np.zeros(len(depths)), []
        for a in range(0, len(prompts), bs):
            group = prompts[a : a + bs]
            n_ok, k, t = run_cell(model, tokenizer, group, make_cache, chunk_size, len(group))
            texts += t
            for c in cells[a : a + bs]:
                kept_sum[c] += k
            bar.update(len(group))
        for p, text, c in zip(prompts, texts, cells):
            correct[i, c] += is_correct(text, p.key)
        kept[i] = kept_sum / trials
        examples.append({"length": int(length), "key": prompts[0].key, "generated": texts[0]})
    bar.close()
    acc = correct / trials
    finite = kept[np.isfinite(kept)]
    return {
        "lengths": [int(x) for x in lengths],
        "depths": [float(d) for d in depths],
        "trials": trials,
        "correct": correct.tolist(),
        "accuracy": acc.tolist(),
        "accuracy_by_length": acc.mean(1).tolist(),
        "kept_fraction": kept.tolist(),
        "kept_fraction_mean": float(finite.mean()) if finite.size else math.nan,
        "examples": examples,
    }
