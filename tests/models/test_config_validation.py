"""FPAConfig / TrainConfig validation: every field's type and range, unknown keys with the valid ones."""

from __future__ import annotations

import math

import pytest

from fpa.data import ByteTokenizer
from fpa.models import FPAConfig
from fpa.models.configuration_fpa import (
    FIELDS,
    FPA_PARAMETRISATION_CURRENT,
    FPA_PARAMETRISATION_LEGACY,
    FPA_PARAMETRISATIONS,
    PRESETS,
)
from fpa.train import TrainConfig

BAD: dict[object, list[object]] = {  # kind / rule -> bad values
    "int": [0, -1, 2.0, "4", True, None],
    "bool": ["no", "false", 0, 1, None],
    "choice": ["bogus", None, 1],
    ("real", "any"): [math.nan, math.inf, "1", True, None],
    ("real", ">0"): [0, -1, -1e-9, math.nan, math.inf, "1", True],
    ("real", ">=0"): [-1, -1e-9, math.nan, -math.inf, "0.1", False],
}


def _bad_values(name: str) -> list:
    kind, rule = FIELDS[name]
    if name == "fpa_parametrisation":  # a choice of ints
        return [0, 3, True, 2.0, "2", None]
    vals = BAD[(kind, rule)] if kind == "real" else BAD[kind]
    # None means a default: num_key_value_heads = num_attention_heads; the parametrisation keys
    # (FPA_PARAMETRISATION_CURRENT, or _LEGACY for a config.json that predates them)
    defaulted = name == "num_key_value_heads" or name in FPA_PARAMETRISATION_CURRENT
    return [v for v in vals if not (defaulted and v is None)]


def test_every_field_is_covered():
    import inspect

    params = set(inspect.signature(FPAConfig.__init__).parameters) - {"self", "kwargs"}
    assert params == set(FIELDS)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_bad_value_of_every_field_is_named(name):
    for val in _bad_values(name):
        kw = {name: val}
        with pytest.raises(ValueError, match=f"FPAConfig {name} must be"):
            FPAConfig(**kw)


def test_issue_examples():
    with pytest.raises(ValueError, match="qk_norm must be true or false.*'no'"):
        FPAConfig(qk_norm="no")
    with pytest.raises(ValueError, match="rope_theta must be > 0, got -1"):
        FPAConfig(rope_theta=-1)
    with pytest.raises(ValueError, match="rms_norm_eps must be > 0, got -1"):
        FPAConfig(rms_norm_eps=-1)
    with pytest.raises(ValueError, match="fpa_field_lr_multiplier must be >= 0"):
        FPAConfig(fpa_field_lr_multiplier=-0.1)


def test_good_values_accepted_and_round_trip(tmp_path):
    c = FPAConfig(
        qk_norm=True,
        rope_theta=500000,
        rms_norm_eps=1e-5,
        fpa_field_lr_multiplier=0.0,
        fpa_beta_init=-2.0,
        initializer_range=0.0,
        num_key_value_heads=2,
        attention="fox",
    )
    c.save_pretrained(tmp_path)
    d = FPAConfig.from_pretrained(tmp_path)
    assert (d.qk_norm, d.rope_theta, d.fpa_field_lr_multiplier, d.num_key_value_heads) == (True, 500000, 0.0, 2)


def test_unknown_keys_listed_with_valid_ones():
    with pytest.raises(ValueError, match=r"\['hiden_size'\].*did you mean 'hidden_size'.*valid keys: \['attention'"):
        FPAConfig.from_preset("tiny", hiden_size=32)
    with pytest.raises(ValueError, match=r"unknown FPAConfig keys.*\['foo'\]"):
        FPAConfig.from_preset("tiny", foo=1)
    with pytest.raises(ValueError, match="did you mean 'qk_norm'"):
        FPAConfig(qk_nrom=True)  # a misspelt field passed directly
    FPAConfig(use_cache=True, torch_dtype="float32")  # transformers' own keys still pass


def test_bad_config_json_fails_on_load(tmp_path):
    import json

    FPAConfig().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    for key, val, words in (
        ("rope_theta", -1, "rope_theta must be > 0"),
        ("hiden_size", 3, "did you mean"),
        ("qk_norm", "no", "qk_norm must be"),
    ):
        (tmp_path / "config.json").write_text(json.dumps({**d, key: val}))
        with pytest.raises(ValueError, match=words):
            FPAConfig.from_pretrained(tmp_path)


