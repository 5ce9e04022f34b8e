"""The passkey retrieval task: prompts at an exact length in tokens, training samples, scoring.

Template (the usual one): filler sentences, then the needle "The pass key is N. Remember it.
N is the pass key.", more filler, then "What is the pass key? The pass key is". The model
answers " N"; a trial is right when the digits it generates are exactly N (no digit missing,
none extra).

Layout of a prompt of ``length`` tokens, with F = length - len(needle) - len(question) filler
tokens:

    [filler: round(depth * F) tokens][needle][filler: the rest][question]

The filler is whole sentences of the filler text from a random starting sentence, so the needle
and the question follow a sentence end; only the prompt's first sentence may be cut, to make the
length exact. The needle therefore lands within one filler sentence of the requested depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fpa.checks import positive_int

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is"
ANSWER = " {key}"
DEFAULT_DIGITS = 5


@dataclass(frozen=True)
class PasskeyPrompt:
    """One passkey prompt. ids: (length,) int64; key: the digits; needle_start/needle_len: where
    the needle sits in ids (tokens); depth: the requested depth in [0, 1]."""

    ids: np.ndarray
    key: str
    needle_start: int
    needle_len: int
    depth: float


def _encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(list(tokenizer.encode(text)), dtype=np.int64)


def random_key(rng: np.random.Generator, n_digits: int = DEFAULT_DIGITS) -> str:
    """n_digits random decimal digits (leading zeros allowed)."""
    positive_int("n_digits", n_digits)
    return "".join(str(d) for d in rng.integers(0, 10, size=n_digits))


def _sentences(tokenizer) -> list[np.ndarray]:
    return [_encode(tokenizer, x + ". ") for x in FILLER.split(". ") if x.strip(". ")]


def _cycle(sentences: list[np.ndarray], start: int, count: int) -> np.ndarray:
    """``count`` whole filler sentences from sentence index ``start`` (cyclic), concatenated."""
    parts = [sentences[(start + i) % len(sentences)] for i in range(count)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def filler_split(tokenizer, n_fill: int, depth: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two filler runs (before, after the needle) of n_fill tokens in all. ``after`` is whole
    sentences, as close as possible to (1 - depth) * n_fill tokens, so the question follows a
    sentence end; ``before`` is the tail of a sentence run, so the needle follows a sentence end
    (only the prompt's first sentence may be cut). The needle lands within one sentence of
    depth * n_fill tokens."""
    sents = _sentences(tokenizer)
    s0 = int(rng.integers(0, len(sents)))
    cum, best_k, target = 0, 0, (1.0 - depth) * n_fill
    for k in range(1, n_fill + 1):
        cum += len(sents[(s0 + k - 1) % len(sents)])
        if cum > n_fill or abs(cum - target) > abs(len(_cycle(sents, s0, best_k)) - target):
            break
        best_k = k
    after = _cycle(sents, s0, best_k)
    n_before = n_fill - len(after)
    s1 = int(rng.integers(0, len(sents)))
    before = _cycle(sents, s1, n_before // min(len(x) for x in sents) + 2)[-n_before:] if n_before else after[:0]
    return before, after


def min_prompt_length(tokenizer, n_digits: int = DEFAULT_DIGITS) -> int:
    """Tokens taken by the needle and the question alone (a prompt must be at least this long)."""
    key = "0" * n_digits
    return len(_encode(tokenizer, NEEDLE.format(key=key))) + len(_encode(tokenizer, QUESTION))


def make_prompt(
    tokenizer,
    length: int,
    depth: float,
    rng: np.random.Generator,
    n_digits: int = DEFAULT_DIGITS,
    key: str | None = None,
) -> PasskeyPrompt:
    """A passkey prompt of exactly ``length`` tokens with the needle at ``depth`` (0 = start,
    1 = just before the question) of the filler, within one filler sentence. Raises ValueError
    if it cannot fit."""
    if not 0.0 <= float(depth) <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth!r}")
    key = random_key(rng, n_digits) if key is None else key
    if not key.isdigit():
        raise ValueError(f"key must be decimal digits, got {key!r}")
    needle = _encode(tokenizer, NEEDLE.format(key=key))
    question = _encode(tokenizer, QUESTION)
    n_fill = length - len(needle) - len(question)
    if n_fill < 0:
        raise ValueError(
            f"length must be >= {len(needle) + len(question)} tokens for the passkey template, got {length}"
        )
    before, after = filler_split(tokenizer, n_fill, float(depth), rng)
    ids = np.concatenate([before, needle, after, question])
    return PasskeyPrompt(ids=ids, key=key, needle_start=len(before), needle_len=len(needle), depth=float(depth))


