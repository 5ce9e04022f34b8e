"""The number and key checks every package uses for its settings: ints reject bools, numbers
reject bools and nan (and inf where they must be finite), and an unknown key gets a did-you-mean.
Each raises ValueError naming the argument, what was expected and what came, before any work.

A root module like fpa.compat: it imports neither torch nor any fpa package, so the light modules
(fpa.tasks, fpa.data, ``fpa reproduce``'s start-up) share it without importing fpa.ops. The
tensor checks of the attention ops stay in fpa.ops.checks.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable


def _what(what: str) -> str:
    return f" ({what})" if what else ""


def positive_int(name: str, value: object, what: str = "") -> int:
    """``value`` if it is a Python int >= 1 (not a bool; not a numpy int either, which a config
    would hold and then fail to write as JSON).

    Args:
        name: The argument's name, for the message.
        value: What the caller passed.
        what: An optional note on the argument's meaning, e.g. "keys kept per head".

    Raises:
        ValueError: ``value`` is not a positive int.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{_what(what)}, got {value!r}")
    return value


def non_negative_int(name: str, value: object, what: str = "") -> int:
    """``value`` if it is a Python int >= 0 (not a bool, not a numpy int).

    Raises:
        ValueError: ``value`` is not a non-negative int; the message names ``name`` (and ``what``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int{_what(what)}, got {value!r}")
    return value


def number_or_numbers(name: str, value: object) -> float | tuple[float, ...]:
    """``value`` as a float, or a non-empty list or tuple of numbers as a tuple of floats (a
    per-head setting: one value for every head, or one per group of heads, ``spread_over_heads``).

    Raises:
        ValueError: ``value`` is neither a finite number nor a non-empty sequence of them; the
            message names ``name`` (and the index of a bad element).
    """
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name} must be a number or a non-empty list of numbers, got {value!r}")
        return tuple(check_number(f"{name}[{i}]", v) for i, v in enumerate(value))
    return check_number(name, value, what="or a non-empty list of numbers, one per group of heads")


def spread_over_heads(name: str, value: float | tuple[float, ...], num_heads: int) -> list[float]:
    """One float per head from a per-head setting: a number for every head; ``n`` values, ``n``
    dividing ``num_heads``, each for ``num_heads // n`` consecutive heads (values (a, b) on four
    heads: a, a, b, b).

    Raises:
        ValueError: ``value`` is not such a setting, or its length does not divide ``num_heads``.
    """
    v = number_or_numbers(name, value)
    if isinstance(v, float):
        return [v] * positive_int("num_heads", num_heads)
    if positive_int("num_heads", num_heads) % len(v):
        raise ValueError(
            f"{name} has {len(v)} values, which must divide the number of heads ({num_heads}): "
            "each value starts num_heads / len(values) consecutive heads"
        )
    per = num_heads // len(v)
    return [v[h // per] for h in range(num_heads)]


def check_number(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    what: str = "",
    finite: bool = True,
) -> float:
    """``value`` as a float if it is a Python int or float (not a bool, not nan; not inf
    unless ``finite`` is False) in the range: ``low <= value`` (``low < value`` with ``low_open``),
    ``value <= high`` (``value < high`` with ``high_open``).

    Args:
        name: The argument's name, for the message.
        value: What the caller passed.
        low: Lower bound (None: none).
        high: Upper bound (None: none).
        low_open: Whether ``low`` itself is excluded.
        high_open: Whether ``high`` itself is excluded.
        what: An optional note on the argument's meaning.
        finite: Whether +-inf is refused (False: allowed when the range admits it).

    Raises:
        ValueError: ``value`` is not such a number.
    """
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and not math.isnan(value)
    if ok and finite:
        ok = math.isfinite(value)  # type: ignore[arg-type]
    if ok and low is not None:
        ok = value > low if low_open else value >= low  # type: ignore[operator]
    if ok and high is not None:
        ok = value < high if high_open else value <= high  # type: ignore[operator]
    if not ok:
        if low is not None and high is not None:
            where = f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            where = f" {'>' if low_open else '>='} {low:g}"
        elif high is not None:
            where = f" {'<' if high_open else '<='} {high:g}"
        else:
            where = ""
        kind = "finite number" if finite else "number"
        raise ValueError(f"{name} must be a {kind}{where}{_what(what)}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def closest_name(name: str, valid: Iterable[str]) -> str | None:
    """The name of ``valid`` closest to ``name`` (difflib ratio >= 0.6), None if none is that close."""
    found = difflib.get_close_matches(name, list(valid), 1, 0.6)
    return found[0] if found else None


def check_known_keys(
    keys: Iterable[object],
    valid: Iterable[str],
    what: str,
    hint: Callable[[str], str | None] | None = None,
) -> None:
    """Raise ValueError naming every key of ``keys`` that is not in ``valid``, each with a
    did-you-mean where one is found, then the valid keys (in ``valid``'s order).

    Args:
        keys: The keys given.
        valid: The keys accepted.
        what: Where the keys came from, for the message, e.g. "FPAConfig model overrides".
        hint: key -> the text after "did you mean" (None: no hint); default: the closest valid key,
            quoted (``closest_name``).
    """
    valid = list(valid)
    unknown = sorted(str(k) for k in set(keys) - set(valid))
    if not unknown:
        return
    if hint is None:

        def hint(key: str) -> str | None:
            m = closest_name(key, valid)
            return None if m is None else repr(m)

    hints = [f"{k!r} (did you mean {h}?)" for k in unknown if (h := hint(k))]
    raise ValueError(
        f"unknown keys in {what}: {unknown}" + (f"; {', '.join(hints)}" if hints else "") + f"; valid keys: {valid}"
    )


__all__ = ["check_known_keys", "check_number", "closest_name", "non_negative_int", "positive_int"]
