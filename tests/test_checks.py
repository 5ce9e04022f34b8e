"""The shared number and key checks (fpa.checks): ints reject bools, numbers reject bools and nan
(and inf unless allowed), and the message names the argument, the expected range and the value;
an unknown key gets a did-you-mean and the valid keys."""

import math

import numpy as np
import pytest

from fpa.checks import (
    check_known_keys,
    check_number,
    closest_name,
    non_negative_int,
    number_or_numbers,
    positive_int,
    spread_over_heads,
)


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "2", None, np.int64(3)])
def test_positive_int_rejects(bad):
    with pytest.raises(ValueError) as e:
        positive_int("n", bad, "blocks")
    assert str(e.value) == f"n must be a positive int (blocks), got {bad!r}"


@pytest.mark.parametrize("bad", [-1, False, 0.0, np.int64(0)])
def test_non_negative_int_rejects(bad):
    with pytest.raises(ValueError) as e:
        non_negative_int("seed", bad)
    assert str(e.value) == f"seed must be a non-negative int, got {bad!r}"


def test_ints_pass_through():
    assert positive_int("n", 3) == 3 and non_negative_int("n", 0) == 0 and positive_int("n", 2**70) == 2**70


@pytest.mark.parametrize(
    "value, kw, expected",
    [
        (True, {}, "x must be a finite number, got True"),
        (math.nan, dict(low=0), "x must be a finite number >= 0, got nan"),
        (math.inf, dict(low=0, low_open=True), "x must be a finite number > 0, got inf"),
        (-math.inf, {}, "x must be a finite number, got -inf"),
        (0, dict(low=0, low_open=True), "x must be a finite number > 0, got 0"),
        (1.5, dict(low=0, high=1), "x must be a finite number in [0, 1], got 1.5"),
        (0.0, dict(low=0, high=1, low_open=True), "x must be a finite number in (0, 1], got 0.0"),
        (1, dict(low=0, high=1, high_open=True), "x must be a finite number in [0, 1), got 1"),
        (3, dict(high=2), "x must be a finite number <= 2, got 3"),
        (2, dict(high=2, high_open=True, what="a share"), "x must be a finite number < 2 (a share), got 2"),
        ("1", {}, "x must be a finite number, got '1'"),
        (None, {}, "x must be a finite number, got None"),
        (math.nan, dict(low=0, finite=False), "x must be a number >= 0, got nan"),
        (-math.inf, dict(low=0, finite=False), "x must be a number >= 0, got -inf"),
    ],
)
def test_check_number_rejects(value, kw, expected):
    with pytest.raises(ValueError) as e:
        check_number("x", value, **kw)
    assert str(e.value) == expected


def test_check_number_accepts_bounds_and_returns_a_float():
    assert check_number("x", 0, low=0) == 0.0 and isinstance(check_number("x", 1, low=0, high=1), float)
    assert check_number("x", 1e300) == 1e300
    assert check_number("x", 0.999, low=0, high=1, high_open=True) == 0.999
    assert check_number("x", math.inf, low=0, finite=False) == math.inf


def test_closest_name():
    assert closest_name("stepz", ["steps", "seed", "lr"]) == "steps"
    assert closest_name("zzzz", ["steps", "seed"]) is None


def test_check_known_keys_names_each_unknown_key_with_a_hint():
    check_known_keys({"steps": 1}, ["lr", "steps"], "the config")  # known keys pass
    with pytest.raises(ValueError) as e:
        check_known_keys(["stepz", "qqq", "lr"], ["lr", "steps"], "the config")
    assert str(e.value) == (
        "unknown keys in the config: ['qqq', 'stepz']; 'stepz' (did you mean 'steps'?); valid keys: ['lr', 'steps']"
    )
    with pytest.raises(ValueError, match=r"'old' \(did you mean the new one\?\); valid keys"):
        check_known_keys(["old"], ["lr"], "the config", hint=lambda k: "the new one" if k == "old" else None)


def test_number_or_numbers_keeps_one_number_or_a_tuple_of_floats():
    assert number_or_numbers("b", 2) == 2.0 and isinstance(number_or_numbers("b", 2), float)
    assert number_or_numbers("b", [2, 5.5]) == (2.0, 5.5) and number_or_numbers("b", (1,)) == (1.0,)


@pytest.mark.parametrize(
    "value, expected",
    [
        (math.nan, "b must be a finite number (or a non-empty list of numbers, one per group of heads), got nan"),
        ("2", "b must be a finite number (or a non-empty list of numbers, one per group of heads), got '2'"),
        ([], "b must be a number or a non-empty list of numbers, got []"),
        ([1.0, True], "b[1] must be a finite number, got True"),
        ((1.0, math.inf), "b[1] must be a finite number, got inf"),
    ],
)
def test_number_or_numbers_rejects(value, expected):
    with pytest.raises(ValueError) as e:
        number_or_numbers("b", value)
    assert str(e.value) == expected


def test_spread_over_heads_gives_each_value_a_run_of_consecutive_heads():
    assert spread_over_heads("b", 3, 4) == [3.0] * 4
    assert spread_over_heads("b", [1, 2], 4) == [1.0, 1.0, 2.0, 2.0]
    assert spread_over_heads("b", [1, 2, 3], 6) == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert spread_over_heads("b", [1, 2, 3, 4], 4) == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match=r"b has 3 values, which must divide the number of heads \(4\)"):
        spread_over_heads("b", [1, 2, 3], 4)
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        spread_over_heads("b", 1.0, 0)
