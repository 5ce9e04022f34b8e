"""FPAConfig / TrainConfig validation: every field's type and range, unknown keys with the valid ones."""

from __future__ import annotations

import math

import pytest

from fpa.data import ByteTokenizer
from fpa.layers import FPAOptions
from fpa.models import FPAConfig
from fpa.models.configuration_fpa import FIELDS, PRESETS
from fpa.train import TrainConfig

BAD: dict[object, list[object]] = {  # kind / rule -> bad values
    "int": [0, -1, 2.0, "4", True, None],
    "bool": ["no", "false", 0, 1, None],
    "choice": ["bogus", None, 1],
    ("real", "any"): [math.nan, math.inf, "1", True, None],
    ("real", ">0"): [0, -1, -1e-9, math.nan, math.inf, "1", True],
    ("real", ">=0"): [-1, -1e-9, math.nan, -math.inf, "0.1", False],
    "reals": [math.nan, math.inf, "1", True, None, []],
    "fpa": ["walk", 1, [("mode", "walk")]],
    "token": [-1, 1.0, "0", True, 10**6],
}


def _bad_values(name: str) -> list:
    kind, rule = FIELDS[name]
    vals = BAD[(kind, rule)] if kind == "real" else BAD[kind]
    # None means a default: num_key_value_heads = num_attention_heads
    return [v for v in vals if not (name == "num_key_value_heads" and v is None)]


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


def test_bad_fpa_options_name_the_option():
    with pytest.raises(ValueError, match=r"FPAOptions.level_offset must be one of \('none', 'head', 'token'\)"):
        FPAConfig(fpa={"level_offset": "Token"})
    with pytest.raises(
        ValueError, match=r"unknown keys in FPAConfig fpa: \['levl_offset'\].*did you mean 'level_offset'"
    ):
        FPAConfig(fpa={"levl_offset": "none"})


def test_issue_examples():
    with pytest.raises(ValueError, match="qk_norm must be true or false.*'no'"):
        FPAConfig(qk_norm="no")
    with pytest.raises(ValueError, match="rope_theta must be a finite number > 0, got -1"):
        FPAConfig(rope_theta=-1)
    with pytest.raises(ValueError, match="rms_norm_eps must be a finite number > 0, got -1"):
        FPAConfig(rms_norm_eps=-1)
    with pytest.raises(ValueError, match=r"FPAOptions.field_lr_multiplier must be a finite number in \(0, 1000\]"):
        FPAConfig(fpa={"field_lr_multiplier": -0.1})


def test_good_values_accepted_and_round_trip(tmp_path):
    c = FPAConfig(
        qk_norm=True,
        rope_theta=500000,
        rms_norm_eps=1e-5,
        fpa={"field_lr_multiplier": 0.1, "beta_init": -2.0, "level_offset": "token", "walk_increment": "gated"},
        initializer_range=0.0,
        num_key_value_heads=2,
        attention="fpa",
        pad_token_id=0,
        eos_token_id=256,
    )
    c.save_pretrained(tmp_path)
    d = FPAConfig.from_pretrained(tmp_path)
    assert (d.qk_norm, d.rope_theta, d.num_key_value_heads) == (True, 500000, 2)
    assert isinstance(d.fpa, FPAOptions) and d.fpa == c.fpa  # the nested options, rebuilt exactly
    assert (d.pad_token_id, d.bos_token_id, d.eos_token_id) == (0, None, 256)
    assert d.to_dict() == {**c.to_dict(), "_name_or_path": d.to_dict()["_name_or_path"]}


def test_token_ids_are_attributes_none_by_default():
    """Like a transformers config: pad/bos/eos ids readable (None unless given), and generate's
    generation config picks them up."""
    from fpa.models import FPAForCausalLM

    c = FPAConfig()
    assert (c.pad_token_id, c.bos_token_id, c.eos_token_id) == (None, None, None)
    m = FPAForCausalLM(FPAConfig(pad_token_id=256, eos_token_id=256, num_hidden_layers=1))
    assert (m.generation_config.pad_token_id, m.generation_config.eos_token_id) == (256, 256)
    with pytest.raises(ValueError, match=r"FPAConfig eos_token_id must be < vocab_size \(257\), got 257"):
        FPAConfig(eos_token_id=257)


def test_unknown_keys_listed_with_valid_ones():
    with pytest.raises(ValueError, match=r"\['hiden_size'\].*did you mean 'hidden_size'.*valid keys: \['attention'"):
        FPAConfig.from_preset("tiny", hiden_size=32)
    with pytest.raises(ValueError, match=r"unknown keys in FPAConfig model overrides: \['foo'\]"):
        FPAConfig.from_preset("tiny", foo=1)
    with pytest.raises(ValueError, match="did you mean 'qk_norm'"):
        FPAConfig(qk_nrom=True)  # a misspelt field passed directly
    FPAConfig(use_cache=True, torch_dtype="float32")  # transformers' own keys still pass
    # a flat FPA option (an older spelling, or the layer's name) points to its nested spelling
    for key in ("fpa_level_offset", "level_offset", "fpa_mode"):
        opt = key.removeprefix("fpa_")
        with pytest.raises(ValueError, match=rf"\['{key}'\].*did you mean \{{\"fpa\": \{{\"{opt}\": \.\.\.\}}\}}"):
            FPAConfig(**{key: "none"})
        with pytest.raises(ValueError, match=rf"model_overrides.*did you mean \{{\"fpa\": \{{\"{opt}\""):
            TrainConfig(out_dir="x", model_overrides={key: "none"})


def test_bad_config_json_fails_on_load(tmp_path):
    import json

    FPAConfig().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    for key, val, words in (
        ("rope_theta", -1, "rope_theta must be a finite number > 0"),
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
        ({"hiden_size": 32}, "unknown keys in FPAConfig model_overrides"),
        ({"qk_norm": "no"}, "qk_norm must be true or false"),
        ({"rms_norm_eps": -1}, "rms_norm_eps must be a finite number > 0"),
        ({"attention": "fox"}, "set attention with the training config's own"),
        ({"fpa": {"mode": "free"}}, "set the FPA mode with the training config's own 'fpa_mode' key"),
        ({"fpa": {"level_offset": "sideways"}}, "FPAOptions.level_offset must be one of"),
        ({"fpa": {"level_ofset": "head"}}, r"model_overrides fpa: \['level_ofset'\].*did you mean 'level_offset'"),
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
        (dict(vocab_size=0), r"vocab_size must be a positive int \(or None\)"),
    ],
)
def test_train_config_checks_model_choices(kw, words):
    with pytest.raises(ValueError, match=words):
        TrainConfig(out_dir="x", **kw)


def test_train_config_nests_fpa_options_and_renamed_keys_point_to_the_new_ones():
    cfg = TrainConfig(out_dir="x", fpa_mode="free", model_overrides={"fpa": {"beta_init": 1.0}})
    assert cfg.model_config(257).fpa == FPAOptions(mode="free", beta_init=1.0)
    with pytest.raises(ValueError, match="model_overrides fpa needs attention='fpa'"):
        TrainConfig(out_dir="x", attention="fox", model_overrides={"fpa": {"beta_init": 1.0}})
    for old, new in (("evict_tau", "evict_threshold"), ("live_reg_tau", "live_reg_threshold")):
        with pytest.raises(ValueError, match=rf"\['{old}'\].*did you mean '{new}'"):
            TrainConfig.from_dict({"out_dir": "x", old: 2.0})
