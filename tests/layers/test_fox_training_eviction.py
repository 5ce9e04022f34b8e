"""FoX trained under its own threshold rule (ForgettingAttention.set_training_eviction): the
training forward equals token-by-token decoding under FoXEviction, and differs from plain FoX."""

import pytest
import torch

from fpa.cache import FoXEviction, FPACache
from fpa.layers.attention import ForgettingAttention


@pytest.mark.parametrize("threshold", [0.5, 2.0])
def test_training_forward_equals_token_by_token_decoding_under_the_rule(threshold):
    torch.manual_seed(0)
    layer = ForgettingAttention(16, 4, 2, fgate_bias_init=0.0).double()
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
        layer.set_training_eviction(threshold)
        trained = layer(x)
        rule = FoXEviction(threshold)
        cache = FPACache(rule)
        steps = []
        for t in range(x.shape[1]):
            steps.append(layer(x[:, t : t + 1], cache.layer(0)))
            cache.step_done()
    # the cache computes its penalties in float32: differences ~1e-7 (outputs O(1)); one key
    # decided differently moves an output by >= 1e-2 here
    torch.testing.assert_close(trained, torch.cat(steps, 1), rtol=0, atol=2e-6)
    assert (trained - full).abs().max() > 1e-3, "the rule must change the output here"
    assert 0 < rule.kept_fraction < 1


def test_none_restores_plain_fox_and_bad_thresholds_are_refused():
    layer = ForgettingAttention(16, 4, 4, fgate_bias_init=0.0)
    x = torch.randn(1, 10, 16)
    with torch.no_grad():
        plain = layer(x)
        layer.set_training_eviction(0.1)
        layer.set_training_eviction(None)
        torch.testing.assert_close(layer(x), plain)
    with pytest.raises(ValueError, match="threshold"):
        layer.set_training_eviction(-1.0)
