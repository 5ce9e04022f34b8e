import pytest
import torch

from fpa.cache.store import LayerState
from fpa.layers import ATTENTION_TYPES, FirstPassageAttention, TransformerBlock, make_attention
from fpa.layers.options import FPAOptions

KW = [
    ("fpa", {"fpa": FPAOptions(mode="free")}),
    ("fpa", {"fpa": FPAOptions(mode="walk")}),
    ("fox", {}),
    ("softmax_rope", {}),
    ("softmax_alibi", {}),
    ("softmax_nope", {}),
]


@pytest.mark.parametrize("att,kw", KW)
def test_causal_and_cache(att, kw):
    torch.manual_seed(0)
    m = make_attention(att, 32, 4, 2, qk_norm=True, output_gate=True, **kw).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    y = m(x)
    x2 = x.clone()
    x2[:, 6:] += 1.0
    assert torch.allclose(m(x2)[:, :6], y[:, :6], atol=1e-10)
    state = LayerState()
    parts = [m(x[:, :4], state), m(x[:, 4:5], state), m(x[:, 5:], state)]
    assert torch.allclose(torch.cat(parts, 1), y, atol=1e-8)
    assert state.length == 9
    with pytest.raises(ValueError, match="state must be a fpa.cache.LayerCache .* got dict"):
        m(x, {})


def test_the_cache_layer_is_the_state_the_layers_call():
    """fpa.cache.LayerCache (a transformers cache layer) is a fpa.cache.store.LayerState, the
    interface the layers call; the layers themselves import nothing of fpa.cache but its store."""
    from fpa.cache import LayerCache, LayerInfo
    from fpa.cache.store import LayerInfo as StoreLayerInfo

    assert issubclass(LayerCache, LayerState) and LayerInfo is StoreLayerInfo
    m = make_attention("fpa", 16, 2, fpa={"mode": "walk"})
    lc = LayerCache()
    m(torch.randn(1, 3, 16), lc)
    assert lc.get_seq_length() == 3 and lc.is_initialized and lc.info.kind == "fpa"


def test_block_and_errors():
    b = TransformerBlock(16, 32, "fpa", 2)
    assert b(torch.randn(1, 5, 16)).shape == (1, 5, 16)
    with pytest.raises(ValueError, match="attention"):
        make_attention("nope", 16, 2)
    with pytest.raises(ValueError, match="mode"):
        FirstPassageAttention(16, 2, options=FPAOptions(mode="bad"))
    with pytest.raises(ValueError, match="divisible"):
        FirstPassageAttention(15, 2)
    assert len(ATTENTION_TYPES) == 5
    with pytest.raises(ValueError, match="fpa options are for attention='fpa', got attention='fox'"):
        make_attention("fox", 16, 2, fpa=FPAOptions())


def test_beta_grad():
    m = FirstPassageAttention(16, 2, options=FPAOptions(mode="walk", level_offset="head"))
    m(torch.randn(1, 6, 16)).sum().backward()
    assert m.beta_param.grad is not None and m.increment_proj.weight.grad is not None


@pytest.mark.parametrize("d", [1, 2, 3, 8, 9])
def test_rope_keeps_width_norm_and_is_relative(d):
    from fpa.layers.attention import rope

    torch.manual_seed(d)
    x = torch.randn(2, 5, d)
    y = rope(x, torch.arange(5), 1e4)
    assert y.shape == x.shape
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    q, k = torch.randn(1, d), torch.randn(1, d)

    def dot(i: int, j: int) -> torch.Tensor:
        return (rope(q, torch.tensor([i]), 1e4) * rope(k, torch.tensor([j]), 1e4)).sum()

    assert torch.allclose(dot(3, 1), dot(9, 7), atol=1e-5)  # depends on i - j only
    if d >= 2:
        assert not torch.allclose(dot(3, 1), dot(3, 2), atol=1e-4)  # and does depend on it
