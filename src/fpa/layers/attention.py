"""FoX, the softmax baselines, ``make_attention`` (one switch over the attention family) and the
transformer block. The calling convention of every attention module is fpa.layers.base's; FPA
lives in fpa.layers.first_passage and its options in fpa.layers.options.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpa.cache.store.paged import alibi_past_bias
from fpa.cache.store.state import LayerInfo, LayerState
from fpa.cache.store.weights import attention_weights, causal_block_mask
from fpa.layers.base import AttentionBase, RMSNorm, SwiGLU
from fpa.layers.first_passage import FirstPassageAttention
from fpa.layers.fpa_form import (
    check_straight_through,
    check_training_threshold,
    continue_walk,
    dense_weights,
    evicting_attention,
    fpa_cached,
    pad_out,
)
from fpa.layers.options import FPAOptions
from fpa.ops import first_passage_attention, forgetting_attention

__all__ = [
    "ATTENTION_TYPES",
    "AttentionBase",
    "FirstPassageAttention",
    "ForgettingAttention",
    "RMSNorm",
    "SoftmaxAttention",
    "SwiGLU",
    "TransformerBlock",
    "alibi_slopes",
    "make_attention",
    "rope",
]

ATTENTION_TYPES = ("fpa", "fox", "softmax_rope", "softmax_alibi", "softmax_nope")


class ForgettingAttention(AttentionBase):
    """FoX: forget gate f_t = sigmoid(w_h . x_t + b_h) per head; full forward via forgetting_attention.

    At initialisation w ~ N(0, 0.02^2) and b = fgate_bias_init (default 5, f ~ 0.993: little
    forgetting; a list of n values starts num_heads / n consecutive heads at each,
    fpa.checks.spread_over_heads). Decoding uses FPA's cache form with field = level = cumsum(log f), beta = 1 (P2).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        qk_norm: bool = False,
        output_gate: bool = False,
        head_dim: int | None = None,
        fgate_bias_init: float | tuple[float, ...] = 5.0,
        key_shift: bool = False,
        key_shift_bias_init: float = 0.0,
    ):
        super().__init__(
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            qk_norm,
            output_gate,
            key_shift=key_shift,
            key_shift_bias_init=key_shift_bias_init,
        )
        self.fgate_proj = nn.Linear(hidden_size, num_heads)
        nn.init.normal_(self.fgate_proj.weight, std=0.02)
        self._init_bias_per_head(self.fgate_proj, "fgate_bias_init", fgate_bias_init)

    def cache_info(self) -> LayerInfo:
        """What a decoding cache needs to know of this layer: kind "fox", the head groups, beta = 1 per
        head, the content bound."""
        return LayerInfo(
            kind="fox",
            groups=self.num_heads // self.num_kv_heads,
            beta=torch.ones(self.num_heads),
            content_bound=self.content_bound(),
        )

    training_eviction_threshold: float | None = None
    training_eviction_straight_through: bool = False

    def set_training_eviction(self, threshold: float | None, straight_through: bool = False) -> None:
        """In every forward pass without a cache, hide key j from query i once -sum_{j<u<i} log f_u
        > ``threshold``: fpa.cache.FoXEviction(threshold, within_chunks=True), in training (as
        FirstPassageAttention.set_training_eviction does for FPA's rule, ``straight_through``
        included). None turns it off."""
        self.training_eviction_threshold = check_training_threshold(threshold)
        self.training_eviction_straight_through = check_straight_through(straight_through)

    def log_forget(self, x: Tensor) -> Tensor:
        """log f (B, H, T) float32, the log forget gates of hidden states x (B, T, hidden): what
        the attention sums, -sum_{j<u<=i} log f_u being key j's decay at query i."""
        return F.logsigmoid(self._per_head(self.fgate_proj, x))

    def _attend(self, q, k, v, x, state, offset, mask=None, pos=None, need_weights=False):
        log_f = self.log_forget(x)
        if mask is not None:
            log_f = log_f.masked_fill(~mask[:, None, :], 0.0)  # padding adds no decay
        if state is None and self.training_eviction_threshold is not None:
            field, level = pad_out(*(2 * (continue_walk(log_f, None),)), mask)
            ones = field.new_ones(self.num_heads)
            thr = self.training_eviction_threshold
            st = self.training_eviction_straight_through
            return evicting_attention(q, k, v, field, level, ones, thr, self.scale, need_weights, st)
        if state is None and mask is None and not need_weights:
            return forgetting_attention(q, k, v, log_f, check_inputs=False), None
        field, level = pad_out(*(2 * (continue_walk(log_f, state),)), mask)
        if state is not None:
            return fpa_cached(q, k, v, field, level, 1.0, state, "auto", mask, pos, need_weights)
        # P2: FoX is FPA with field = level = cumsum(log f) and beta = 1
        if mask is None:
            o = forgetting_attention(q, k, v, log_f)
        else:
            o = first_passage_attention(q, k, v, field, level, beta=1.0)
        return o, (dense_weights(q, k, field, level, 1.0) if need_weights else None)


