import numpy as np
import pytest

from fpa.data import ByteTokenizer
from fpa.tasks import get_mixer
from fpa.tasks.passkey import (
    FILLER,
    NEEDLE,
    QUESTION,
    generated_digits,
    is_correct,
    make_prompt,
    max_answer_tokens,
    min_prompt_length,
    passkey_training_sample,
)

TOK = ByteTokenizer()
LONGEST_SENTENCE = max(len(s) + 2 for s in FILLER.split(". "))


@pytest.mark.parametrize("length", [120, 256, 1000, 4096])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_prompt_has_exact_length_and_needle_at_depth(length, depth):
    p = make_prompt(TOK, length, depth, np.random.default_rng([length, int(depth * 10)]))
    assert p.ids.shape == (length,) and p.ids.dtype == np.int64
    text = TOK.decode(p.ids.tolist())
    needle = NEEDLE.format(key=p.key)
    assert TOK.decode(p.ids[p.needle_start : p.needle_start + p.needle_len].tolist()) == needle
    assert text.count(p.key) == 2 and text.endswith(QUESTION)
    n_fill = length - len(needle) - len(QUESTION)
    assert abs(p.needle_start - depth * n_fill) <= LONGEST_SENTENCE
    if depth == 1.0:
        assert text.endswith(needle + QUESTION)


def test_filler_is_whole_sentences_around_needle_and_question():
    p = make_prompt(TOK, 600, 0.5, np.random.default_rng(3))
    text = TOK.decode(p.ids.tolist())
    before = text[: p.needle_start]
    assert before.endswith(". ")
    after = text[p.needle_start + p.needle_len : -len(QUESTION)]
    assert after.startswith("The ") or after.startswith("Here ") or after.startswith("There ")


def test_keys_vary_and_are_digits():
    rng = np.random.default_rng(0)
    keys = {make_prompt(TOK, 200, 0.5, rng).key for _ in range(50)}
    assert len(keys) > 40 and all(k.isdigit() and len(k) == 5 for k in keys)


def test_prompt_rejects_bad_arguments():
    with pytest.raises(ValueError, match="length"):
        make_prompt(TOK, min_prompt_length(TOK) - 1, 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="depth"):
        make_prompt(TOK, 300, 1.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="key"):
        make_prompt(TOK, 300, 0.5, np.random.default_rng(0), key="12a45")
    make_prompt(TOK, min_prompt_length(TOK), 0.5, np.random.default_rng(0))  # exactly fits


@pytest.mark.parametrize("seq_len", [128, 256, 512])
def test_training_sample_is_a_prompt_at_the_training_length_then_the_answer(seq_len):
    mixer = get_mixer("passkey")
    assert mixer is passkey_training_sample
    s = mixer(np.random.default_rng(seq_len), seq_len, TOK)
    assert s.shape == (seq_len + 1,) and s.dtype == np.int64
    text = TOK.decode(s.tolist())
    head, answer = text.split(QUESTION)
    key = generated_digits(answer)
    assert len(key) == 5 and answer == f" {key}." and NEEDLE.format(key=key) in head
    with pytest.raises(ValueError, match="seq_len"):
        mixer(np.random.default_rng(0), 0, TOK)


@pytest.mark.parametrize(
    "text, ok",
    [
        (" 12345", True),
        ("12345", True),
        (" 12345.", True),
        (" 12345 is", True),
        ("\n12345", True),
        (" 123456", False),  # extra digit
        (" 1234", False),  # missing digit
        (" 1234.", False),
        ("", False),
        (" x12345", False),
        (" 54321", False),
        (" 12 345", False),
    ],
)
def test_scoring_is_exact_match_of_the_generated_digits(text, ok):
    assert is_correct(text, "12345") is ok


def test_enough_tokens_are_generated_to_see_an_extra_digit():
    assert max_answer_tokens(TOK, 5) == len(" 12345") + 1
