"""FPAConfig: a decoder-only language model config with a switchable attention type."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Iterable

from transformers import PretrainedConfig

from fpa.layers.attention import (
    ATTENTION_TYPES,
    BETA_ACTIVATIONS,
    FPA_CONFIG_FIELDS,
    FPA_MODES,
    LEVEL_OFFSETS,
    WALK_INCREMENTS,
    config_layer_kwargs,
)

# The FPA walk's parametrisation, versioned by the config field ``fpa_parametrisation``
# (docs/fpa.md, "Parametrisation and its versions"). Each version's defaults fill the fpa_* fields a
# config does not give. A new FPAConfig is version 2 (CURRENT); a config dict without the field (a
# config.json saved before it existed) loads as version 1 (LEGACY: FPAConfig.from_dict), which is
# what such models were trained with. The default level offset applies in walk mode only: in free
# mode (and for the other attention types) it is "none" whatever the version.
FPA_PARAMETRISATION_LEGACY_VERSION = 1
FPA_PARAMETRISATION_CURRENT_VERSION = 2
FPA_PARAMETRISATION_CURRENT = dict(
    fpa_walk_increment="tanh",
    fpa_walk_bias_init=0.0,
    fpa_beta_activation="exp",
    fpa_field_lr_multiplier=1.0,
    fpa_level_offset="head",
    fpa_level_offset_init=1.0,
)
FPA_PARAMETRISATION_LEGACY = dict(
    fpa_walk_increment="linear",
    fpa_walk_bias_init=0.0,
    fpa_beta_activation="softplus",
    fpa_field_lr_multiplier=0.1,
    fpa_level_offset="none",
    fpa_level_offset_init=0.0,
)
FPA_PARAMETRISATIONS = {
    FPA_PARAMETRISATION_LEGACY_VERSION: FPA_PARAMETRISATION_LEGACY,
    FPA_PARAMETRISATION_CURRENT_VERSION: FPA_PARAMETRISATION_CURRENT,
}

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
# with the rule ">0", ">=0" or "any"; "choice": one of the listed values (of the same type: 1 is
# not True). fpa_level_offset: "none", "head" or "token" ("head"/"token" need fpa_mode="walk");
# fpa_parametrisation: the version whose defaults fill the fpa_* fields not given.
FieldRule = tuple[object, ...] | str | None  # a "choice" field's values, a "real" field's rule, or None
FIELDS: dict[str, tuple[str, FieldRule]] = {
    "vocab_size": ("int", None),
    "hidden_size": ("int", None),
    "num_hidden_layers": ("int", None),
    "num_attention_heads": ("int", None),
    "num_key_value_heads": ("int", None),
    "intermediate_size": ("int", None),
    "attention": ("choice", ATTENTION_TYPES),
    "fpa_mode": ("choice", FPA_MODES),
    "fpa_parametrisation": ("choice", tuple(FPA_PARAMETRISATIONS)),
    "qk_norm": ("bool", None),
    "output_gate": ("bool", None),
    "fpa_level_offset": ("choice", LEVEL_OFFSETS),
    "fpa_level_offset_bias_init": ("real", "any"),
    "fpa_level_offset_init": ("real", "any"),
    "tie_word_embeddings": ("bool", None),
    "fpa_beta_init": ("real", "any"),
    "fpa_field_lr_multiplier": ("real", ">=0"),
    "fpa_walk_increment": ("choice", WALK_INCREMENTS),
    "fpa_walk_bias_init": ("real", "any"),
    "fpa_beta_activation": ("choice", BETA_ACTIVATIONS),
    "fox_fgate_bias_init": ("real", "any"),
    "rope_theta": ("real", ">0"),
    "rms_norm_eps": ("real", ">0"),
    "initializer_range": ("real", ">=0"),
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
        if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
            raise ValueError(f"FPAConfig {name} must be a positive integer, got {got}")
    elif kind == "bool":
        if not isinstance(val, bool):
            raise ValueError(f"FPAConfig {name} must be true or false (a bool), got {got}")
    elif kind == "choice":
        rule = field_choices(name)
        if not any(
            isinstance(val, type(r)) and isinstance(val, bool) == isinstance(r, bool) and val == r for r in rule
        ):
            hint = (
                "; use 'none' (was false) or 'head' (was true)"
                if name == "fpa_level_offset" and isinstance(val, bool)
                else ""
            )
            raise ValueError(f"FPAConfig {name} must be one of {tuple(rule)}, got {got}{hint}")
    else:
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
            raise ValueError(f"FPAConfig {name} must be a finite number, got {got}")
        if (rule == ">0" and val <= 0) or (rule == ">=0" and val < 0):
            raise ValueError(f"FPAConfig {name} must be {rule[:-1]} 0, got {got}")


def check_keys(keys: Iterable[str], what: str = "model overrides") -> None:
    """Raise ValueError naming every key that is not an FPAConfig field, and the valid ones."""
    unknown = sorted(set(keys) - set(FIELDS))
    if unknown:
        hints = [f"{k!r} (did you mean {m[0]!r}?)" for k in unknown if (m := difflib.get_close_matches(k, FIELDS, 1))]
        raise ValueError(
            f"unknown FPAConfig keys in {what}: {unknown}"
            + (f"; {', '.join(hints)}" if hints else "")
            + f"; valid keys: {sorted(FIELDS)}"
        )


class FPAConfig(PretrainedConfig):
    """Every field is validated (type and range, see FIELDS) on construction, which includes
    from_pretrained (config.json), so a bad value fails with a ValueError naming it. Extra keyword
    arguments go to transformers' PretrainedConfig (it accepts arbitrary ones); one that looks
    like a misspelt FPAConfig field (e.g. "hiden_size") is rejected. from_preset takes FPAConfig
    fields only.

    ``fpa_parametrisation`` (1 or 2, default 2) is the version of the FPA walk's parametrisation
    whose defaults (FPA_PARAMETRISATIONS) fill the fpa_* fields left None; a saved config dict
    without it is version 1 (``from_dict``). ``fpa_level_offset``: "none", "head" or "token"; None
    is the version's default in walk mode ("head" in version 2) and "none" otherwise."""

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
        fpa_mode="walk",
        qk_norm=False,
        output_gate=False,
        fpa_level_offset=None,
        fpa_beta_init=0.0,
        fpa_field_lr_multiplier=None,
        fpa_walk_increment=None,
        fpa_walk_bias_init=None,
        fpa_beta_activation=None,
        fox_fgate_bias_init=5.0,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=True,
        fpa_level_offset_bias_init=-4.0,
        fpa_level_offset_init=None,
        fpa_parametrisation=FPA_PARAMETRISATION_CURRENT_VERSION,
        **kwargs,
    ):
        if num_key_value_heads is None:
            num_key_value_heads = num_attention_heads
        check_field("fpa_parametrisation", fpa_parametrisation)
        defaults = FPA_PARAMETRISATIONS[fpa_parametrisation]
        given = dict(
            fpa_field_lr_multiplier=fpa_field_lr_multiplier,
            fpa_walk_increment=fpa_walk_increment,
            fpa_walk_bias_init=fpa_walk_bias_init,
            fpa_beta_activation=fpa_beta_activation,
            fpa_level_offset=fpa_level_offset,
            fpa_level_offset_init=fpa_level_offset_init,
        )
        param = {k: defaults[k] if v is None else v for k, v in given.items()}
        if fpa_level_offset is None and not (attention == "fpa" and fpa_mode == "walk"):
            param["fpa_level_offset"] = "none"  # the default offset exists in walk mode only
        fpa_level_offset = param["fpa_level_offset"]
        values = dict(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            intermediate_size=intermediate_size,
            attention=attention,
            fpa_mode=fpa_mode,
            qk_norm=qk_norm,
            output_gate=output_gate,
            fpa_level_offset_bias_init=fpa_level_offset_bias_init,
            tie_word_embeddings=tie_word_embeddings,
            fpa_beta_init=fpa_beta_init,
            **param,
            fox_fgate_bias_init=fox_fgate_bias_init,
            rope_theta=rope_theta,
            rms_norm_eps=rms_norm_eps,
            initializer_range=initializer_range,
        )
        for name, val in values.items():
            check_field(name, val)
        typos = [k for k in kwargs if k not in _GENERIC_KEYS and difflib.get_close_matches(k, FIELDS, 1, 0.8)]
        if typos:
            check_keys(typos, "FPAConfig arguments")
        if attention == "fpa" and fpa_mode != "walk" and fpa_level_offset in ("head", "token"):
            raise ValueError(
                f"FPAConfig fpa_level_offset={fpa_level_offset!r} needs fpa_mode='walk' (it offsets "
                f"the walk's level), got fpa_mode={fpa_mode!r}"
            )
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})"
            )
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({num_key_value_heads})"
            )
        self.fpa_parametrisation = fpa_parametrisation
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        self.num_attention_heads, self.num_key_value_heads = num_attention_heads, num_key_value_heads
        self.intermediate_size, self.attention, self.fpa_mode = intermediate_size, attention, fpa_mode
        self.qk_norm, self.output_gate, self.fpa_level_offset = qk_norm, output_gate, fpa_level_offset
        self.fpa_level_offset_bias_init = fpa_level_offset_bias_init
        self.fpa_level_offset_init = param["fpa_level_offset_init"]
        self.fpa_beta_init, self.fox_fgate_bias_init, self.rope_theta = fpa_beta_init, fox_fgate_bias_init, rope_theta
        self.fpa_field_lr_multiplier = param["fpa_field_lr_multiplier"]
        self.fpa_walk_increment, self.fpa_walk_bias_init = param["fpa_walk_increment"], param["fpa_walk_bias_init"]
        self.fpa_beta_activation = param["fpa_beta_activation"]
        self.rms_norm_eps, self.initializer_range = rms_norm_eps, initializer_range
        # transformers takes tie_word_embeddings through **kwargs; its __init__ signature does not list it
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)  # type: ignore[call-arg]

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """A config from a saved dict (what from_pretrained reads from config.json). A dict without
        ``fpa_parametrisation`` predates the field: version 1 (FPA_PARAMETRISATION_LEGACY), whose
        defaults fill only the fpa_* keys it does not give. A boolean ``fpa_level_offset`` (saved
        before "none"/"head"/"token") maps false -> "none", true -> "head" (-> "none" outside
        walk mode, where true was always ignored)."""
        d = dict(config_dict)
        d.setdefault("fpa_parametrisation", FPA_PARAMETRISATION_LEGACY_VERSION)
        if isinstance(d.get("fpa_level_offset"), bool):
            default = {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items()}
            walk = (
                d.get("attention", default["attention"]) == "fpa" and d.get("fpa_mode", default["fpa_mode"]) == "walk"
            )  # a missing key: the constructor's default
            d["fpa_level_offset"] = "head" if d["fpa_level_offset"] and walk else "none"
        return super().from_dict(d, **kwargs)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> FPAConfig:
        """A preset with overrides; every override must be an FPAConfig field (else ValueError
        listing the valid ones)."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {name!r}")
        check_keys(overrides)
        return cls(**{**PRESETS[name], **overrides})

    def attention_kwargs(self) -> dict:
        """The keyword arguments of every layer's ``make_attention``: the fpa_* fields under the
        layer's names (fpa.layers.config_layer_kwargs) for FPA, the fox_* / rope field otherwise."""
        kw = dict(qk_norm=self.qk_norm, output_gate=self.output_gate)
        if self.attention == "fpa":
            kw.update(fpa_mode=self.fpa_mode, **config_layer_kwargs({k: getattr(self, k) for k in FPA_CONFIG_FIELDS}))
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