def answer_tokens(tokenizer, key: str) -> np.ndarray:
    """(n,) int64: the tokens of the expected answer " N"."""
    return _encode(tokenizer, ANSWER.format(key=key))


def passkey_training_sample(rng: np.random.Generator, seq_len: int, tokenizer) -> np.ndarray:
    """The trainer's task mixer (TASK_MIXERS["passkey"]): (seq_len + 1,) int64 ids, a prompt at a
    uniformly random depth followed by the answer " N." so the sample ends right after it.

    Only the training length is ever used here: evaluation lengths never appear in training.
    """
    seq_len = positive_int("seq_len", seq_len)
    key = random_key(rng)
    tail = _encode(tokenizer, ANSWER.format(key=key) + ".")
    prompt = make_prompt(tokenizer, int(seq_len) + 1 - len(tail), float(rng.random()), rng, key=key)
    return np.concatenate([prompt.ids, tail])


def generated_digits(text: str) -> str:
    """The digits the model answered: the run of digits at the start of ``text`` after leading
    whitespace ("" if it does not start with a digit)."""
    s = text.lstrip()
    n = 0
    while n < len(s) and s[n] in "0123456789":
        n += 1
    return s[:n]


def is_correct(text: str, key: str) -> bool:
    """Exact match: the generated digit run equals the key (a missing or extra digit is wrong)."""
    return generated_digits(text) == key


def max_answer_tokens(tokenizer, n_digits: int = DEFAULT_DIGITS) -> int:
    """Tokens to generate: the answer's length plus one, so an extra digit is seen and scored."""
    return len(answer_tokens(tokenizer, "0" * n_digits)) + 1


def answer_loss(model, tokenizer, seq_len: int, n: int = 32, seed: int = 20261203, device=None) -> float:
    """Mean next-token loss on the answer " N" of ``n`` fixed passkey training samples of ``seq_len``
    tokens (``passkey_training_sample`` with seeds ``[seed, i]``): the learning curve of the task
    itself. With the byte tokenizer the answer is a space and 5 digits, so a model that has not
    learned to copy sits near (5/6) ln 10 = 1.92 (the space is easy), and one that copies near 0."""
    import torch

    rows, spans = [], []
    for i in range(n):
        ids = passkey_training_sample(np.random.default_rng([seed, i]), seq_len, tokenizer)
        key_tail = len(_encode(tokenizer, "."))
        n_ans = len(answer_tokens(tokenizer, "0" * DEFAULT_DIGITS))
        end = len(ids) - key_tail  # the answer tokens are ids[end - n_ans: end]
        rows.append(ids)
        spans.append((end - n_ans, end))
    x = torch.from_numpy(np.stack(rows))
    if device is not None:
        x = x.to(device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        tok = model(input_ids=x, labels=x, return_per_token_loss=True).per_token_loss.float()  # (n, T)
    if was_training:
        model.train()
    # per_token_loss[:, t] is the loss of predicting ids[t + 1]
    picked = torch.stack([tok[r, a - 1 : b - 1] for r, (a, b) in enumerate(spans)])
    return float(picked.mean())
