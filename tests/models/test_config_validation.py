"""FPAConfig / TrainConfig validation: every field's type and range, unknown keys with the valid ones."""

from __future__ import annotations

import math

import pytest

from fpa.data import ByteTokenizer
from fpa.models import FPAConfig
from fpa.models.configuration_fpa import FIELDS, FPA_PARAMETRISATION_CURRENT, FPA_PARAMETRISATION_LEGACY, PRESETS
from fpa.train import TrainConfig

BAD = {  # kind / rule -> bad values
    "int": [0, -1, 2.0, "4", True, None],
    "bool": ["no", "false", 0, 1, None],
    "choice": ["bogus", None, 1],
    ("real", "any"): [math.nan, math.inf, "1", True, None],
    ("real", ">0"): [0, -1, -1e-9, math.nan, math.inf, "1", True],
    ("real", ">=0"): [-1, -1e-9, math.nan, -math.inf, "0.1", False],
}


def _bad_values(name: str) -> list:
    kind, rule = FIELDS[name]
    vals = BAD[(kind, rule)] if kind == "real" else BAD[kind]
    # None means a default: num_key_value_heads = num_attention_heads; the parametrisation keys
    # (FPA_PARAMETRISATION_CURRENT, or _LEGACY for a config.json that predates them)
    return [v for v in vals if not ((name == "num_key_value_heads" or name in FPA_PARAMETRISATION_CURRENT) and v is None)]


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
    c = FPAConfig(qk_norm=True, rope_theta=500000, rms_norm_eps=1e-5, fpa_field_lr_multiplier=0.0,
                  fpa_beta_init=-2.0, initializer_range=0.0, num_key_value_heads=2, attention="fox")
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
    for key, val, words in (("rope_theta", -1, "rope_theta must be > 0"), ("hiden_size", 3, "did you mean"),
                            ("qk_norm", "no", "qk_norm must be")):
        (tmp_path / "config.json").write_text(json.dumps({**d, key: val}))
        with pytest.raises(ValueError, match=words):
            FPAConfig.from_pretrained(tmp_path)


def test_tiny_preset_fits_the_byte_tokenizer():
    assert PRESETS["tiny"]["vocab_size"] == ByteTokenizer.vocab_size == FPAConfig().vocab_size == 257


@pytest.mark.parametrize("over, words", [
    ({"hiden_size": 32}, "unknown FPAConfig keys in model_overrides"),
    ({"qk_norm": "no"}, "qk_norm must be true or false"),
    ({"rms_norm_eps": -1}, "rms_norm_eps must be > 0"),
    ({"attention": "fox"}, "set attention with the training config's own"),
    ({"num_attention_heads": 3}, r"hidden_size \(128\) must be divisible by num_attention_heads \(3\)"),
])
def test_train_config_checks_model_overrides(over, words):
    with pytest.raises(ValueError, match=words):
        TrainConfig(out_dir="x", model_overrides=over)


@pytest.mark.parametrize("kw, words", [
    (dict(preset="huge"), "preset must be one of"), (dict(attention="linear"), "attention must be one of"),
    (dict(fpa_mode="bogus"), "fpa_mode must be one of"), (dict(tokenizer="wordpiece"), "tokenizer must be one of"),
    (dict(vocab_size=0), "vocab_size must be None or a positive int"),
])
def test_train_config_checks_model_choices(kw, words):
    with pytest.raises(ValueError, match=words):
        TrainConfig(out_dir="x", **kw)


def test_parametrisation_defaults_new_config_and_legacy_config_json(tmp_path):
    import json

    new = FPAConfig(attention="fpa", fpa_mode="walk")
    assert {k: getattr(new, k) for k in FPA_PARAMETRISATION_CURRENT} == FPA_PARAMETRISATION_CURRENT
    new.save_pretrained(tmp_path / "new")
    again = FPAConfig.from_pretrained(tmp_path / "new")
    assert {k: getattr(again, k) for k in FPA_PARAMETRISATION_CURRENT} == FPA_PARAMETRISATION_CURRENT
    # a config.json written before the keys existed: the parametrisation it was trained with
    d = json.loads((tmp_path / "new" / "config.json").read_text())
    for k in FPA_PARAMETRISATION_CURRENT:
        d.pop(k)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(d))
    old = FPAConfig.from_pretrained(tmp_path / "old")
    assert {k: getattr(old, k) for k in FPA_PARAMETRISATION_LEGACY} == FPA_PARAMETRISATION_LEGACY
    kw = old.attention_kwargs()
    assert (kw["walk_increment"], kw["beta_activation"], kw["walk_bias_init"]) == ("linear", "softplus", 0.0)


def test_level_offset_values():
    assert FPAConfig(fpa_mode="walk", fpa_level_offset="token").attention_kwargs()["level_offset"] == "token"
    assert FPAConfig(fpa_mode="walk", fpa_level_offset="head").attention_kwargs()["level_offset"] == "head"
    # True with fpa_mode="free" was always accepted and ignored: saved configs keep loading
    assert FPAConfig(fpa_mode="free", fpa_level_offset=True).attention_kwargs()["level_offset"] is False
    for mode, val in (("free", "token"), ("free", "head")):
        with pytest.raises(ValueError, match=f"fpa_level_offset='{val}' needs fpa_mode='walk'.*got fpa_mode='free'"):
            FPAConfig(fpa_mode=mode, fpa_level_offset=val)
    for bad in ("Token", 1, 0, "auto"):
        with pytest.raises(ValueError, match=r"fpa_level_offset must be one of \(False, True, 'head', 'token'\)"):
            FPAConfig(fpa_mode="walk", fpa_level_offset=bad)
    # the default (None): a head offset starting at 1 in walk mode, none in free mode or for other attention
    walk = FPAConfig(fpa_mode="walk")
    assert (walk.fpa_level_offset, walk.fpa_level_offset_init) == ("head", 1.0)
    assert walk.attention_kwargs()["level_offset"] == "head" and walk.attention_kwargs()["level_offset_init"] == 1.0
    assert FPAConfig(fpa_mode="free").fpa_level_offset is False
    assert FPAConfig(attention="fox").fpa_level_offset is False
    FPAConfig(attention="fox", fpa_level_offset="token")  # an fpa_* key, unused by other attention types
