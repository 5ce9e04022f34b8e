"""Which sequences make up each training step, as a pure function of (seed, step).

The data order and the task mixing of step ``s`` are drawn from ``numpy.random.default_rng([seed,
s])``, so resuming at step ``s`` needs nothing but ``s`` (no iterator state to save), and every
rank draws the same global batch and keeps its own slice of it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fpa.data import TokenShards

Mixer = Callable[[np.random.Generator, int, object], np.ndarray]


class StepBatches:
    """Global batch of ``batch_size`` random windows of ``seq_len + 1`` tokens of ``shards`` per step;
    with probability ``mix_rate`` a window is replaced by ``mixer(rng, seq_len, tokenizer)``, ``rng``
    seeded per sequence from the step's generator."""

    def __init__(
        self,
        shards: TokenShards,
        seq_len: int,
        batch_size: int,
        seed: int,
        mixer: Mixer | None = None,
        mix_rate: float = 0.0,
        tokenizer=None,
    ):
        if len(shards) < seq_len + 2:
            raise ValueError(
                f"seq_len ({seq_len}) needs a split of at least {seq_len + 2} tokens; the train split has {len(shards)}"
            )
        self.shards, self.seq_len, self.batch_size, self.seed = shards, seq_len, batch_size, seed
        self.mixer, self.mix_rate, self.tokenizer = mixer, mix_rate, tokenizer

    def _sequence(self, start: int, mixed: bool, sample_seed: int) -> np.ndarray:
        if not mixed:
            return self.shards[start : start + self.seq_len + 1]
        if self.mixer is None:
            raise ValueError("a mixed sequence needs a mixer")
        sample = np.asarray(self.mixer(np.random.default_rng(sample_seed), self.seq_len, self.tokenizer))
        if sample.shape != (self.seq_len + 1,):
            raise ValueError(f"mix task sample must have shape ({self.seq_len + 1},), got {sample.shape}")
        return sample.astype(np.int64)

    def get(self, step: int, lo: int, hi: int) -> tuple[torch.Tensor, int]:
        """Sequences [lo, hi) of step ``step``'s global batch as a (hi - lo, seq_len + 1) int64 tensor,
        and how many of them are task samples."""
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(self.shards) - self.seq_len - 1, size=self.batch_size)
        if self.mixer is not None:
            mixed = rng.random(self.batch_size) < self.mix_rate
        else:
            mixed = np.zeros(self.batch_size, bool)
        seeds = rng.integers(0, 2**63 - 1, size=self.batch_size)
        rows = [self._sequence(int(starts[i]), bool(mixed[i]), int(seeds[i])) for i in range(lo, hi)]
        return torch.from_numpy(np.stack(rows)), int(mixed[lo:hi].sum())


def eval_windows(shards: TokenShards, seq_len: int, n: int) -> np.ndarray:
    """``n`` fixed window starts spread evenly over a split (the held-out set of every eval)."""
    last = len(shards) - seq_len - 1
    if last < 0:
        raise ValueError(f"the val split has {len(shards)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    return np.linspace(0, last, num=n).astype(np.int64)
