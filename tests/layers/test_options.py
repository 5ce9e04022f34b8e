"""FPAOptions: one validated options object, and every entry point defaults to FPAOptions()."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from fpa.layers import FirstPassageAttention, FPAOptions, TransformerBlock, make_attention
from fpa.layers.options import walk_bias_matching_fox


def test_every_entry_point_defaults_to_fpa_options():
    """The layer, the block, make_attention, FPAConfig, `fpa train`'s config and `fpa model-info`
    built without options agree with FPAOptions(): walk, no level offset, full field lr."""
    from fpa.cli import build_parser
    from fpa.models import FPAConfig
    from fpa.train import TrainConfig

    want = FPAOptions()
    assert (want.mode, want.level_offset, want.field_lr_multiplier) == ("walk", "none", 1.0)
    assert FirstPassageAttention(16, 2).options == want
    block = TransformerBlock(16, 32, "fpa", 2)
    assert isinstance(block.attn, FirstPassageAttention) and block.attn.options == want
    layer = make_attention("fpa", 16, 2)
    assert isinstance(layer, FirstPassageAttention) and layer.options == want
    assert FPAConfig().fpa == want and FPAConfig.from_preset("tiny").fpa == want
    assert TrainConfig(out_dir="x").model_config(257).fpa == want
    args = build_parser("model-info").parse_args(["model-info"])
    assert args.fpa_mode == want.mode
    train_args = build_parser("train").parse_args(["train"])
    assert train_args.fpa_mode is None and TrainConfig(out_dir="x").fpa_mode == want.mode  # flag unset: the config's


def test_model_info_prints_the_default_options(capsys):
    from fpa.cli import main

    assert main(["model-info", "--preset", "tiny"]) == 0
    assert f"fpa={FPAOptions().to_dict()}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(mode="Walk"), r"FPAOptions.mode must be one of \('walk', 'free'\), got 'Walk'"),
        (dict(walk_increment="relu"), r"FPAOptions.walk_increment must be one of"),
        (dict(beta_activation="square"), r"FPAOptions.beta_activation must be one of"),
        (dict(beta_init=True), r"FPAOptions.beta_init must be a finite number, got True"),
        (dict(walk_bias_init=math.nan), r"FPAOptions.walk_bias_init must be a finite number \(or a non-empty list"),
        (dict(walk_bias_init=[]), r"FPAOptions.walk_bias_init must be a number or a non-empty list of numbers"),
        (dict(walk_bias_init=[-0.1, "x"]), r"FPAOptions.walk_bias_init\[1\] must be a finite number, got 'x'"),
        (dict(level_offset_init=-math.inf), r"FPAOptions.level_offset_init must be a finite number, got -inf"),
        (dict(field_init_std=-0.1), r"FPAOptions.field_init_std must be a finite number >= 0, got -0.1"),
        (dict(field_lr_multiplier=0), r"FPAOptions.field_lr_multiplier must be a finite number in \(0, 1000\], got 0"),
        (dict(field_lr_multiplier=1e4), r"FPAOptions.field_lr_multiplier must be a finite number in \(0, 1000\]"),
        (
            dict(field_lr_multiplier=False),
            r"FPAOptions.field_lr_multiplier must be a finite number in \(0, 1000\], got False",
        ),
        (dict(mode="free", level_offset="head"), r"level_offset='head' needs mode='walk'"),
    ],
)
def test_bad_values_name_the_field(kw, words):
    with pytest.raises(ValueError, match=words):
        FPAOptions(**kw)


def test_frozen_serialisable_and_replace_checks_keys():
    o = FPAOptions(level_offset="head", level_offset_init=2)
    assert o.level_offset_init == 2.0 and isinstance(o.level_offset_init, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.mode = "free"  # type: ignore[misc]
    assert FPAOptions.from_dict(o.to_dict()) == o and FPAOptions.from_dict(None) == FPAOptions()
    assert o.replace(level_offset="none") == FPAOptions(level_offset_init=2.0)
    with pytest.raises(ValueError, match=r"unknown keys in FPAOptions.replace: \['fpa_mode'\].*did you mean 'mode'"):
        o.replace(fpa_mode="free")
    with pytest.raises(ValueError, match="options must be a dict of FPAOptions fields or an FPAOptions, got str"):
        FirstPassageAttention(16, 2, options="walk")  # type: ignore[arg-type]


def test_walk_bias_matching_fox_gives_foxs_initial_decay():
    """Oracle from the definitions: FoX at bias g forgets -log sigmoid(g) per token; a walk of
    constant steps tanh(b) pays beta * |tanh(b)| per token, beta = softplus(beta_init)."""
    for g, beta_init in ((2.0, 0.0), (5.0, 0.0), (1.0, 1.5)):
        b = walk_bias_matching_fox(g, beta_init)
        fox_decay = -torch.log(torch.sigmoid(torch.tensor(g, dtype=torch.float64)))
        walk_penalty = F.softplus(torch.tensor(beta_init, dtype=torch.float64)) * torch.tanh(
            torch.tensor(-b, dtype=torch.float64)
        )
        assert b < 0
        torch.testing.assert_close(walk_penalty, fox_decay, rtol=1e-12, atol=0)
    assert abs(walk_bias_matching_fox(2.0) - (-0.1852)) < 1e-4


def test_walk_bias_matching_fox_refuses_a_decay_out_of_reach():
    with pytest.raises(ValueError, match="fgate_bias"):
        walk_bias_matching_fox(-1.0)  # decays by 1.31 per token; a walk at beta 0.69 tops out below 0.69
    with pytest.raises(ValueError, match="fgate_bias"):
        walk_bias_matching_fox(float("nan"))


def test_walk_bias_init_per_group_of_heads_starts_each_head_at_its_value(tmp_path):
    """A list of starting biases: each value starts num_heads / n consecutive heads of the walk (and
    of FoX's forget gate, the same convention); it survives config.json as a tuple; a length that
    does not divide the head count is refused before any model is built."""
    from fpa.layers import ForgettingAttention
    from fpa.models import FPAConfig

    starts = [walk_bias_matching_fox(2.0), walk_bias_matching_fox(5.0)]
    opts = FPAOptions(walk_bias_init=starts)
    assert opts.walk_bias_init == tuple(starts) and FPAOptions.from_dict(opts.to_dict()) == opts
    layer = FirstPassageAttention(32, 4, options=opts)
    assert layer.increment_proj.bias.tolist() == pytest.approx([starts[0]] * 2 + [starts[1]] * 2)
    fox = ForgettingAttention(32, 4, fgate_bias_init=[2.0, 5.0])
    assert fox.fgate_proj.bias.tolist() == [2.0, 2.0, 5.0, 5.0]
    with pytest.raises(ValueError, match=r"walk_bias_init has 3 values, which must divide the number of heads \(4\)"):
        FirstPassageAttention(32, 4, options=FPAOptions(walk_bias_init=[0.0, -0.1, -0.2]))
    with pytest.raises(ValueError, match=r"FPAConfig fpa.walk_bias_init has 3 values.*heads \(4\)"):
        FPAConfig.from_preset("tiny", fpa={"walk_bias_init": [0.0, -0.1, -0.2]})
    with pytest.raises(ValueError, match=r"FPAConfig fox_fgate_bias_init has 3 values.*heads \(4\)"):
        FPAConfig.from_preset("tiny", attention="fox", fox_fgate_bias_init=[1, 2, 3])
    c = FPAConfig.from_preset("tiny", attention="fox", fox_fgate_bias_init=[2, 5], fpa={"walk_bias_init": starts})
    c.save_pretrained(tmp_path)
    d = FPAConfig.from_pretrained(tmp_path)
    assert d.fpa == opts and tuple(d.fox_fgate_bias_init) == (2.0, 5.0)
