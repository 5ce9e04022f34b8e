"""The shared number checks: ints reject bools, numbers reject bools, nan and inf, and the message
names the argument, the expected range and the value."""

import math

import pytest

from fpa.ops.checks import check_number, non_negative_int, positive_int


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "2", None])
def test_positive_int_rejects(bad):
    with pytest.raises(ValueError) as e:
        positive_int("n", bad, "blocks")
    assert str(e.value) == f"n must be a positive int (blocks), got {bad!r}"


@pytest.mark.parametrize("bad", [-1, False, 0.0])
def test_non_negative_int_rejects(bad):
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        non_negative_int("seed", bad)


def test_ints_pass_through():
    assert positive_int("n", 3) == 3 and non_negative_int("n", 0) == 0


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
        (3, dict(high=2), "x must be a finite number <= 2, got 3"),
        ("1", {}, "x must be a finite number, got '1'"),
    ],
)
def test_check_number_rejects(value, kw, expected):
    with pytest.raises(ValueError) as e:
        check_number("x", value, **kw)
    assert str(e.value) == expected


def test_check_number_accepts_bounds_and_returns_a_float():
    assert check_number("x", 0, low=0) == 0.0 and isinstance(check_number("x", 1, low=0, high=1), float)
    assert check_number("x", 1e300) == 1e300