def rope(x: Tensor, pos: Tensor, theta: float) -> Tensor:
    """Rotary position embedding of x (..., T, d) at positions pos (T,) or, for x (B, H, T, d),
    per-row positions (B, T); half-split pairing.

    The first 2 * (d // 2) channels are rotated in pairs (c, c + d // 2); for odd d the last
    channel passes through unrotated (so d = 1 carries no position at all).
    """
    d = x.shape[-1]
    h = d // 2
    inv = (
        1.0 / (theta ** (torch.arange(h, device=x.device, dtype=torch.float32) * 2 / (2 * h)))
        if h
        else x.new_zeros(0).float()
    )
    ang = pos.float()[..., None] * inv  # (T, d // 2) or (B, T, d // 2)
    cos, sin = ang.cos(), ang.sin()
    if pos.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d // 2)
    xf = x.float()
    x1, x2, rest = xf[..., :h], xf[..., h : 2 * h], xf[..., 2 * h :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], -1).to(x.dtype)


def alibi_slopes(n: int) -> Tensor:
    """ALiBi's per-head slopes (n,) float32: 2^(-8 i / n) for i = 1..n when n is a power of two;
    otherwise the slopes of c (the power of two below n), then every other slope of 2c."""

    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        s = pow2(n)
    else:
        c = 2 ** math.floor(math.log2(n))
        s = pow2(c) + pow2(2 * c)[0::2][: n - c]
    return torch.tensor(s, dtype=torch.float32)


class SoftmaxAttention(AttentionBase):
    """Causal softmax attention (torch SDPA) with position "rope", "alibi" or "nope"."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        position: str = "rope",
        qk_norm: bool = False,
        output_gate: bool = False,
        head_dim: int | None = None,
        rope_theta: float = 10000.0,
        key_shift: bool = False,
        key_shift_bias_init: float = 0.0,
    ):
        super().__init__(
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            qk_norm,
            output_gate,
            key_shift=key_shift,
            key_shift_bias_init=key_shift_bias_init,
        )
        if position not in ("rope", "alibi", "nope"):
            raise ValueError(f"position must be rope, alibi or nope, got {position!r}")
        self.position, self.rope_theta = position, rope_theta
        # One slope for every head instead of the standard geometric sequence (fpa.models.packed
        # packs independent one-head models as heads). Not a buffer: a non-persistent buffer is not
        # restored by from_pretrained (transformers builds the model on the meta device).
        self.alibi_slope_override: float | None = None
        self._slopes_memo: dict[tuple, Tensor] = {}

    @property
    def slopes(self) -> Tensor:
        """ALiBi slopes (H,), float32 on the CPU, computed from the head count on every call."""
        if self.alibi_slope_override is not None:
            return torch.full((self.num_heads,), float(self.alibi_slope_override))
        return alibi_slopes(self.num_heads)

    def slopes_on(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The slopes (H,) on ``device`` in ``dtype``, copied there once per (device, dtype,
        override): a host-to-device copy on every decode step would wait on the host."""
        key = (device, dtype, self.alibi_slope_override)
        out = self._slopes_memo.get(key)
        if out is None:
            out = self._slopes_memo[key] = self.slopes.to(device=device, dtype=dtype)
        return out

    def _attend(self, q, k, v, x, state, offset, mask=None, pos=None, need_weights=False):
        B, T = q.shape[0], q.shape[2]
        if pos is None and state is not None:
            pos = state.positions(B, T, q.device, mask)  # each row counts its own real tokens
        qpos = torch.arange(offset, offset + T, device=q.device) if pos is None else pos.to(q.device).expand(B, T)
        if self.position == "rope":
            q, k = rope(q, qpos, self.rope_theta), rope(k, qpos, self.rope_theta)
        rep = self.num_heads // self.num_kv_heads
        if state is None:
            kpos = qpos[None, None] if qpos.dim() == 1 else qpos[:, None]
            valid = None if mask is None else mask[:, None, :]
        else:
            qp = qpos.expand(B, T)
            new_bias = self._bias(qp, qp[:, None], None if mask is None else mask[:, None], torch.float32)
            past = (
                alibi_past_bias(state.store, qp, self.slopes_on(q.device, torch.float32))
                if self.position == "alibi"
                else None
            )
            return state.attend(q, k, v, past, new_bias, need_weights, pos=qp, mask=mask)
        bias = self._bias(qpos, kpos, valid, q.dtype)  # (B or 1, Hq or 1, T, Tk)
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=bias)
        w = attention_weights(q, k, bias.float(), self.scale) if need_weights else None
        return o, w

    def _bias(self, qpos: Tensor, kpos: Tensor, valid: Tensor | None, dtype) -> Tensor:
        """Additive mask: -inf for future (by order), evicted or padding (invalid) keys, minus the
        ALiBi slope times the position distance; a query always sees its own key (so a padding
        query's row is never empty). qpos (T,) or (B, T), kpos (B, H, Tk) positions, valid
        (B, H, Tk) or None -> (B, H, T, Tk); the last T keys are the new tokens."""
        T, Tk = qpos.shape[-1], kpos.shape[-1]
        qp = qpos[:, None] if qpos.dim() == 1 else qpos[:, None, :, None]
        rel = qp - kpos[..., None, :].long()  # (B, H, T, Tk)
        allowed = causal_block_mask(T, Tk, rel.device)
        if valid is not None:
            allowed = allowed & valid[..., None, :]
        own = torch.zeros(T, Tk, dtype=torch.bool, device=rel.device)
        own[:, Tk - T :] = torch.eye(T, dtype=torch.bool, device=rel.device)
        allowed = allowed | own
        shape = torch.broadcast_shapes(rel.shape, allowed.shape)
        mask = torch.zeros(shape, device=rel.device, dtype=dtype).masked_fill(~allowed, float("-inf"))
        if self.position == "alibi":
            mask = mask - self.slopes_on(rel.device, dtype)[:, None, None] * rel.clamp(min=0).to(dtype)
        return mask