def test_tiny_preset_fits_the_byte_tokenizer():
    assert PRESETS["tiny"]["vocab_size"] == ByteTokenizer.vocab_size == FPAConfig().vocab_size == 257


@pytest.mark.parametrize(
    "over, words",
    [
        ({"hiden_size": 32}, "unknown FPAConfig keys in model_overrides"),
        ({"qk_norm": "no"}, "qk_norm must be true or false"),
        ({"rms_norm_eps": -1}, "rms_norm_eps must be > 0"),
        ({"attention": "fox"}, "set attention with the training config's own"),
        ({"num_attention_heads": 3}, r"hidden_size \(128\) must be divisible by num_attention_heads \(3\)"),
    ],
)
def test_train_config_checks_model_overrides(over, words):
    with pytest.raises(ValueError, match=words):
        TrainConfig(out_dir="x", model_overrides=over)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(preset="huge"), "preset must be one of"),
        (dict(attention="linear"), "attention must be one of"),
        (dict(fpa_mode="bogus"), "fpa_mode must be one of"),
        (dict(tokenizer="wordpiece"), "tokenizer must be one of"),
        (dict(vocab_size=0), "vocab_size must be None or a positive int"),
    ],
)
def test_train_config_checks_model_choices(kw, words):
    with pytest.raises(ValueError, match=words):
        TrainConfig(out_dir="x", **kw)


def test_parametrisation_defaults_new_config_and_legacy_config_json(tmp_path):
    import json

    new = FPAConfig(attention="fpa", fpa_mode="walk")
    assert new.fpa_parametrisation == 2 and FPA_PARAMETRISATIONS == {
        1: FPA_PARAMETRISATION_LEGACY,
        2: FPA_PARAMETRISATION_CURRENT,
    }
    assert {k: getattr(new, k) for k in FPA_PARAMETRISATION_CURRENT} == FPA_PARAMETRISATION_CURRENT
    new.save_pretrained(tmp_path / "new")
    assert json.loads((tmp_path / "new" / "config.json").read_text())["fpa_parametrisation"] == 2
    again = FPAConfig.from_pretrained(tmp_path / "new")
    assert again.fpa_parametrisation == 2
    assert {k: getattr(again, k) for k in FPA_PARAMETRISATION_CURRENT} == FPA_PARAMETRISATION_CURRENT
    # a config.json written before the keys existed: the parametrisation it was trained with
    d = json.loads((tmp_path / "new" / "config.json").read_text())
    for k in [*FPA_PARAMETRISATION_CURRENT, "fpa_parametrisation"]:
        d.pop(k)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(d))
    old = FPAConfig.from_pretrained(tmp_path / "old")
    assert old.fpa_parametrisation == 1
    assert {k: getattr(old, k) for k in FPA_PARAMETRISATION_LEGACY} == FPA_PARAMETRISATION_LEGACY
    kw = old.attention_kwargs()
    assert (kw["walk_increment"], kw["beta_activation"], kw["walk_bias_init"]) == ("linear", "softplus", 0.0)
    # ... saved again, it names its version and reloads the same
    old.save_pretrained(tmp_path / "resaved")
    resaved = FPAConfig.from_pretrained(tmp_path / "resaved")
    assert {k: getattr(resaved, k) for k in FIELDS} == {k: getattr(old, k) for k in FIELDS}


def test_version_defaults_fill_only_the_keys_not_given():
    """A dict without fpa_parametrisation is version 1, but what it names wins; FPAConfig(**kw)
    never sniffs its arguments (transformers_version included): it is version 2 unless told."""
    d = FPAConfig(fpa_mode="walk").to_dict()
    del d["fpa_parametrisation"], d["fpa_beta_activation"], d["fpa_field_lr_multiplier"]
    c = FPAConfig.from_dict(d)
    assert c.fpa_parametrisation == 1
    assert (c.fpa_walk_increment, c.fpa_level_offset, c.fpa_level_offset_init) == ("tanh", "head", 1.0)  # given
    assert (c.fpa_beta_activation, c.fpa_field_lr_multiplier) == ("softplus", 0.1)  # version 1's defaults
    assert FPAConfig(transformers_version="4.0.0", fpa_mode="walk").fpa_walk_increment == "tanh"
    one = FPAConfig(fpa_parametrisation=1, fpa_mode="walk")
    assert {k: getattr(one, k) for k in FPA_PARAMETRISATION_LEGACY} == FPA_PARAMETRISATION_LEGACY
    two = FPAConfig.from_dict({**d, "fpa_parametrisation": 2})
    assert (two.fpa_beta_activation, two.fpa_field_lr_multiplier) == ("exp", 1.0)


