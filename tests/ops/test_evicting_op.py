"""fpa.ops.fpa.evicting (training under the threshold rule, the fast path) against the dense
reference (fpa.layers.fpa_form.evicting_bias + softmax), forward and gradients, on every path of
the chunked engine (C++ whole op, C++ rows, torch ops), several query chunks, grouped heads; the
chunked op's ``hide`` argument in the cache form (earlier keys, past_min) against the dense
reference (fpa.ops.fpa.reference's penalty, the hidden pairs at -inf); torch.library.opcheck of
the chunked op with and without ``hide``."""

import math

import pytest
import torch

from fpa.layers.fpa_form import evicting_bias
from fpa.ops import past_min_from_field
from fpa.ops.cpu_kernels import loader
from fpa.ops.fpa.chunked import _forward_op, fpa_chunked
from fpa.ops.fpa.evicting import evicting_fpa, hide_from
from fpa.ops.fpa.reference import penalty
from fpa.ops.softmax import causal_softmax_attention


@pytest.fixture(params=["whole", "rows", "torch"])
def path(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setenv("FPA_CPU_KERNEL", "0")
    else:
        if loader.library() is None:
            pytest.skip(f"CPU kernels unavailable: {loader.reason()}")
        if request.param == "whole" and not loader.info()["whole_op"]:
            pytest.skip("whole-op kernel unavailable in this process")
        monkeypatch.setattr(loader, "whole_usable", lambda n: request.param == "whole")
    return request.param


def _inputs(seed, B=2, Hq=4, Hkv=2, T=70, D=5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    field = (0.7 * r(B, Hq, T)).cumsum(-1)
    level = field + torch.rand(B, Hq, T, generator=g, dtype=dtype)
    beta = torch.rand(Hq, generator=g, dtype=dtype) + 0.5
    xs = (r(B, Hq, T, D), r(B, Hkv, T, D), r(B, Hkv, T, D), field, level, beta)
    return [x.requires_grad_() for x in xs]


def _dense(q, k, v, field, level, beta, tau, scale):
    return causal_softmax_attention(q, k, v, evicting_bias(field, level, beta, tau, q.shape[1] // k.shape[1]), scale)


@pytest.mark.parametrize("tau", [0.0, 0.8, 3.0, math.inf])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (2, 1)])
def test_fast_path_matches_the_dense_reference_forward_and_gradients(path, tau, heads):
    xs = _inputs(seed=int(min(tau, 9) * 10) % 7 + heads[1], Hq=heads[0], Hkv=heads[1])
    scale = 0.4
    got = evicting_fpa(*xs, tau, scale, chunk=32)  # 70 queries: three chunks, the last partial
    ref = _dense(*xs, tau, scale)
    hidden = torch.isinf(evicting_bias(*xs[3:], tau, heads[0] // heads[1])).tril(-1).sum()
    if tau < 1:  # the comparison must cover masked keys
        assert hidden > 100
    # float64 on both sides; measured max differences ~1e-14 (outputs and gradients O(1))
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(ref)
    g_got = torch.autograd.grad((got * w).sum(), xs)
    g_ref = torch.autograd.grad((ref * w).sum(), xs)
    for name, a, b in zip("q k v field level beta".split(), g_got, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)


def test_float32_matches_the_float64_reference(path):
    xs = _inputs(seed=5)
    xs32 = [x.detach().float().requires_grad_() for x in xs]
    got = evicting_fpa(*xs32, 0.8, 0.4, chunk=32)
    ref = _dense(*xs, 0.8, 0.4)
    # float32 rounding: measured max |difference| 6e-7 on outputs, 5e-6 on gradients (O(1) values);
    # tolerances 4x above that, while one key decided differently moves an output by > 1e-2 here
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=3e-6)
    w = torch.randn_like(ref)
    g_got = torch.autograd.grad((got * w.float()).sum(), xs32)
    g_ref = torch.autograd.grad((ref * w).sum(), xs)
    for name, a, b in zip("q k v field level beta".split(), g_got, g_ref):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5, msg=name)


def _reference_mask(field, level, beta, tau, groups):
    """(B, H, i, j): the dense reference's rule-masked (query, key) pairs below the diagonal."""
    pos = torch.arange(field.shape[-1])
    return torch.isinf(evicting_bias(field, level, beta, tau, groups)) & (pos[:, None] >= pos[None, :])


def _mask_of(hide):
    pos = torch.arange(hide.shape[-1])
    return pos[:, None] >= hide[..., None, :]


@pytest.mark.parametrize("groups", [1, 2])
def test_hide_from_is_the_reference_mask(groups):
    _, _, _, field, level, beta = (x.detach() for x in _inputs(seed=3))
    masked = _mask_of(hide_from(field, level, beta, 0.8, groups))
    assert torch.equal(masked, _reference_mask(field, level, beta, 0.8, groups))
    assert masked.any() and not masked.diagonal(dim1=-2, dim2=-1).any()


@pytest.mark.parametrize("T", [1, 2, 3, 7, 64, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tau", [0.0, 1.0, 3.0, math.inf])
def test_hide_from_decides_every_key_as_the_reference_does_ties_included(T, dtype, tau):
    """Lengths that are not powers of two (the block search's edges), and integer-valued fields,
    levels and betas, so that beta * dip lands exactly on the threshold for many pairs (a strict
    ">" must hold on both sides); betas 0 and negative never hide anything."""
    g = torch.Generator().manual_seed(T)
    B, H = 3, 4
    field = torch.randint(-2, 3, (B, H, T), generator=g).cumsum(-1).to(dtype)
    level = field + torch.randint(0, 3, (B, H, T), generator=g).to(dtype)
    beta = torch.tensor([1.0, 0.5, 0.0, -1.0], dtype=dtype)
    for groups in (1, 2):
        masked = _mask_of(hide_from(field, level, beta, tau, groups))
        assert torch.equal(masked, _reference_mask(field, level, beta, tau, groups))
    if T >= 64 and tau <= 1:
        ties = (beta[None, :, None, None] * torch.relu(level[..., None, :] - field[..., :, None]) == tau).sum()
        assert ties > 100 and masked.any()  # the comparison covers exact ties and hidden keys


def _cache_form(seed, B=2, Hq=4, Hkv=2, P=19, Tq=45, D=5):
    """Chunked-op inputs in the cache form (P earlier keys, the queries at the last Tq positions)
    and a ``hide`` drawn per query head: key j hidden from the queries at positions >= hide[j],
    uniform in [j + 1, Tk] (Tk: never)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    Tk = P + Tq
    walk = (0.7 * r(B, Hq, Tk)).cumsum(-1)
    level = walk + torch.rand(B, Hq, Tk, generator=g, dtype=torch.float64)
    xs = (r(B, Hq, Tq, D), r(B, Hkv, Tk, D), r(B, Hkv, Tk, D), walk[..., P:], level)
    xs += (past_min_from_field(walk[..., :P]), torch.rand(Hq, generator=g, dtype=torch.float64) + 0.5)
    j = torch.arange(Tk)
    hide = j + 1 + (torch.rand(B, Hq, Tk, generator=g, dtype=torch.float64) * (Tk - j)).long()
    return [x.requires_grad_() for x in xs], hide


def _dense_hidden(q, k, v, field, level, past_min, beta, hide, scale):
    """The reference: -beta * dip in the cache form, -inf where the query position >= hide[j]."""
    Tq, Tk = q.shape[2], k.shape[2]
    bias = -beta[None, :, None, None] * penalty(field, level, Tq, past_min)
    pos = torch.arange(Tk - Tq, Tk)
    return causal_softmax_attention(q, k, v, bias.masked_fill(pos[:, None] >= hide[..., None, :], -math.inf), scale)


@pytest.mark.parametrize("heads", [(4, 2), (3, 3)])
def test_hide_in_the_cache_form_matches_the_dense_reference_forward_and_gradients(path, heads):
    xs, hide = _cache_form(seed=heads[1], Hq=heads[0], Hkv=heads[1])
    q, k = xs[0], xs[1]
    pos = torch.arange(k.shape[2] - q.shape[2], k.shape[2])
    visible = pos[:, None] >= torch.arange(k.shape[2])[None, :]
    hidden = (pos[:, None] >= hide[..., None, :]) & visible
    assert hidden.sum() > 1000 and (visible & ~hidden).sum() > 1000  # both kinds of (query, key) pair
    got = fpa_chunked(*xs, 0.4, chunk=16, hide=hide)  # 45 queries: three chunks, the last partial
    ref = _dense_hidden(*xs, hide, 0.4)
    # float64 on both sides; measured max differences 4e-16 (outputs) and 8e-15 (gradients), O(1)
    # values; the same tolerances as the whole-sequence test above, while ignoring hide moves outputs by > 2
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(ref)
    g_got = torch.autograd.grad((got * w).sum(), xs)
    g_ref = torch.autograd.grad((ref * w).sum(), xs)
    for name, a, b in zip("q k v field level past_min beta".split(), g_got, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)


def test_a_bad_hide_is_refused_before_any_work():
    xs, hide = _cache_form(seed=0)
    for bad, what in ((hide.int(), "torch.int32"), (hide[..., 1:], "(2, 4, 63)")):
        with pytest.raises(ValueError, match=rf"hide must be None or an int64 tensor .*{what}"):
            fpa_chunked(*xs, 0.4, hide=bad)


@pytest.mark.parametrize("with_hide", [False, True], ids=["hide=None", "hide"])
def test_the_chunked_op_passes_opcheck(with_hide):
    """Schema, autograd registration, fake tensors and AOT dispatch (what torch.compile relies on)."""
    xs, hide = _cache_form(seed=1, B=1, P=5, Tq=9)
    torch.library.opcheck(_forward_op, (*xs, hide if with_hide else None, 0.4, 4))
