"""FPA's walk parametrisation: bounded increments, beta's activation, the initial bias, set_beta_."""

import math

import pytest
import torch

from fpa.layers.attention import FirstPassageAttention
from fpa.layers.options import FPAOptions


def _layer(**kw):
    torch.manual_seed(0)
    return FirstPassageAttention(16, 2, options=FPAOptions(mode="walk", **kw))


def _increments(layer, x):
    field, _ = layer.field_level(x)
    return torch.diff(field, dim=-1, prepend=torch.zeros_like(field[..., :1]))


def test_tanh_increments_are_bounded_and_linear_ones_are_not():
    x = torch.randn(2, 50, 16) * 100  # large inputs saturate tanh
    for layer, bounded in ((_layer(), True), (_layer(walk_increment="linear"), False)):
        with torch.no_grad():
            layer.increment_proj.weight.normal_(0, 1.0)
        inc = _increments(layer, x)
        # 1e-4: float32 rounding of differencing a cumulative sum of 50 steps (measured 5e-6), 20x margin
        assert (inc.abs().max() <= 1.0 + 1e-4) == bounded
        if bounded:  # saturated +-1 steps cancel: a push and a pop return the walk to its level
            assert inc.abs().max() > 0.999


def test_beta_starts_at_softplus_of_beta_init_under_either_activation():
    for beta_init in (-2.0, 0.0, 2.0):
        want = math.log1p(math.exp(beta_init))
        for act in ("softplus", "exp"):
            assert _layer(beta_init=beta_init, beta_activation=act).beta.tolist() == pytest.approx([want] * 2, rel=1e-6)


@pytest.mark.parametrize("act", ["softplus", "exp"])
def test_set_beta_round_trips(act):
    layer = _layer(beta_activation=act)
    layer.set_beta_(torch.tensor([0.01, 40.0]))
    assert layer.beta.tolist() == pytest.approx([0.01, 40.0], rel=1e-5)
    layer.set_beta_(3.0)
    assert layer.beta.tolist() == pytest.approx([3.0, 3.0], rel=1e-6)
    with pytest.raises(ValueError, match="beta must be > 0"):
        layer.set_beta_(0.0)


def test_exp_beta_grows_by_a_factor_per_adam_step():
    """Under Adam a parameter moves about lr per step: exp makes that a relative change of beta."""
    growth = {}
    for act in ("softplus", "exp"):
        layer = _layer(beta_activation=act, beta_init=2.0)
        opt = torch.optim.Adam([layer.beta_param], lr=0.05)
        b0 = layer.beta.detach().clone()
        for _ in range(20):
            opt.zero_grad()
            (-layer.beta.sum()).backward()
            opt.step()
        growth[act] = float((layer.beta.detach() / b0).mean())
    # Adam's step is lr * m / sqrt(v), ~1.05 lr here as the gradient (-beta) grows: measured 2.84 vs e = 2.72
    assert growth["exp"] == pytest.approx(math.exp(20 * 0.05), rel=0.1)
    assert growth["softplus"] < 1.6 < growth["exp"]


def test_walk_bias_init_sets_the_initial_drift():
    layer = _layer(walk_bias_init=-1.0, field_init_std=0.0)
    inc = _increments(layer, torch.randn(1, 10, 16))
    assert torch.allclose(inc, torch.full_like(inc, math.tanh(-1.0)))


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"walk_increment": "relu"}, "walk_increment must be one of"),
        ({"beta_activation": "square"}, "beta_activation must be one of"),
    ],
)
def test_bad_options_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        _layer(**kw)


def test_gated_increments_reach_zero_and_plus_minus_one():
    """walk_increment="gated": tanh(a) * sigmoid(g) saturates at -1, 0 and +1 (three exact steps);
    its gate head trains with the other field parameters."""
    layer = _layer(walk_increment="gated")
    assert any(p is layer.increment_gate_proj.weight for p in layer.field_parameters())
    x = torch.eye(16)[None, :3] * 50  # three tokens
    with torch.no_grad():
        layer.increment_proj.weight.zero_()
        layer.increment_gate_proj.weight.zero_()
        layer.increment_proj.weight[:, 0], layer.increment_gate_proj.weight[:, 0] = 1.0, 1.0  # +1
        layer.increment_proj.weight[:, 1], layer.increment_gate_proj.weight[:, 1] = -1.0, 1.0  # -1
        layer.increment_gate_proj.weight[:, 2] = -1.0  # 0
    inc = _increments(layer, x)[0, 0]
    assert torch.allclose(inc, torch.tensor([1.0, -1.0, 0.0]), atol=1e-6)