def test_level_offset_values():
    assert FPAConfig(fpa_mode="walk", fpa_level_offset="token").attention_kwargs()["level_offset"] == "token"
    assert FPAConfig(fpa_mode="walk", fpa_level_offset="head").attention_kwargs()["level_offset"] == "head"
    assert FPAConfig(fpa_mode="walk", fpa_level_offset="none").attention_kwargs()["level_offset"] == "none"
    assert FPAConfig(fpa_mode="free", fpa_level_offset="none").attention_kwargs()["level_offset"] == "none"
    for mode, val in (("free", "token"), ("free", "head")):
        with pytest.raises(ValueError, match=f"fpa_level_offset='{val}' needs fpa_mode='walk'.*got fpa_mode='free'"):
            FPAConfig(fpa_mode=mode, fpa_level_offset=val)
    for bad in ("Token", 1, 0, "auto"):
        with pytest.raises(ValueError, match=r"fpa_level_offset must be one of \('none', 'head', 'token'\)"):
            FPAConfig(fpa_mode="walk", fpa_level_offset=bad)
    for bad in (True, False):  # a bool is refused, with the string to use
        with pytest.raises(ValueError, match=r"fpa_level_offset must be one of .* use 'none' \(was false\) or 'head'"):
            FPAConfig(fpa_mode="walk", fpa_level_offset=bad)
    # the default (None): a head offset starting at 1 in walk mode, none in free mode or for other attention
    walk = FPAConfig(fpa_mode="walk")
    assert (walk.fpa_level_offset, walk.fpa_level_offset_init) == ("head", 1.0)
    assert walk.attention_kwargs()["level_offset"] == "head" and walk.attention_kwargs()["level_offset_init"] == 1.0
    assert FPAConfig(fpa_mode="free").fpa_level_offset == "none"
    assert FPAConfig(attention="fox").fpa_level_offset == "none"
    FPAConfig(attention="fox", fpa_level_offset="token")  # an fpa_* key, unused by other attention types


@pytest.mark.parametrize(
    "saved, mode, loads",
    [(False, "walk", "none"), (True, "walk", "head"), (False, "free", "none"), (True, "free", "none")],
)
def test_saved_boolean_level_offset_still_loads(tmp_path, saved, mode, loads):
    """config.json files saved with fpa_level_offset false / true (before "none"/"head"/"token")
    load as "none" / "head"; true in free mode was always ignored, so it loads as "none"."""
    import json

    FPAConfig(fpa_mode=mode).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**d, "fpa_level_offset": saved}))
    c = FPAConfig.from_pretrained(tmp_path)
    assert c.fpa_level_offset == loads and c.fpa_parametrisation == 2  # the file names its version


def test_synth_and_train_take_the_config_names():
    """One set of names: FPAConfig's fpa_* fields map to the layer's arguments by dropping "fpa_"."""
    from fpa.layers import FirstPassageAttention
    from fpa.layers.attention import FPA_CONFIG_FIELDS, config_layer_kwargs

    assert set(FPA_CONFIG_FIELDS) == {k for k in FIELDS if k.startswith("fpa_")} - {"fpa_mode", "fpa_parametrisation"}
    kw = config_layer_kwargs({k: getattr(FPAConfig(fpa_mode="walk"), k) for k in FPA_CONFIG_FIELDS})
    FirstPassageAttention(16, 2, mode="walk", **kw)  # every mapped name is a layer argument
    with pytest.raises(ValueError, match=r"unknown FPA arguments \['level_offset'\].*did you mean 'fpa_level_offset'"):
        config_layer_kwargs({"level_offset": "none"})