def make_attention(
    attention: str,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    fpa: FPAOptions | dict | None = None,
    qk_norm: bool = False,
    output_gate: bool = False,
    key_shift: bool = False,
    key_shift_bias_init: float = 0.0,
    **kw,
) -> AttentionBase:
    """One switch over the attention family: ``attention`` in ATTENTION_TYPES. ``fpa``: the FPA
    options (FPAOptions or a dict of its fields; default ``FPAOptions()``), for attention="fpa"
    only (ValueError otherwise). ``qk_norm``, ``output_gate``, ``key_shift``, ``key_shift_bias_init``:
    AttentionBase's, for every type. ``kw``: the chosen class's own other arguments."""
    common: dict[str, Any] = dict(
        qk_norm=qk_norm, output_gate=output_gate, key_shift=key_shift, key_shift_bias_init=key_shift_bias_init, **kw
    )
    if attention == "fpa":
        return FirstPassageAttention(hidden_size, num_heads, num_kv_heads, options=fpa, **common)
    if fpa is not None:
        raise ValueError(f"fpa options are for attention='fpa', got attention={attention!r}")
    if attention == "fox":
        return ForgettingAttention(hidden_size, num_heads, num_kv_heads, **common)
    if attention.startswith("softmax_") and attention in ATTENTION_TYPES:
        return SoftmaxAttention(hidden_size, num_heads, num_kv_heads, position=attention[len("softmax_") :], **common)
    raise ValueError(f"attention must be one of {ATTENTION_TYPES}, got {attention!r}")


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + SwiGLU(norm(x)); ``attn_kw`` go to
    ``make_attention`` (e.g. ``fpa=FPAOptions(...)``)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        attention: str = "fpa",
        num_heads: int = 4,
        num_kv_heads: int | None = None,
        eps: float = 1e-6,
        **attn_kw,
    ):
        super().__init__()
        self.attn_norm = RMSNorm(hidden_size, eps)
        self.attn = make_attention(attention, hidden_size, num_heads, num_kv_heads, **attn_kw)
        self.mlp_norm = RMSNorm(hidden_size, eps)
        self.mlp = SwiGLU(hidden_size, intermediate_size)

    def forward(
        self,
        x: Tensor,
        state: LayerState | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool = False,
    ):
        """x (B, T, hidden) -> (B, T, hidden), or (that, attention weights) with output_attentions."""
        a = self.attn(self.attn_norm(x), state, attention_mask, position_ids, output_attentions)
        a, w = a if output_attentions else (a, None)
        x = x + a
        x = x + self.mlp(self.mlp_norm(x))
        return (x, w) if output_attentions else x
