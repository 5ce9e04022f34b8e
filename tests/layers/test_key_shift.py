"""Key shift (fpa.layers.key_shift) against an oracle written from its definition, and every
attention type with a key shift: cached decoding in pieces equals the whole forward pass."""

import pytest
import torch

from fpa.cache.store import LayerState
from fpa.layers import ATTENTION_TYPES, make_attention
from fpa.layers.key_shift import shift_keys


def oracle(k, gate, prev, mask):
    """Token by token: k'_t = (1 - a_t) k_t + a_t k_prev, k_prev the latest real key before t."""
    B, H, T, D = k.shape
    out = torch.empty_like(k)
    carry = torch.zeros(B, H, D, dtype=k.dtype) if prev is None else prev.clone()
    for b in range(B):
        last = carry[b]
        for t in range(T):
            a = gate[b, :, t, None]
            out[b, :, t] = (1 - a) * k[b, :, t] + a * last
            if mask is None or bool(mask[b, t]):
                last = k[b, :, t]
        carry = carry.clone()
        carry[b] = last
    return out, carry


@pytest.mark.parametrize("with_prev", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_shift_keys_matches_the_definition(with_prev, with_mask):
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 3, 2, 7, 4
    k = torch.randn(B, H, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    gate = torch.rand(B, H, T, generator=g, dtype=torch.float64, requires_grad=True)
    prev = torch.randn(B, H, D, generator=g, dtype=torch.float64, requires_grad=True) if with_prev else None
    mask = torch.rand(B, T, generator=g) > 0.4 if with_mask else None
    if mask is not None:
        mask[2] = False  # a row of padding only keeps its carry
    out, carry = shift_keys(k, gate, prev, mask)
    ref, ref_carry = oracle(k, gate, prev, mask)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(carry, ref_carry, atol=0, rtol=0)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    inputs = [k, gate] + ([prev] if prev is not None else [])
    got = torch.autograd.grad((out * w).sum() + carry.sum(), inputs)
    want = torch.autograd.grad((ref * w).sum() + ref_carry.sum(), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_pieces_with_the_carry_equal_one_call():
    g = torch.Generator().manual_seed(1)
    k, gate = torch.randn(2, 2, 9, 3, generator=g), torch.rand(2, 2, 9, generator=g)
    mask = torch.rand(2, 9, generator=g) > 0.3
    whole, carry = shift_keys(k, gate, None, mask)
    a, c = shift_keys(k[:, :, :4], gate[:, :, :4], None, mask[:, :4])
    b, c = shift_keys(k[:, :, 4:], gate[:, :, 4:], c, mask[:, 4:])
    torch.testing.assert_close(torch.cat([a, b], 2), whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(c, carry, atol=0, rtol=0)


def test_gate_zero_is_no_shift_and_one_is_the_previous_key():
    k = torch.randn(1, 1, 4, 2)
    torch.testing.assert_close(shift_keys(k, torch.zeros(1, 1, 4))[0], k)
    shifted = shift_keys(k, torch.ones(1, 1, 4))[0]
    torch.testing.assert_close(shifted[:, :, 1:], k[:, :, :-1])
    assert shifted[:, :, 0].abs().max() == 0  # nothing before the first token


KW = [("fpa", {"fpa": {"mode": "free"}}), ("fpa", {"fpa": {"mode": "walk"}})] + [
    (a, {}) for a in ATTENTION_TYPES if a != "fpa"
]


@pytest.mark.parametrize("att,kw", KW)
def test_cached_pieces_equal_the_whole_pass(att, kw):
    torch.manual_seed(0)
    m = make_attention(att, 32, 4, 2, qk_norm=True, key_shift=True, **kw).double()
    with torch.no_grad():
        m.key_shift_proj.weight.normal_(0, 0.5)  # gates spread over (0, 1)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    y = m(x)
    x2 = x.clone()
    x2[:, 6:] += 1.0
    assert torch.allclose(m(x2)[:, :6], y[:, :6], atol=1e-10)  # still causal
    state = LayerState()
    parts = [m(x[:, :4], state), m(x[:, 4:5], state), m(x[:, 5:], state)]
    # The cache keeps FPA's fields in float32: measured max |difference| 4.6e-9 with or without the
    # shift (1e-15 for softmax) over seeds 0-4, outputs ~1; 5e-8 is 10x that. A wrong carry moves it by > 1e-2.
    torch.testing.assert_close(torch.cat(parts, 1), y, atol=5e-8, rtol=0)
    plain = make_attention(att, 32, 4, 2, qk_norm=True, **kw).double()
    plain.load_state_dict({n: p for n, p in m.state_dict().items() if not n.startswith("key_shift")})
    assert (plain(x) - y).abs().max() > 1e-3  # the shift changes the output


def test_key_shift_trains_and_is_checked():
    torch.manual_seed(0)
    m = make_attention("fpa", 16, 2, key_shift=True, fpa={"mode": "walk"})
    m(torch.randn(2, 5, 16)).sum().backward()
    assert m.key_shift_proj.weight.grad.abs().max() > 0
    assert m.key_shift_proj.bias.shape == (2,) and m.key_shift_proj.bias.abs().max() == 0
    assert make_attention("fox", 16, 2).key_shift_proj is None
    with pytest.raises(ValueError, match="key_shift must be True or False, got 1"):
        make_attention("softmax_rope", 16, 2, key_shift=1)


@pytest.mark.parametrize("att", ["fpa", "fox", "softmax_rope"])
def test_gate_bias_init_starts_every_key_at_that_share_of_its_predecessor(att):
    torch.manual_seed(0)
    b = 1.0
    m = make_attention(att, 16, 2, key_shift=True, key_shift_bias_init=b)
    assert torch.equal(m.key_shift_proj.bias, torch.full((2,), b))
    x = torch.randn(1, 6, 16)
    gate = torch.sigmoid(m.key_shift_proj(x)).transpose(1, 2)
    # weights ~ N(0, 0.02^2) move the logit by |w . x| <~ 0.02 * sqrt(16) * 4 sd = 0.32 at most
    assert (gate - torch.sigmoid(torch.tensor(b))).abs().max() < 0.08


def test_gate_bias_init_is_checked():
    with pytest.raises(ValueError, match="key_shift_bias_init=1.0 needs key_shift=True"):
        make_attention("fox", 16, 2, key_shift_bias_init=1.0)
    with pytest.raises(ValueError, match="key_shift_bias_init"):
        make_attention("fox", 16, 2, key_shift=True, key_shift_bias_init=float("nan"))
    assert make_attention("fox", 16, 2, key_shift_bias_init=0.0).key_shift_proj is None
