"""FPAConfig: a decoder-only language model config with a switchable attention type; the FPA
options are one nested ``FPAOptions`` (``config.fpa``, a dict under "fpa" in config.json)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from transformers import PretrainedConfig

from fpa.checks import (
    check_known_keys,
    check_number,
    closest_name,
    non_negative_int,
    number_or_numbers,
    positive_int,
    spread_over_heads,
)
from fpa.layers.attention import ATTENTION_TYPES
from fpa.layers.options import OPTION_NAMES, FPAOptions

PRESETS = {
    # tiny: vocab 257 = the byte tokenizer (256 bytes + eos), which every CPU recipe uses
    "tiny": dict(
        vocab_size=257,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=352,
    ),
    "small": dict(
        vocab_size=32000,
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        intermediate_size=1408,
    ),
    "110m": dict(
        vocab_size=32000,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        intermediate_size=2048,
    ),
}

# Every FPAConfig field: (kind, rule). kind "int": a positive int; "bool"; "real": a finite number
# with the rule ">0", ">=0" or "any"; "reals": a number or a non-empty list of numbers (one per group
# of heads, fpa.checks.spread_over_heads); "choice": one of the listed values (of the same type: 1 is
# not True); "fpa": the FPA options (an FPAOptions or a dict of its fields); "token": a token id
# (None or an int >= 0).
FieldRule = tuple[object, ...] | str | None  # a "choice" field's values, a "real" field's rule, or None
FIELDS: dict[str, tuple[str, FieldRule]] = {
    "vocab_size": ("int", None),
    "hidden_size": ("int", None),
    "num_hidden_layers": ("int", None),
    "num_attention_heads": ("int", None),
    "num_key_value_heads": ("int", None),
    "intermediate_size": ("int", None),
    "attention": ("choice", ATTENTION_TYPES),
    "fpa": ("fpa", None),
    "qk_norm": ("bool", None),
    "output_gate": ("bool", None),
    "key_shift": ("bool", None),
    "key_shift_bias_init": ("real", "any"),
    "tie_word_embeddings": ("bool", None),
    "fox_fgate_bias_init": ("reals", None),
    "rope_theta": ("real", ">0"),
    "rms_norm_eps": ("real", ">0"),
    "initializer_range": ("real", ">=0"),
    "pad_token_id": ("token", None),
    "bos_token_id": ("token", None),
    "eos_token_id": ("token", None),
}


def field_choices(name: str) -> tuple[object, ...]:
    """The values a "choice" field of FPAConfig accepts.

    Raises:
        ValueError: ``name`` is not a "choice" field.
    """
    kind, rule = FIELDS[name]
    if kind != "choice" or not isinstance(rule, tuple):
        raise ValueError(f"FPAConfig {name} is a {kind!r} field, not a choice")
    return rule


def check_field(name: str, val: object) -> None:
    """Raise ValueError unless val is a valid value of FPAConfig field `name`."""
    kind, rule = FIELDS[name]
    got = f"{val!r} ({type(val).__name__})"
    if kind == "int":
        positive_int(f"FPAConfig {name}", val)
    elif kind == "bool":
        if not isinstance(val, bool):
            raise ValueError(f"FPAConfig {name} must be true or false (a bool), got {got}")
    elif kind == "token":
        if val is not None:
            non_negative_int(f"FPAConfig {name}", val, "a token id, or None")
    elif kind == "reals":
        number_or_numbers(f"FPAConfig {name}", val)
    elif kind == "fpa":
        FPAOptions.from_dict(val, "FPAConfig fpa")  # type: ignore[arg-type]
    elif kind == "choice":
        rule = field_choices(name)
        if not any(
            isinstance(val, type(r)) and isinstance(val, bool) == isinstance(r, bool) and val == r for r in rule
        ):
            raise ValueError(f"FPAConfig {name} must be one of {tuple(rule)}, got {got}")
    else:
        check_number(f"FPAConfig {name}", val, low=None if rule == "any" else 0, low_open=rule == ">0")


def _hint(key: str) -> str | None:
    """A did-you-mean for a key that is not an FPAConfig field: a flat FPA option (``fpa_mode``,
    ``fpa_level_offset``, ``level_offset``) points to its nested spelling."""
    opt = key[len("fpa_") :] if key.startswith("fpa_") else key
    if opt in OPTION_NAMES:
        return f'{{"fpa": {{"{opt}": ...}}}}'
    m = closest_name(key, FIELDS)
    return None if m is None else repr(m)


def check_keys(keys: Iterable[str], what: str = "model overrides") -> None:
    """Raise ValueError naming every key that is not an FPAConfig field, and the valid ones."""
    check_known_keys(keys, sorted(FIELDS), f"FPAConfig {what}", hint=_hint)


class FPAConfig(PretrainedConfig):
    """Every field is validated (type and range, see FIELDS) on construction, which includes
    from_pretrained (config.json), so a bad value fails with a ValueError naming it. Extra keyword
    arguments go to transformers' PretrainedConfig (it accepts arbitrary ones); one that looks
    like a misspelt FPAConfig field (e.g. "hiden_size") or a flat FPA option (e.g.
    "fpa_level_offset") is rejected. from_preset takes FPAConfig fields only.

    ``fpa`` is the FPA options (fpa.layers.FPAOptions, or a dict of its fields; default
    ``FPAOptions()``), read by the layers when ``attention="fpa"``; ``config.fpa`` is always an
    FPAOptions, saved as a nested dict. ``pad_token_id``, ``bos_token_id``, ``eos_token_id`` are
    None unless given (``generate`` reads them; ``fpa train`` sets pad = eos = the tokenizer's
    end-of-text id in the folders it writes)."""

    model_type = "fpa"

    def __init__(
        self,
        vocab_size=257,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=None,
        intermediate_size=352,
        attention="fpa",
        fpa: FPAOptions | dict | None = None,
        qk_norm=False,
        output_gate=False,
        key_shift=False,
        key_shift_bias_init=0.0,
        fox_fgate_bias_init=5.0,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=True,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        **kwargs,
    ):
        if num_key_value_heads is None:
            num_key_value_heads = num_attention_heads
        values: dict[str, Any] = dict(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            intermediate_size=intermediate_size,
            attention=attention,
            fpa=fpa,
            qk_norm=qk_norm,
            output_gate=output_gate,
            key_shift=key_shift,
            key_shift_bias_init=key_shift_bias_init,
            tie_word_embeddings=tie_word_embeddings,
            fox_fgate_bias_init=fox_fgate_bias_init,
            rope_theta=rope_theta,
            rms_norm_eps=rms_norm_eps,
            initializer_range=initializer_range,
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
        )
        for name, val in values.items():
            check_field(name, val)
        typos = [
            k
            for k in kwargs
            if k not in _GENERIC_KEYS
            and (k.startswith("fpa_") or k in OPTION_NAMES or difflib.get_close_matches(k, FIELDS, 1, 0.8))
        ]
        if typos:
            check_keys(typos, "arguments")
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})"
            )
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({num_key_value_heads})"
            )
        if key_shift_bias_init != 0 and not key_shift:
            raise ValueError(f"FPAConfig key_shift_bias_init={key_shift_bias_init!r} needs key_shift=True")
        # per-head starts must fit the head count now, not when the model is built
        spread_over_heads("FPAConfig fox_fgate_bias_init", fox_fgate_bias_init, num_attention_heads)
        options = FPAOptions.from_dict(fpa)
        spread_over_heads("FPAConfig fpa.walk_bias_init", options.walk_bias_init, num_attention_heads)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if values[name] is not None and values[name] >= vocab_size:
                raise ValueError(f"FPAConfig {name} must be < vocab_size ({vocab_size}), got {values[name]}")
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        self.num_attention_heads, self.num_key_value_heads = num_attention_heads, num_key_value_heads
        self.intermediate_size, self.attention = intermediate_size, attention
        self.fpa = options
        self.qk_norm, self.output_gate, self.key_shift = qk_norm, output_gate, key_shift
        self.key_shift_bias_init = key_shift_bias_init
        self.fox_fgate_bias_init = number_or_numbers("FPAConfig fox_fgate_bias_init", fox_fgate_bias_init)
        self.rope_theta = rope_theta
        self.rms_norm_eps, self.initializer_range = rms_norm_eps, initializer_range
        self.pad_token_id, self.bos_token_id, self.eos_token_id = pad_token_id, bos_token_id, eos_token_id
        # transformers takes tie_word_embeddings through **kwargs; its __init__ signature does not list it
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)  # type: ignore[call-arg]

    def to_dict(self) -> dict[str, Any]:
        """transformers' dict of the config (what config.json holds), with ``fpa`` as a plain dict
        of its fields (``FPAConfig(**d)`` / ``from_dict`` rebuild the FPAOptions)."""
        d = super().to_dict()
        d["fpa"] = self.fpa.to_dict()
        return d

    @classmethod
    def from_preset(cls, name: str, **overrides) -> FPAConfig:
        """A preset with overrides; every override must be an FPAConfig field (else ValueError
        listing the valid ones)."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {name!r}")
        check_keys(overrides)
        return cls(**{**PRESETS[name], **overrides})

    def attention_kwargs(self) -> dict:
        """The keyword arguments of every layer's ``make_attention``: ``fpa`` (the FPAOptions) for
        FPA, the fox_* / rope field otherwise."""
        kw: dict[str, Any] = dict(
            qk_norm=self.qk_norm,
            output_gate=self.output_gate,
            key_shift=self.key_shift,
            key_shift_bias_init=self.key_shift_bias_init,
        )
        if self.attention == "fpa":
            kw.update(fpa=self.fpa)
        elif self.attention == "fox":
            kw.update(fgate_bias_init=self.fox_fgate_bias_init)
        elif self.attention.startswith("softmax"):
            kw.update(rope_theta=self.rope_theta)
        return kw


# keys transformers itself may pass to a config (saved in config.json or set by from_pretrained)
_GENERIC_KEYS = {
    "transformers_version",
    "architectures",
    "output_hidden_states",
    "return_dict",
    "dtype",
    "torch_dtype",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "id2label",
    "label2id",
    "problem_type",
    "num_labels",
    "name_or_path",
    "_name_or_path",
    "_commit_hash",
    "model_type",
    "output_attentions",
    "attn_implementation",
    "experts_implementation",
    "use_cache",
}
