"""The agent-trace experiment (fpa.experiments.agent.trace): trace invariants, the constructed head's
memory bounded by depth, the window's failure on calls that outlive it, the trainer runs."""

import numpy as np
import pytest
import torch

from fpa.cache import FPAEviction, SlidingWindow
from fpa.experiments.agent.trace import (
    TokenOffsetWalk,
    constructed_offset_head,
    decode_trace,
    make_trace,
    summarise,
    train_walk_head,
)
from fpa.tasks.nested import CallsTask


def test_trace_depth_is_bounded_and_answers_match_the_task():
    tr = make_trace(5000, max_depth=4, seed=3)
    assert tr.depth.max() <= 4 and tr.depth.min() >= 0
    assert tr.query.sum() >= 5000 // 64 - 40  # some query slots were taken by calls/returns
    a, t, v = CallsTask().prefix_answers(tr.tokens[None])
    assert np.array_equal(a[0], tr.answer) and np.array_equal(v[0], tr.depth > 0)
    with pytest.raises(ValueError, match="p_call"):
        make_trace(10, p_call=0.6, p_return=0.6)


def test_constructed_head_keeps_the_open_calls_only():
    """FPA's rule holds at most depth + 1 keys (+ the chunk) and answers every query; the full cache
    answers every query too; a window shorter than the oldest call loses some."""
    tr = make_trace(1200, max_depth=5, seed=1)
    model = constructed_offset_head()
    full = summarise("full", decode_trace(model, tr, None, chunk=8, sample_every=40), tr, 64)
    fpa = summarise("fpa", decode_trace(model, tr, FPAEviction(1.0), chunk=8, sample_every=40), tr, 64)
    win = summarise("win", decode_trace(model, tr, SlidingWindow(64), chunk=8, sample_every=40), tr, 64)
    assert full["accuracy"] == 1.0 and fpa["accuracy"] == 1.0
    assert all(s["keys_held"] <= s["depth"] + 1 for s in fpa["samples"])
    assert win["fraction_positions_older"] > 0.1 and win["accuracy_call_older_than_window"] < 0.9
    assert win["accuracy_call_within_window"] == 1.0


def test_token_offset_walk_decodes_like_its_full_forward():
    torch.manual_seed(0)
    layer = TokenOffsetWalk(8, 1, 4).eval()
    assert (layer.level_offset_kind, layer.walk_increment, layer.beta_activation) == ("token", "linear", "softplus")
    with torch.no_grad():
        layer.level_offset_proj.weight.normal_(0, 1.0)
        layer.increment_proj.weight.normal_(0, 1.0)
    x = torch.randn(2, 20, 8)
    from fpa.cache import FPACache

    cache = FPACache()
    with torch.no_grad():
        full = layer(x)
        parts = [layer(x[:, a:b], cache.layer(0)) for a, b in ((0, 7), (7, 8), (8, 20))]
    # measured worst |difference| 1.8e-7; tolerance 1e-5 (55x margin)
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_token_offset_walk_is_the_library_layer():
    """Only its construction differs: a plain library layer with its weights computes the same."""
    from fpa.layers import FirstPassageAttention, FPAOptions

    torch.manual_seed(0)
    layer = TokenOffsetWalk(8, 2, 4, offset_bias_init=-1.0)
    plain = FirstPassageAttention(
        8,
        2,
        head_dim=4,
        options=FPAOptions(mode="walk", walk_increment="linear", beta_activation="softplus", level_offset="token"),
    )
    plain.load_state_dict(layer.state_dict())
    assert layer.level_offset_proj.bias.tolist() == [-1.0, -1.0]
    assert layer.beta.tolist() == pytest.approx([0.5266] * 2, abs=1e-4)  # the experiment's initial beta
    x = torch.randn(2, 11, 8)
    with torch.no_grad():
        assert torch.equal(layer(x), plain(x))


@pytest.mark.parametrize("variant", ["walk", "walk+offset"])
def test_training_runs_and_lowers_the_loss(variant):
    model, losses = train_walk_head(steps=30, batch=8, variant=variant)
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    with pytest.raises(ValueError, match="variant"):
        train_walk_head(steps=1, variant="free")
