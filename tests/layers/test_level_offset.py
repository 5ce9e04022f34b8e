"""FPA walk's level offset (level_offset="token"): the layer against a float64 oracle written from
the definition, its initialisation and learning-rate group, the floor keys it lets the cache
evict, and the argument errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from fpa.cache import FPACache, FPAEviction
from fpa.layers.attention import FirstPassageAttention
from fpa.layers.options import FPAOptions
from fpa.train import parameter_groups


def _token_layer(increment="tanh", seed=0, hidden=16, heads=4, kv_heads=2):
    """A "token" walk layer whose walk, offset and beta all matter (large random field weights)."""
    torch.manual_seed(seed)
    layer = FirstPassageAttention(
        hidden,
        heads,
        kv_heads,
        options=FPAOptions(
            mode="walk", level_offset="token", walk_increment=increment, field_init_std=0.5, level_offset_bias_init=0.0
        ),
    )
    layer.set_beta_(torch.tensor([0.5, 1.0, 2.0, 3.0]))
    return layer.double()


def _oracle(p: dict, x: torch.Tensor, heads: int, kv_heads: int, increment: str, offset: bool = True):
    """The layer's output from its definition, in float64 (every parameter in ``p``, by name):
    q, k, v, o linear maps; the walk field_t = sum_{u <= t} inc_u, inc = tanh(w x + b) or w x + b;
    level_j = field_j + softplus(u . x_j + c) per head (``offset=False``: level = field);
    dip(i, j) = max(0, level_j - min_{j < t <= i} field_t), dip(i, i) = 0; beta = exp(beta_param);
    o_i = sum_{j <= i} softmax_j(<q_i, k_j> / sqrt(D) - beta dip(i, j)) v_j per head."""
    B, T, _ = x.shape
    G = heads // kv_heads
    split = lambda y, n: y.view(B, T, n, -1).transpose(1, 2)  # noqa: E731  (B, n, T, D)
    q = split(x @ p["q_proj.weight"].T, heads)
    k = split(x @ p["k_proj.weight"].T, kv_heads)
    v = split(x @ p["v_proj.weight"].T, kv_heads)
    pre = (x @ p["increment_proj.weight"].T + p["increment_proj.bias"]).transpose(1, 2)  # (B, H, T)
    field = torch.cumsum(torch.tanh(pre) if increment == "tanh" else pre, -1)
    level = field
    if offset:
        level = field + F.softplus(x @ p["level_offset_proj.weight"].T + p["level_offset_proj.bias"]).transpose(1, 2)
    beta = torch.exp(p["beta_param"])
    out = torch.zeros(B, heads, T, q.shape[-1], dtype=x.dtype)
    for h in range(heads):
        for i in range(T):
            logits = []
            for j in range(i + 1):
                dip = (
                    torch.zeros(B, dtype=x.dtype)
                    if j == i
                    else torch.relu(level[:, h, j] - field[:, h, j + 1 : i + 1].min(-1).values)
                )
                logits.append((q[:, h, i] * k[:, h // G, j]).sum(-1) / math.sqrt(q.shape[-1]) - beta[h] * dip)
            w = torch.softmax(torch.stack(logits, -1), -1)  # (B, i + 1)
            out[:, h, i] = (w[..., None] * v[:, h // G, : i + 1]).sum(1)
    return out.transpose(1, 2).reshape(B, T, -1) @ p["o_proj.weight"].T


@pytest.mark.parametrize("increment", ["tanh", "linear"])
def test_forward_and_gradients_match_the_definition(increment):
    layer = _token_layer(increment)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    w = torch.randn(2, 9, 16, dtype=torch.float64)
    (layer(x) * w).sum().backward()
    p = {n: t.detach().clone().requires_grad_() for n, t in layer.named_parameters()}
    want = _oracle(p, x, 4, 2, increment)
    (want * w).sum().backward()
    # the layer computes field and level in float32 (AttentionBase._per_head): worst differences
    # measured over 8 layers 1.1e-7 (outputs) and 8.9e-7 (gradients, up to ~10); tolerances 1e-5, 5e-5
    torch.testing.assert_close(layer(x), want.detach(), atol=1e-5, rtol=0)
    for name, param in layer.named_parameters():
        torch.testing.assert_close(param.grad, p[name].grad, atol=5e-5, rtol=1e-5, msg=name)
    # the offset matters (measured over 8 layers: gradient >= 0.36, output change >= 0.26)
    assert p["level_offset_proj.weight"].grad.abs().max() > 0.1, "the offset must receive a gradient"
    assert (_oracle(p, x, 4, 2, increment, offset=False) - want).abs().max() > 0.1, "level = field must differ"


def test_initial_offset_is_small_and_trains_with_the_field_heads():
    torch.manual_seed(0)
    layer = FirstPassageAttention(16, 2, options=FPAOptions(mode="walk", level_offset="token", field_lr_multiplier=0.1))
    lin = layer.level_offset_proj
    assert (lin.in_features, lin.out_features) == (16, 2) and lin.bias.tolist() == [-4.0, -4.0]
    assert 0.01 < lin.weight.std().item() < 0.03  # N(0, field_init_std^2), std 0.02
    field, level = layer.field_level(torch.randn(3, 20, 16))
    offset = level - field
    # softplus(-4) = 0.0181; u . x with |u| ~ 0.02 sqrt(16) moves it by a few percent
    assert torch.allclose(offset, torch.full_like(offset, math.log1p(math.exp(-4.0))), atol=5e-3)
    assert offset.std() > 0, "the offset depends on the token"
    assert layer.level_offset is None
    in_field = {id(p) for p in layer.field_parameters()}
    assert {id(lin.weight), id(lin.bias)} <= in_field
    mult = {id(p): g["lr_multiplier"] for g in parameter_groups(layer, 0.0) for p in g["params"]}
    assert mult[id(lin.weight)] == mult[id(lin.bias)] == 0.1 and mult[id(layer.q_proj.weight)] == 1.0


def test_head_offset_is_one_constant_per_head():
    torch.manual_seed(0)
    layer = FirstPassageAttention(16, 2, options=FPAOptions(mode="walk", level_offset="head"))
    with torch.no_grad():
        layer.level_offset.copy_(torch.tensor([0.5, -1.0]))
    field, level = layer.field_level(torch.randn(1, 7, 16))
    assert layer.level_offset_kind == "head" and layer.level_offset_proj is None
    torch.testing.assert_close(level - field, torch.tensor([0.5, -1.0])[None, :, None].expand(1, 2, 7))


def test_head_offset_starts_at_level_offset_init():
    """level_offset_init sets the "head" offset's starting value (default 1)."""
    torch.manual_seed(0)
    x = torch.randn(1, 6, 16)
    for init in (0.0, 1.0, -0.5):
        layer = FirstPassageAttention(
            16, 2, options=FPAOptions(mode="walk", level_offset="head", level_offset_init=init)
        )
        field, level = layer.field_level(x)
        assert layer.level_offset.tolist() == [init, init]
        torch.testing.assert_close(level - field, torch.full_like(field, init))
        assert any(p is layer.level_offset for p in layer.field_parameters())


