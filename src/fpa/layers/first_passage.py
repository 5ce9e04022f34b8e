"""First Passage Attention as a model layer: field and level from the hidden state (free heads or
a walk with an optional level offset), and the FPA form of attention shared with FoX
(docs/fpa.md, "FoX as a special case"). Its options are one ``FPAOptions`` (fpa.layers.options).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpa.cache.store.state import LayerInfo, LayerState
from fpa.layers.base import AttentionBase
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
from fpa.ops import first_passage_attention


class FirstPassageAttention(AttentionBase):
    """First Passage Attention layer; ``options`` (an FPAOptions, default ``FPAOptions()``) sets
    everything FPA-specific, the other arguments are AttentionBase's.

    ``options.mode="free"``: field and level are separate linear heads of the hidden state (one
    scalar per head and position). ``"walk"``: field = walk(increments), level = field + the
    offset ``options.level_offset`` sets ("none": level = field; "head": one learned constant
    per head; "token": softplus(u_h . x_t + c_h) per head and token, one linear projection
    hidden -> heads, ``level_offset_proj``). A head or token offset lets a key dip (and the cache
    evict it) while the walk stays on its floor; docs/design.md, "One FPA options object", says
    when the synthetic heads need one.

    Initialisation: field/level/increment/offset weights ~ N(0, field_init_std^2), biases
    ``walk_bias_init`` (increment) and 0 (free heads), so the layer starts close to causal softmax
    without positional encoding.

    ``set_training_eviction(threshold)`` trains with the cache's eviction rule in the loop (a key
    whose penalty passes the threshold is masked out, as FPAEviction evicts it) in every forward
    pass without a cache; off by default. ``field_parameters()`` (the field heads, the level offset
    and beta) train at ``options.field_lr_multiplier`` x the learning rate
    (``fpa.train.parameter_groups``, used by ``fpa train``; use it in your own loop too).

    Args:
        hidden_size: Width of the hidden states x (B, T, hidden_size).
        num_heads: Query heads (one field and level per head).
        num_kv_heads: Key/value heads (default num_heads); must divide num_heads.
        options: The FPA options (FPAOptions, or a dict of its fields).
        qk_norm: Per-head RMS norm of q and k.
        output_gate: A sigmoid output gate.
        head_dim: Per-head width (default hidden_size // num_heads).
        backend: The op's backend for a forward pass without a cache (fpa.ops).
        key_shift: Mix each key with its predecessor's by a learned gate (fpa.layers.key_shift).
        key_shift_bias_init: The gate's bias at init (sigmoid of it: the predecessor's share).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        options: FPAOptions | dict | None = None,
        qk_norm: bool = False,
        output_gate: bool = False,
        head_dim: int | None = None,
        backend: str = "auto",
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
        opts = FPAOptions.from_dict(options, "options")
        self.options, self.mode, self.backend = opts, opts.mode, backend
        self.walk_increment, self.beta_activation = opts.walk_increment, opts.beta_activation
        self.level_offset_kind = None if opts.level_offset == "none" else opts.level_offset
        self.field_lr_multiplier = opts.field_lr_multiplier
        std = opts.field_init_std
        if opts.mode == "free":
            self.field_proj = nn.Linear(hidden_size, num_heads)
            self.level_proj = nn.Linear(hidden_size, num_heads)
            heads: tuple[nn.Linear, ...] = (self.field_proj, self.level_proj)
        else:
            self.increment_proj = nn.Linear(hidden_size, num_heads)
            heads = (self.increment_proj,)
            if opts.walk_increment == "gated":  # tanh(a) * sigmoid(g): saturates at -1, 0 and +1
                self.increment_gate_proj = nn.Linear(hidden_size, num_heads)
                heads += (self.increment_gate_proj,)
        for lin in heads:
            nn.init.normal_(lin.weight, std=std)
            nn.init.zeros_(lin.bias)
        if opts.mode == "walk":
            self._init_bias_per_head(self.increment_proj, "walk_bias_init", opts.walk_bias_init)
        self.level_offset = (
            nn.Parameter(torch.full((num_heads,), opts.level_offset_init)) if opts.level_offset == "head" else None
        )
        self.level_offset_proj = None
        if opts.level_offset == "token":
            self.level_offset_proj = nn.Linear(hidden_size, num_heads)
            nn.init.normal_(self.level_offset_proj.weight, std=std)
            nn.init.constant_(self.level_offset_proj.bias, opts.level_offset_bias_init)
        beta0 = opts.beta_init
        if (
            opts.beta_activation == "exp"
        ):  # the same initial beta, softplus(beta_init), in log space (no tensor: meta init)
            beta0 = math.log(max(beta0, 0.0) + math.log1p(math.exp(-abs(beta0))))
        self.beta_param = nn.Parameter(torch.full((num_heads,), beta0))

    training_eviction_threshold: float | None = None
    training_eviction_straight_through: bool = False

    def set_training_eviction(self, threshold: float | None, straight_through: bool = False) -> None:
        """In every forward pass without a cache (training, and the trainer's evaluations in eval
        mode, so a held-out loss or a probe measures the model under the rule it trains with), mask
        key j out of query i once beta * dip(i - 1, j) > ``threshold``: what
        fpa.cache.FPAEviction(threshold, within_chunks=True) does when decoding, so the model learns
        under the eviction it will be served with (fpa_form.evicting_attention). None turns it off.
        With a cache, the cache's policy decides. ``straight_through``: gradients as without the
        rule (fpa_form.evicting_attention's ``straight_through``)."""
        self.training_eviction_threshold = check_training_threshold(threshold)
        self.training_eviction_straight_through = check_straight_through(straight_through)

    @property
    def beta(self) -> Tensor:
        """The penalty strength per head (H,): exp or softplus of ``beta_param``."""
        return F.softplus(self.beta_param) if self.beta_activation == "softplus" else torch.exp(self.beta_param)

    @torch.no_grad()
    def set_beta_(self, beta: float | Tensor) -> None:
        """Set beta (a positive number, or one per head (H,)) through the layer's activation."""
        b = torch.as_tensor(beta, dtype=self.beta_param.dtype).expand_as(self.beta_param)
        if not bool((b > 0).all()):
            raise ValueError(f"beta must be > 0, got {beta!r}")
        self.beta_param.copy_(torch.log(torch.expm1(b)) if self.beta_activation == "softplus" else torch.log(b))

    def field_parameters(self) -> list[nn.Parameter]:
        """The parameters that train at ``field_lr_multiplier`` x the learning rate: the field /
        level (free) or increment (walk) heads, the level offset (or its projection) and beta."""
        heads: tuple[nn.Linear, ...] = (
            (self.field_proj, self.level_proj) if self.mode == "free" else (self.increment_proj,)
        )
        if self.walk_increment == "gated" and self.mode == "walk":
            heads += (self.increment_gate_proj,)
        if self.level_offset_proj is not None:
            heads += (self.level_offset_proj,)
        extra = [self.beta_param] + ([self.level_offset] if self.level_offset is not None else [])
        return [p for lin in heads for p in lin.parameters()] + extra

    def cache_info(self) -> LayerInfo:
        """What a decoding cache needs to know of this layer: kind "fpa", the head groups, beta
        (detached), the content bound and the mode."""
        return LayerInfo(
            kind="fpa",
            groups=self.num_heads // self.num_kv_heads,
            beta=self.beta.detach(),
            content_bound=self.content_bound(),
            mode=self.mode,
        )

    def field_level(
        self, x: Tensor, state: LayerState | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(field, level) (B, H, T) float32 for new tokens x (B, T, hidden); in walk mode continues
        the cached walk, and level = field + the level offset. The cache stores each key's level as
        computed here (LayerState.append, fpa.cache.store.state), so decoding and eviction use the same levels.
        mask (B, T) bool: padding positions take no walk step and get field = level = +PAD_BIG
        (never a minimum, never a live key)."""
        if self.mode == "free":
            field, level = self._per_head(self.field_proj, x), self._per_head(self.level_proj, x)
            return pad_out(field, level, mask)
        inc = self._per_head(self.increment_proj, x)
        if self.walk_increment == "tanh":
            inc = torch.tanh(inc)
        elif self.walk_increment == "gated":
            inc = torch.tanh(inc) * torch.sigmoid(self._per_head(self.increment_gate_proj, x))
        if mask is not None:
            inc = inc.masked_fill(~mask[:, None, :], 0.0)
        field = continue_walk(inc, state)
        return pad_out(field, self.walk_level(field, x), mask)

    def walk_level(self, field: Tensor, x: Tensor) -> Tensor:
        """Walk mode: level (B, H, T) = field (B, H, T) + the offset for the tokens x (B, T, hidden)."""
        if self.level_offset is not None:  # level_offset_kind "head"
            return field + self.level_offset.float()[None, :, None]
        if self.level_offset_proj is not None:  # level_offset_kind "token"
            # contiguous: softplus's backward on a transposed input gets other strides from torch's
            # fake tensors than from the real kernel, which breaks torch.compile's backward (torch 2.13)
            return field + F.softplus(self._per_head(self.level_offset_proj, x).contiguous())
        return field

    def _attend(self, q, k, v, x, state, offset, mask=None, pos=None, need_weights=False):
        field, level = self.field_level(x, state, mask)
        if state is None and self.training_eviction_threshold is not None:
            thr = self.training_eviction_threshold
            st = self.training_eviction_straight_through
            return evicting_attention(q, k, v, field, level, self.beta, thr, self.scale, need_weights, st)
        if state is None:
            o = first_passage_attention(
                q, k, v, field, level, beta=self.beta, backend=self.backend, check_inputs=False
            )  # built here: no value checks, no host sync
            return o, (dense_weights(q, k, field, level, self.beta) if need_weights else None)
        return fpa_cached(q, k, v, field, level, self.beta, state, self.backend, mask, pos, need_weights)
