"""Attention probabilities of an attention layer, from its own projections and its op's definition.

``attention_probs(layer, x)`` rebuilds the causal softmax weights the layer's forward uses, for
every layer type of ``fpa.layers.make_attention``, from what the layer itself computes:
``layer.project(x)`` (q, k, v as its forward hands them to the op), FPA's ``field_level(x)`` with
the penalty ``beta * dip`` (fpa.ops.dip), FoX's ``log_forget(x)`` (bias ``sum log f``), RoPE
(``fpa.layers.attention.rope``) and ALiBi's slopes. Tests check that ``probs @ v`` through
``o_proj`` reproduces ``layer(x)``, so this cannot drift from the layer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.layers.attention import AttentionBase, FirstPassageAttention, ForgettingAttention, SoftmaxAttention, rope
from fpa.ops import dip, past_min_from_field


def _bias(layer: AttentionBase, x: Tensor, T: int, last_only: bool) -> Tensor:
    """Additive logit bias (B or 1, H, Tq, T) of the layer type (0 for softmax without ALiBi).

    Tq = T, or 1 with ``last_only`` (the row of the last query).
    """
    if isinstance(layer, FirstPassageAttention):
        field, level = layer.field_level(x)
        if last_only:  # min of the field after key j up to the end; +inf (no dip) for the last key
            pen = torch.relu(level - past_min_from_field(field))[..., None, :]
        else:
            pen = dip(field, level)
        return -layer.beta.float()[None, :, None, None] * pen
    if isinstance(layer, ForgettingAttention):
        c = torch.cumsum(layer.log_forget(x), -1)
        return c[..., -1 if last_only else 0 :, None] - c[..., None, :]
    if isinstance(layer, SoftmaxAttention):
        rel = (torch.arange(T - 1 if last_only else 0, T)[:, None] - torch.arange(T)[None, :]).clamp(min=0).float()
        if layer.position == "alibi":
            return -layer.slopes.to(rel.device)[None, :, None, None] * rel
        return torch.zeros(1, 1, rel.shape[0], T)
    raise ValueError(f"layer must be an fpa.layers attention module, got {type(layer).__name__}")


def qkv(layer: AttentionBase, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (B, H, T, D) in float32 as the layer's attention op sees them (RoPE applied)."""
    if layer.num_kv_heads != layer.num_heads:
        raise ValueError("attention_probs supports num_kv_heads == num_heads only")
    q, k, v = layer.project(x)
    if isinstance(layer, SoftmaxAttention) and layer.position == "rope":
        pos = torch.arange(x.shape[1])
        q, k = rope(q, pos, layer.rope_theta), rope(k, pos, layer.rope_theta)
    return q.float(), k.float(), v.float()


def attention_probs(layer: AttentionBase, x: Tensor, last_only: bool = False) -> tuple[Tensor, Tensor]:
    """Causal attention weights (B, H, T, T) (rows = queries) and the values (B, H, T, D).

    With ``last_only``, only the last query's row: weights (B, H, 1, T).

    x: (B, T, hidden), the layer's input. ``(probs @ values)`` is the per-head output before
    ``o_proj`` (and before an output gate, which this does not apply).
    """
    if x.dim() != 3 or x.shape[-1] != layer.hidden_size:
        raise ValueError(f"x must have shape (B, T, {layer.hidden_size}), got {tuple(x.shape)}")
    T = x.shape[1]
    q, k, v = qkv(layer, x)
    if last_only:
        q = q[..., -1:, :]
    s = q @ k.transpose(-1, -2) * layer.head_dim**-0.5 + _bias(layer, x, T, last_only)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[-q.shape[2] :]
    return torch.softmax(s.masked_fill(~causal, float("-inf")), -1), v


def layer_output(layer: AttentionBase, probs: Tensor, v: Tensor) -> Tensor:
    """The layer's output (B, Tq, hidden) from probs (B, H, Tq, T) and values (B, H, T, D)."""
    B, H, Tq, _ = probs.shape
    o = (probs @ v).transpose(1, 2).reshape(B, Tq, H * v.shape[-1])
    return layer.o_proj(o.to(layer.o_proj.weight.dtype))
