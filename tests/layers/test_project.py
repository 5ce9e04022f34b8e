"""The layers' public projections are what their forward passes attend with: ``project`` (q, k, v,
every layer type) and FoX's ``log_forget``, so a probe reading them cannot drift from the layer."""

import pytest
import torch

from fpa.layers import ATTENTION_TYPES, make_attention


@pytest.mark.parametrize("attention", ATTENTION_TYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
def test_forward_attends_with_project(attention, qk_norm):
    torch.manual_seed(0)
    layer = make_attention(attention, 8, 4, num_kv_heads=2, head_dim=3, qk_norm=qk_norm)
    x = torch.randn(2, 5, 8)
    q, k, v = layer.project(x)
    assert q.shape == (2, 4, 5, 3) and k.shape == v.shape == (2, 2, 5, 3)
    if qk_norm:  # RMS-normed heads (the norms' weights start at 1)
        torch.testing.assert_close(q.pow(2).mean(-1), torch.ones(2, 4, 5), atol=1e-4, rtol=0)
    assert layer(x).abs().max() > 0
    layer.project = lambda x, *args: (q, k, torch.zeros_like(v))  # zero values: the output must be zero
    assert layer(x).abs().max() == 0


def test_fox_forward_attends_with_log_forget():
    """With log f = -60 at every token, key j's bias at query i is -60 (i - j): each query sees only
    its own key, and the output is o_proj of its own value."""
    torch.manual_seed(0)
    layer = make_attention("fox", 8, 2)
    x = torch.randn(2, 5, 8)
    assert layer.log_forget(x).shape == (2, 2, 5)
    layer.log_forget = lambda x: torch.full((x.shape[0], 2, x.shape[1]), -60.0)
    _, _, v = layer.project(x)
    own = layer.o_proj(v.transpose(1, 2).reshape(2, 5, 8))
    torch.testing.assert_close(layer(x), own)
