"""A copy task to mix into language-model training: lines "S is S. " with random strings S.

Copying a string seen a few tokens earlier is the skill passkey retrieval needs (an induction
head), without the filler: a model that has trouble finding the copy inside passkey prompts alone
(in the cpu preset, softmax with RoPE) gets a denser signal for it. ``passkey_or_copy_sample`` is
the mixer of the ``cpu-copy`` preset: a passkey sample or a copy sample, the same for every method.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fpa.checks import positive_int
from fpa.tasks.passkey import passkey_training_sample

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
COPY_LINE = "{s} is {s}. "
COPY_SHARE = 1 / 3  # of the mixed sequences, in passkey_or_copy_sample


def random_string(rng: np.random.Generator, min_len: int = 3, max_len: int = 8) -> str:
    """A random string of ``min_len``..``max_len`` (inclusive) characters from ALPHABET."""
    if positive_int("min_len", min_len) > positive_int("max_len", max_len):
        raise ValueError(f"min_len must be <= max_len, got min_len={min_len!r}, max_len={max_len!r}")
    n = int(rng.integers(min_len, max_len + 1))
    return "".join(ALPHABET[i] for i in rng.integers(0, len(ALPHABET), size=n))


def copy_training_sample(rng: np.random.Generator, seq_len: int, tokenizer) -> np.ndarray:
    """(seq_len + 1,) int64 ids: copy lines "S is S. " with fresh random strings, cut to length
    (TASK_MIXERS["copy"]). The first line starts at the first token; the last one may be cut."""
    seq_len = positive_int("seq_len", seq_len)
    parts, n = [], 0
    while n < seq_len + 1:
        ids = np.asarray(list(tokenizer.encode(COPY_LINE.format(s=random_string(rng)))), dtype=np.int64)
        parts.append(ids)
        n += len(ids)
    return np.concatenate(parts)[: seq_len + 1]


def copy_or(sample: Callable[..., np.ndarray], rng: np.random.Generator, seq_len: int, tokenizer) -> np.ndarray:
    """(seq_len + 1,) int64 ids: with probability COPY_SHARE a copy sample, else
    ``sample(rng, seq_len, tokenizer)`` (another task's mixer)."""
    if rng.random() < COPY_SHARE:
        return copy_training_sample(rng, seq_len, tokenizer)
    return sample(rng, seq_len, tokenizer)


def passkey_or_copy_sample(rng: np.random.Generator, seq_len: int, tokenizer) -> np.ndarray:
    """(seq_len + 1,) int64 ids: with probability COPY_SHARE a copy sample, else a passkey training
    sample (TASK_MIXERS["passkey+copy"]). At mix rate r, a share r * COPY_SHARE of the training
    sequences are copy lines and r * (1 - COPY_SHARE) passkey prompts."""
    return copy_or(passkey_training_sample, rng, seq_len, tokenizer)
