import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fpa.cache.store.storage import PAD_BIG
from fpa.cache.store.weights import attention_weights, fpa_bias
from fpa.ops import first_passage_attention


@settings(max_examples=25, deadline=None)
@given(
    P=st.integers(0, 9),
    T=st.integers(1, 5),
    groups=st.sampled_from([1, 2]),
    pad=st.integers(0, 3),
    seed=st.integers(0, 10_000),
)
def test_fpa_weights_times_v_equal_the_op(P, T, groups, pad, seed):
    """Dense weights over a (padded) cache, @ v, equal first_passage_attention's cache form."""
    g = torch.Generator().manual_seed(seed)
    B, Hkv, D = 2, 2, 4
    Hq = Hkv * groups
    C = P + pad
    q = torch.randn(B, Hq, T, D, generator=g)
    k, v = torch.randn(B, Hkv, C + T, D, generator=g), torch.randn(B, Hkv, C + T, D, generator=g)
    field = torch.randn(B, Hq, T, generator=g)
    level = torch.randn(B, Hq, C + T, generator=g)
    pm = torch.randn(B, Hq, C, generator=g)
    pm[..., P - 1 : P] = float("inf") if P else pm[..., :0]
    level[..., P:C], pm[..., P:C] = PAD_BIG, -PAD_BIG  # padding slots
    beta = torch.rand(Hq, generator=g) * 3
    w = attention_weights(q, k, fpa_bias(field, level, pm, beta), D**-0.5)
    assert torch.allclose(w.sum(-1), torch.ones(()), atol=1e-5)
    assert (w[..., P:C] == 0).all()
    vv = v.repeat_interleave(groups, 1)
    op = first_passage_attention(q, k, v, field, level, beta=beta, past_min=pm, backend="chunked")
    assert torch.allclose(w @ vv, op, atol=1e-5)
    keep = [j for j in range(C + T) if not P <= j < C]  # same keys without the padding
    op2 = first_passage_attention(
        q, k[:, :, keep], v[:, :, keep], field, level[..., keep], beta=beta, past_min=pm[..., :P], backend="reference"
    )
    assert torch.allclose(op, op2, atol=1e-5)