def test_floor_keys_are_evicted_only_with_a_token_offset():
    """A walk that never moves (zero increments) keeps every key on its floor: with level = field
    each has penalty 0 for good and FPA's rule holds all of them; with a token offset of 2.1
    every key but the newest dips by 2.1 > tau and is evicted. The cache stores the offset levels."""
    held = {}
    for level_offset in ("none", "token"):
        torch.manual_seed(0)
        layer = FirstPassageAttention(
            8, 1, options=FPAOptions(mode="walk", level_offset=level_offset, level_offset_bias_init=2.0)
        ).eval()
        with torch.no_grad():
            layer.increment_proj.weight.zero_()
            layer.increment_proj.bias.zero_()
            if level_offset == "token":
                layer.level_offset_proj.weight.zero_()  # offset softplus(2) = 2.13 for every token
        layer.set_beta_(1.0)
        cache = FPACache(FPAEviction(1.0))
        x = torch.randn(1, 12, 8)
        with torch.no_grad():
            for a in range(0, 12, 3):
                layer(x[:, a : a + 3], cache.layer(0))
                cache.step_done()
        held[level_offset] = int(cache.layer(0).counts().sum())
    assert held == {"none": 12, "token": 1}


@pytest.mark.parametrize(
    "kw,words",
    [
        (
            dict(mode="walk", level_offset="bogus"),
            r"FPAOptions.level_offset must be one of \('none', 'head', 'token'\), got 'bogus'",
        ),
        (dict(mode="walk", level_offset=1), r"FPAOptions.level_offset must be one of .* got 1"),
        (dict(mode="walk", level_offset=None), r"FPAOptions.level_offset must be one of .* got None"),
        (
            dict(mode="walk", level_offset=True),
            r"FPAOptions.level_offset must be .* got True \(use 'none' for false, 'head' for true\)",
        ),
        (dict(mode="walk", level_offset=False), r"FPAOptions.level_offset must be .* got False \(use 'none' for false"),
        (
            dict(mode="free", level_offset="token"),
            r"FPAOptions.level_offset='token' needs mode='walk'.*got mode='free'",
        ),
        (dict(mode="free", level_offset="head"), r"level_offset='head' needs mode='walk'"),
        (
            dict(mode="walk", level_offset="token", level_offset_bias_init=math.nan),
            "FPAOptions.level_offset_bias_init must be a finite number, got nan",
        ),
        (
            dict(mode="walk", level_offset="token", level_offset_bias_init="-4"),
            "level_offset_bias_init must be a finite",
        ),
        (
            dict(mode="walk", level_offset="head", level_offset_init=math.inf),
            "FPAOptions.level_offset_init must be a finite number, got inf",
        ),
        (
            dict(mode="walk", level_offset="head", level_offset_init=True),
            "level_offset_init must be a finite number, got True",
        ),
    ],
)
def test_bad_arguments_are_named(kw, words):
    with pytest.raises(ValueError, match=words):
        FirstPassageAttention(16, 2, options=FPAOptions(**kw))


def test_level_offset_is_one_typed_choice():
    """The default is no offset in either mode; "none" is accepted in both."""
    assert FirstPassageAttention(16, 2, options=FPAOptions(mode="walk")).level_offset_kind is None
    assert FirstPassageAttention(16, 2, options=FPAOptions(mode="free")).level_offset_kind is None
    for mode in ("free", "walk"):
        layer = FirstPassageAttention(16, 2, options=FPAOptions(mode=mode, level_offset="none"))
        assert layer.level_offset_kind is None and layer.level_offset is None and layer.level_offset_proj is None
