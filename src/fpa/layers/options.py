"""FPAOptions: every option of a First Passage Attention layer, in one frozen, validated object.

The layer (``FirstPassageAttention(..., options=FPAOptions(...))``), the transformer block and
``make_attention`` (``fpa=``), ``FPAConfig`` (``config.fpa``, a nested dict ``"fpa"`` in
config.json), ``fpa train --model-overrides '{"fpa": {...}}'``, the ``fpa reproduce`` presets and
``fpa synth --fpa-kwargs`` all take this one object (or a dict of its fields). ``FPAOptions()`` is
the library default: the configuration the tuning run selected for the language model (a walk,
no level offset, the full learning rate on the field heads); docs/design.md, "One FPA options
object", says why, and which task sets another.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from fpa.checks import check_known_keys, check_number, closest_name, number_or_numbers

FPA_MODES = ("walk", "free")
LEVEL_OFFSETS = ("none", "head", "token")
WALK_INCREMENTS = ("tanh", "linear", "gated")
BETA_ACTIVATIONS = ("exp", "softplus")


@dataclass(frozen=True)
class FPAOptions:
    """The options of a First Passage Attention layer (docs/fpa.md, "Definitions" and "Level offset").

    Args:
        mode: "walk" (field = cumsum of one learned increment per token; level = field + the level
            offset) or "free" (field and level are two separate linear heads of the hidden state).
        level_offset: Walk mode only. "none" (level = field), "head" (one learned constant per head,
            starting at ``level_offset_init``) or "token" (softplus(u_h . x_t + c_h) per head h and
            token t, c starting at ``level_offset_bias_init``).
        level_offset_init: The starting value of the "head" offset.
        level_offset_bias_init: The starting bias c of the "token" offset (-4: the offset starts
            near softplus(-4) = 0.018).
        walk_increment: Each walk step is ``tanh(w x + b)`` ("tanh": steps in (-1, 1)), the
            unbounded ``w x + b`` ("linear") or ``tanh(w x + b) * sigmoid(w' x + b')`` ("gated":
            saturates at -1, 0 and +1).
        walk_bias_init: The starting bias b of the increment head (< 0 starts the walk as a decay):
            one number for every head, or a list of ``n`` numbers (``n`` dividing the layer's head
            count), each the start of ``num_heads / n`` consecutive heads: heads started at several
            timescales, e.g. ``[walk_bias_matching_fox(2), walk_bias_matching_fox(5)]`` (half the heads
            forget within tens of tokens, half reach hundreds).
        beta_activation: The penalty strength per head is beta = exp(p) ("exp": Adam grows it by a
            factor per step) or softplus(p) ("softplus").
        beta_init: beta starts at softplus(beta_init) under either activation (0.69 for 0).
        field_init_std: The standard deviation of the field, level, increment and offset heads'
            initial weights.
        field_lr_multiplier: The field heads, the level offset and beta (the layer's
            ``field_parameters()``) train at this multiple of the learning rate, in (0, 1000].

    Raises:
        ValueError: A field has the wrong type or value (the message names it and what was
            expected), or a level offset is asked for outside walk mode.
    """

    mode: str = "walk"
    level_offset: str = "none"
    level_offset_init: float = 1.0
    level_offset_bias_init: float = -4.0
    walk_increment: str = "tanh"
    walk_bias_init: float | tuple[float, ...] = 0.0
    beta_activation: str = "exp"
    beta_init: float = 0.0
    field_init_std: float = 0.02
    field_lr_multiplier: float = 1.0

    def __post_init__(self) -> None:
        for name, choices in (
            ("mode", FPA_MODES),
            ("level_offset", LEVEL_OFFSETS),
            ("walk_increment", WALK_INCREMENTS),
            ("beta_activation", BETA_ACTIVATIONS),
        ):
            val = getattr(self, name)
            if not isinstance(val, str) or val not in choices:
                hint = (
                    " (use 'none' for false, 'head' for true)"
                    if name == "level_offset" and isinstance(val, bool)
                    else ""
                )
                raise ValueError(f"FPAOptions.{name} must be one of {choices}, got {val!r}{hint}")
        object.__setattr__(self, "walk_bias_init", number_or_numbers("FPAOptions.walk_bias_init", self.walk_bias_init))
        for name in ("level_offset_init", "level_offset_bias_init", "beta_init", "field_init_std"):
            check_number(f"FPAOptions.{name}", getattr(self, name), low=0.0 if name == "field_init_std" else None)
        check_number("FPAOptions.field_lr_multiplier", self.field_lr_multiplier, low=0.0, high=1e3, low_open=True)
        if self.level_offset != "none" and self.mode != "walk":
            raise ValueError(
                f"FPAOptions.level_offset={self.level_offset!r} needs mode='walk' (it offsets the walk's "
                f"level), got mode={self.mode!r}; mode='free' has its own level head"
            )
        for name in ("level_offset_init", "level_offset_bias_init", "beta_init"):
            object.__setattr__(self, name, float(getattr(self, name)))  # 1 and 1.0: one value, one JSON
        object.__setattr__(self, "field_init_std", float(self.field_init_std))
        object.__setattr__(self, "field_lr_multiplier", float(self.field_lr_multiplier))

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (JSON-serialisable; the inverse of ``from_dict``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | FPAOptions | None, what: str = "FPA options") -> FPAOptions:
        """Options from a dict of (some of) their fields, the rest at their defaults; an FPAOptions
        is returned as is, None gives the defaults. ValueError naming ``what`` for a key that is
        not a field (with a did-you-mean) or a value that is not a dict."""
        if d is None:
            return cls()
        if isinstance(d, FPAOptions):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"{what} must be a dict of FPAOptions fields or an FPAOptions, got {type(d).__name__}")
        check_option_keys(d, what)
        return cls(**d)

    def replace(self, **changes: Any) -> FPAOptions:
        """A copy with ``changes`` (FPAOptions fields; ValueError for any other key)."""
        check_option_keys(changes, "FPAOptions.replace")
        return FPAOptions(**{**self.to_dict(), **changes})


OPTION_NAMES = tuple(f.name for f in fields(FPAOptions))


def check_option_keys(keys, what: str = "FPA options") -> None:
    """ValueError naming every key of ``keys`` that is not an FPAOptions field, with a did-you-mean
    (a flat ``fpa_level_offset`` points to ``{"fpa": {"level_offset": ...}}``'s ``level_offset``)."""
    check_known_keys(keys, OPTION_NAMES, what, hint=_hint)


def _hint(key: str) -> str | None:
    base = key[len("fpa_") :] if key.startswith("fpa_") else key
    m = base if base in OPTION_NAMES else closest_name(base, OPTION_NAMES)
    return None if m is None else repr(m)


def walk_bias_matching_fox(fgate_bias: float, beta_init: float = 0.0) -> float:
    """The ``walk_bias_init`` at which a tanh walk starts as FoX with forget-gate bias ``fgate_bias``.

    At initialisation every walk step is about tanh(b) < 0, so a key ``n`` tokens back has dipped
    ``n |tanh(b)|`` below its level and pays ``beta n |tanh(b)|``, beta = softplus(``beta_init``);
    FoX at bias g pays ``n (-log sigmoid(g))``. Equal per-token penalties give
    b = -atanh(softplus(-g) / softplus(beta_init)) (-0.185 for g = 2 and beta_init 0). A walk
    started at b = 0 has no recency signal until it learns one.

    Raises:
        ValueError: A value that is not a finite number, or a FoX decay the walk cannot match
            (softplus(-g) >= softplus(beta_init): the step would need |tanh(b)| >= 1).
    """
    check_number("fgate_bias", fgate_bias)
    check_number("beta_init", beta_init)
    ratio = math.log1p(math.exp(-fgate_bias)) / math.log1p(math.exp(beta_init))
    if ratio >= 1.0:
        raise ValueError(
            f"fgate_bias={fgate_bias!r} decays by {math.log1p(math.exp(-fgate_bias)):.3f} per token, more than a "
            f"tanh walk at beta_init={beta_init!r} can (< {math.log1p(math.exp(beta_init)):.3f}); raise fgate_bias "
            "or beta_init"
        )
    return -math.atanh(ratio)


__all__ = [
    "BETA_ACTIVATIONS",
    "FPA_MODES",
    "LEVEL_OFFSETS",
    "OPTION_NAMES",
    "WALK_INCREMENTS",
    "FPAOptions",
    "check_option_keys",
    "walk_bias_matching_fox",
]
