"""Shared builders for the cache tests: small random layers and models (a uniquely named module,
so that `from cache_testing import ...` cannot pick up another folder's conftest)."""

import torch
import torch.nn.functional as F

from fpa.layers.attention import make_attention
from fpa.models import FPAConfig, FPAForCausalLM
from fpa.ops import dip

TYPES = [
    ("fpa", "free"),
    ("fpa", "walk"),
    ("fox", "free"),
    ("softmax_rope", "free"),
    ("softmax_alibi", "free"),
    ("softmax_nope", "free"),
]


def tiny_model(att="fpa", mode="free", seed=0, **kw):
    """A 2-layer random model, GQA (4 query heads, 2 KV heads), vocab 37."""
    torch.manual_seed(seed)
    kw.setdefault("num_key_value_heads", 2)
    c = FPAConfig(
        vocab_size=37,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        attention=att,
        fpa_mode=mode,
        **kw,
    )
    return FPAForCausalLM(c).eval()


def forgetful_layer(kind, seed=0, num_kv_heads=2, qk_norm=False, hidden=32, heads=4):
    """A single attention layer whose field actually forgets (large field weights / small gates).
    kind: "fox", an FPA mode ("free", "walk") or "walk-token" (walk with level_offset="token")."""
    torch.manual_seed(seed)
    if kind == "fox":
        layer = make_attention("fox", hidden, heads, num_kv_heads, qk_norm=qk_norm, fgate_bias_init=1.0)
        torch.nn.init.normal_(layer.fgate_proj.weight, std=0.5)
    else:
        mode, _, offset = kind.partition("-")
        layer = make_attention(
            "fpa",
            hidden,
            heads,
            num_kv_heads,
            fpa_mode=mode,
            qk_norm=qk_norm,
            field_init_std=0.5,
            beta_init=1.0,
            level_offset=offset or "none",
        )
    if qk_norm:
        with torch.no_grad():
            layer.q_norm.weight.uniform_(0.5, 1.5)
            layer.k_norm.weight.uniform_(0.5, 1.5)
    return layer.eval()


def full_qkv(layer, x):
    """q (B, Hq, T, D), k, v (B, Hkv, T, D) of a whole sequence, as the layer's forward computes them."""
    q = layer._heads(layer.q_proj(x), layer.num_heads)
    k = layer._heads(layer.k_proj(x), layer.num_kv_heads)
    v = layer._heads(layer.v_proj(x), layer.num_kv_heads)
    if layer.q_norm is not None:
        q, k = layer.q_norm(q), layer.k_norm(k)
    return q, k, v


def full_penalty(layer, x):
    """Dense beta * dip (B, Hq, T, T) [query i, key j] for the whole sequence x (B, T, hidden)."""
    if hasattr(layer, "fgate_proj"):
        field = torch.cumsum(F.logsigmoid(layer._per_head(layer.fgate_proj, x)), -1)
        return dip(field, field)
    field, level = layer.field_level(x)
    return layer.beta.detach()[None, :, None, None] * dip(field, level)


def kept_positions(lc, b, g):
    """Sorted positions held by row b, KV head g of a LayerCache."""
    st = lc.store
    return sorted(st["pos"][b, g][st["valid"][b, g]].tolist())
