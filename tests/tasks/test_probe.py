"""attention_probs must reproduce each layer's own forward output (probs @ v through o_proj)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fpa.layers.attention import make_attention
from fpa.models.packed import METHODS, PackedModels
from fpa.tasks.probe import attention_probs, layer_output


@settings(max_examples=30, deadline=None)
@given(
    method=st.sampled_from(sorted(METHODS)),
    d=st.sampled_from([1, 2, 4, 8]),
    heads=st.integers(1, 3),
    T=st.integers(1, 12),
    seed=st.integers(0, 10**6),
)
def test_probs_reproduce_layer_output(method, d, heads, T, seed):
    torch.manual_seed(seed)
    attention, fpa = METHODS[method]
    layer = make_attention(attention, 6, heads, head_dim=d, fpa=fpa)
    with torch.no_grad():  # make the field/level/gate heads matter (they start near zero)
        for name, p in layer.named_parameters():
            if any(s in name for s in ("field", "level", "increment", "fgate")):
                p.normal_(0, 1.0)
    x = torch.randn(2, T, 6)
    probs, v = attention_probs(layer, x)
    assert probs.shape == (2, heads, T, T)
    assert torch.allclose(probs.sum(-1), torch.ones(2, heads, T), atol=1e-5)
    assert (probs.triu(1) == 0).all()
    torch.testing.assert_close(layer_output(layer, probs, v), layer(x), atol=2e-5, rtol=1e-4)


def test_probe_sees_the_penalty():
    """A changed field must change the FPA probabilities (the probe does not ignore the op's bias)."""
    torch.manual_seed(0)
    layer = make_attention("fpa", 6, 1, head_dim=2, fpa={"mode": "walk"})
    x = torch.randn(1, 8, 6)
    p0, _ = attention_probs(layer, x)
    with torch.no_grad():
        layer.increment_proj.weight.normal_(0, 3.0)
    p1, _ = attention_probs(layer, x)
    assert (p0 - p1).abs().max() > 1e-3


def test_bad_arguments():
    layer = make_attention("fox", 6, 1)
    with pytest.raises(ValueError, match="x must have shape"):
        attention_probs(layer, torch.randn(2, 3, 5))


@settings(max_examples=20, deadline=None)
@given(method=st.sampled_from(sorted(METHODS)), T=st.integers(1, 10), seed=st.integers(0, 10**6))
def test_last_row_equals_full(method, T, seed):
    torch.manual_seed(seed)
    model = PackedModels(method, 2, vocab_size=5, dim=2, embed_dim=4)
    with torch.no_grad():
        for name, p in model.attn.named_parameters():
            if any(s in name for s in ("field", "level", "increment", "fgate")):
                p.normal_(0, 1.0)
    tok = torch.randint(0, 5, (3, 2, T))
    x = model.hidden(tok)
    full, v = attention_probs(model.attn, x)
    last, _ = attention_probs(model.attn, x, last_only=True)
    torch.testing.assert_close(last, full[:, :, -1:])
    torch.testing.assert_close(model.readout_last(layer_output(model.attn, last, v)), model(tok))
