"""Attention module family: FPA, FoX and softmax baselines sharing one projection base class.

Every attention module takes hidden states (B, T, hidden) and an optional per-layer cache
state (a dict, filled in place) and returns (B, T, hidden). With a state, the T new tokens
are appended after the cached ones (incremental decoding or chunked prefill).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpa.cache.layer import LayerCache, LayerInfo
from fpa.cache.paged import alibi_past_bias, fpa_past_bias
from fpa.cache.storage import PAD_BIG
from fpa.cache.weights import attention_weights, causal_block_mask, fpa_bias
from fpa.ops import first_passage_attention, forgetting_attention

ATTENTION_TYPES = ("fpa", "fox", "softmax_rope", "softmax_alibi", "softmax_nope")
FPA_MODES = ("free", "walk")
WALK_INCREMENTS = ("linear", "tanh", "gated")
BETA_ACTIVATIONS = ("softplus", "exp")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def layer_state(state: LayerCache | dict | None) -> LayerCache | None:
    """The LayerCache to use: ``state`` itself, or one kept in a plain dict under "layer"."""
    if state is None or isinstance(state, LayerCache):
        return state
    if isinstance(state, dict):
        return state.setdefault("layer", LayerCache())
    raise ValueError(f"state must be a fpa.cache.LayerCache, a dict or None, got {type(state).__name__}")


class AttentionBase(nn.Module):
    """q, k, v, o projections (+ optional per-head RMS qk-norm and a sigmoid output gate).

    Subclasses implement ``_attend(q, k, v, x, state, offset, mask, pos, need_weights)`` with
    q (B, Hq, T, D), k, v (B, Hkv, T, D) for the new tokens only; ``offset`` is the number of tokens
    seen before; mask (B, T) bool (False = padding) or None; pos (B, T) positions or None; they
    return (output (B, Hq, T, D), weights (B, Hq, T, Tk) or None). ``state`` is a
    fpa.cache.LayerCache (or None): the subclass reads the cached keys from it and appends the new
    ones (LayerCache.append), which advances its length.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, qk_norm: bool = False, output_gate: bool = False,
                 bias: bool = False):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if hidden_size <= 0 or num_heads <= 0 or num_kv_heads <= 0:
            raise ValueError("hidden_size, num_heads and num_kv_heads must be positive")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if head_dim is None:
            if hidden_size % num_heads:
                raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
            head_dim = hidden_size // num_heads
        self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim = hidden_size, num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim) if qk_norm else None
        self.k_norm = RMSNorm(head_dim) if qk_norm else None
        self.gate_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False) if output_gate else None

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)

    def _per_head(self, lin: nn.Linear, x: Tensor) -> Tensor:
        """Linear head with one scalar per head -> (B, H, T), float32."""
        return lin(x).float().transpose(1, 2)

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5

    def content_bound(self) -> float | None:
        """c with |scale <q, k>| <= c for every query/key, or None without qk-norm.

        RMS norm gives a vector of RMS <= 1 times the weight w, so ||q|| <= sqrt(D) max|w_q|,
        ||k|| <= sqrt(D) max|w_k| and |scale <q, k>| <= scale * D * max|w_q| * max|w_k|.
        """
        if self.q_norm is None:
            return None
        wq, wk = self.q_norm.weight.detach().abs().max(), self.k_norm.weight.detach().abs().max()
        return float(self.scale * self.head_dim * wq * wk)

    def cache_info(self) -> LayerInfo:
        return LayerInfo(kind="softmax", groups=self.num_heads // self.num_kv_heads,
                         content_bound=self.content_bound())

    def forward(self, x: Tensor, state: LayerCache | dict | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, output_attentions: bool = False):
        """x (B, T, hidden) -> (B, T, hidden), or (that, weights (B, Hq, T, Tk)) with output_attentions.

        attention_mask (B, T), for the T new tokens: 0/False marks padding, which is no key, moves
        no walk and adds no decay (a padded row computes what the row alone computes). position_ids
        (B, T): the positions RoPE/ALiBi and the cache use (default: each row counts its real tokens).
        """
        B, T, _ = x.shape
        q = self._heads(self.q_proj(x), self.num_heads)
        k = self._heads(self.k_proj(x), self.num_kv_heads)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        state = layer_state(state)
        if state is not None and state.info is None:
            state.configure(self.cache_info())
        offset = 0 if state is None else state.length
        mask = None if attention_mask is None else attention_mask.to(device=x.device, dtype=torch.bool)
        o, w = self._attend(q, k, v, x, state, offset, mask=mask, pos=position_ids,
                            need_weights=output_attentions)  # (B, Hq, T, D)
        o = o.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)
        if self.gate_proj is not None:
            o = o * torch.sigmoid(self.gate_proj(x))
        return (self.o_proj(o), w) if output_attentions else self.o_proj(o)

    def _attend(self, q, k, v, x, state, offset, mask=None, pos=None, need_weights=False):  # pragma: no cover
        raise NotImplementedError


class FirstPassageAttention(AttentionBase):
    """First Passage Attention layer.

    mode="free": field and level are separate linear heads of the hidden state (one scalar per
    head and position). mode="walk": field = walk(increments), level = field (+ a learned
    per-head offset if ``level_offset=True``); each increment is ``tanh(w x + b)`` (default,
    ``walk_increment="tanh"``: steps in (-1, 1), so saturated push and pop steps cancel) or the
    unbounded ``w x + b`` (``"linear"``). The penalty strength is beta_h = exp(beta_param_h)
    (default ``beta_activation="exp"``: Adam grows it by a factor per step, not a constant) or
    softplus(beta_param_h); either way beta starts at softplus(beta_init) (0.69 for 0).

    Initialisation: field/level/increment weights ~ N(0, field_init_std^2), biases
    ``walk_bias_init`` (increment, default 0) and 0 (free heads), so the layer starts close to
    causal softmax without positional encoding. A walk whose increments are all >= 0 never dips
    and gets no gradient through the dips; ``walk_bias_init < 0`` starts the walk as a decay and
    keeps one-layer heads out of that dead zone, but its initial recency bias (beta * tanh(|b|)
    per token) stopped a language model from learning long-range retrieval (docs/synthetic.md
    has both measurements; ``fpa.tasks.diagnostic`` reruns the synthetic one).

    ``field_lr_multiplier`` (default 1.0): the field heads, the level offset and beta
    (``field_parameters()``) train at that multiple of the learning rate
    (``fpa.train.parameter_groups``, used by ``fpa train``; use it in your own loop too). 0.1 was
    the default of the linear, softplus parametrisation, whose unbounded increments grew noisy
    at the full rate (``fpa.models.configuration_fpa.FPA_PARAMETRISATION_LEGACY``).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 mode: str = "free", qk_norm: bool = False, output_gate: bool = False,
                 head_dim: int | None = None, level_offset: bool = False, beta_init: float = 0.0,
                 field_init_std: float = 0.02, field_lr_multiplier: float = 1.0, backend: str = "auto",
                 walk_increment: str = "tanh", walk_bias_init: float = 0.0, beta_activation: str = "exp"):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, qk_norm, output_gate)
        if mode not in FPA_MODES:
            raise ValueError(f"mode must be one of {FPA_MODES}, got {mode!r}")
        if walk_increment not in WALK_INCREMENTS:
            raise ValueError(f"walk_increment must be one of {WALK_INCREMENTS}, got {walk_increment!r}")
        self.walk_increment = walk_increment
        if beta_activation not in BETA_ACTIVATIONS:
            raise ValueError(f"beta_activation must be one of {BETA_ACTIVATIONS}, got {beta_activation!r}")
        self.beta_activation = beta_activation
        if not isinstance(field_lr_multiplier, (int, float)) or isinstance(field_lr_multiplier, bool) \
                or not 0 < field_lr_multiplier <= 1e3:
            raise ValueError(f"field_lr_multiplier must be a number in (0, 1000], got {field_lr_multiplier!r}")
        self.mode, self.backend = mode, backend
        self.field_lr_multiplier = float(field_lr_multiplier)
        if mode == "free":
            self.field_proj = nn.Linear(hidden_size, num_heads)
            self.level_proj = nn.Linear(hidden_size, num_heads)
            heads = (self.field_proj, self.level_proj)
        else:
            self.increment_proj = nn.Linear(hidden_size, num_heads)
            heads = (self.increment_proj,)
            if walk_increment == "gated":  # tanh(a) * sigmoid(g): saturates at -1, 0 and +1
                self.increment_gate_proj = nn.Linear(hidden_size, num_heads)
                heads += (self.increment_gate_proj,)
        for lin in heads:
            nn.init.normal_(lin.weight, std=field_init_std)
            nn.init.zeros_(lin.bias)
        if mode == "walk":
            nn.init.constant_(self.increment_proj.bias, float(walk_bias_init))
        self.level_offset = nn.Parameter(torch.zeros(num_heads)) if (mode == "walk" and level_offset) else None
        beta0 = float(beta_init)
        if beta_activation == "exp":  # the same initial beta, softplus(beta_init), in log space (no tensor: meta init)
            beta0 = math.log(max(beta0, 0.0) + math.log1p(math.exp(-abs(beta0))))
        self.beta_param = nn.Parameter(torch.full((num_heads,), beta0))

    @property
    def beta(self) -> Tensor:
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
        level (free) or increment (walk) heads, the level offset and beta."""
        heads = (self.field_proj, self.level_proj) if self.mode == "free" else (self.increment_proj,)
        if self.walk_increment == "gated" and self.mode == "walk":
            heads += (self.increment_gate_proj,)
        extra = [self.beta_param] + ([self.level_offset] if self.level_offset is not None else [])
        return [p for lin in heads for p in lin.parameters()] + extra

    def cache_info(self) -> LayerInfo:
        return LayerInfo(kind="fpa", groups=self.num_heads // self.num_kv_heads, beta=self.beta.detach(),
                         content_bound=self.content_bound(), mode=self.mode)

    def field_level(self, x: Tensor, state: LayerCache | None = None,
                    mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(field, level) (B, H, T) float32 for new tokens; in walk mode continues the cached walk.
        mask (B, T) bool: padding positions take no walk step and get field = level = +PAD_BIG
        (never a minimum, never a live key)."""
        if self.mode == "free":
            field, level = self._per_head(self.field_proj, x), self._per_head(self.level_proj, x)
            return _pad_out(field, level, mask)
        inc = self._per_head(self.increment_proj, x)
        if self.walk_increment == "tanh":
            inc = torch.tanh(inc)
        elif self.walk_increment == "gated":
            inc = torch.tanh(inc) * torch.sigmoid(self._per_head(self.increment_gate_proj, x))
        if mask is not None:
            inc = inc.masked_fill(~mask[:, None, :], 0.0)
        field = _continue_walk(inc, state)
        level = field if self.level_offset is None else field + self.level_offset.float()[None, :, None]
        return _pad_out(field, level, mask)

    def _attend(self, q, k, v, x, state, offset, mask=None, pos=None, need_weights=False):
        field, level = self.field_level(x, state, mask)
        if state is None:
            o = first_passage_attention(q, k, v, field, level, beta=self.beta, backend=self.backend,
                                        check_inputs=False)  # built here: no value checks, no host sync
            return o, (_dense_weights(q, k, field, level, self.beta) if need_weights else None)
        return _fpa_cached(q, k, v, field, level, self.beta, state, self.backend, mask, pos, need_weights)


def _pad_out(field: Tensor, level: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """field, level (B, H, T) with +PAD_BIG at padding positions (mask (B, T) False)."""
    if mask is None:
        return field, level
    pad = ~mask[:, None, :]
    return field.masked_fill(pad, PAD_BIG), level.masked_fill(pad, PAD_BIG)


def _dense_weights(q: Tensor, k: Tensor, field: Tensor, level: Tensor, beta) -> Tensor:
    """Attention probabilities (B, Hq, T, T) of a whole sequence, FPA penalties included."""
    b = beta.detach() if torch.is_tensor(beta) else beta
    return attention_weights(q, k, fpa_bias(field, level, field[..., :0], b), q.shape[-1] ** -0.5)


def _continue_walk(increments: Tensor, state: LayerCache | None) -> Tensor:
    """field = cumsum(increments) (B, H, T), continued from the cached walk's last value."""
    field = torch.cumsum(increments, dim=-1)
    if state is not None:
        if state.last_field is not None:
            field = field + state.last_field[..., None]
        state.last_field = field[..., -1]
    return field


def _fpa_cached(q, k, v, field, level, beta, state: LayerCache, backend="auto", mask=None, pos=None,
                need_weights=False):
    """Cache form of FPA: attend over the paged cache (level and pm_j = min of the field after key j
    up to before the new tokens, docs/fpa.md) and the new keys, then store the new keys.
    q (B, Hq, T, D), k, v (B, Hkv, T, D), field/level (B, Hq, T) -> ((B, Hq, T, D), weights or None).
    ``backend`` is unused: the cache is read block by block by fpa.cache.paged."""
    b = beta.detach() if torch.is_tensor(beta) else beta
    new_bias = fpa_bias(field, level, field[..., :0], b)  # (B, Hq, T, T), -inf above the diagonal
    return state.attend(q, k, v, fpa_past_bias(state.store, field, b), new_bias, need_weights,
                        field=field, level=level, pos=pos, mask=mask)


class ForgettingAttention(AttentionBase):
    """FoX: forget gate f_t = sigmoid(w_h . x_t + b_h) per head; full forward via forgetting_attention.

    At initialisation w ~ N(0, 0.02^2) and b = fgate_bias_init (default 5, f ~ 0.993: little
    forgetting). Decoding uses FPA's cache form with field = level = cumsum(log f), beta = 1 (P2).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 qk_norm: bool = False, output_gate: bool = False, head_dim: int | None = None,
                 fgate_bias_init: float = 5.0):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, qk_norm, output_gate)
        self.fgate_proj = nn.Linear(hidden_size, num_heads)
        nn.init.normal_(self.fgate_proj.weight, std=0.02)
        nn.init.constant_(self.fgate_proj.bias, fgate_bias_init)

    def cache_info(self) -> LayerInfo:
        return LayerInfo(kind="fox", groups=self.num_heads // self.num_kv_heads,
                         beta=torch.ones(self.num_heads), content_bound=self.content_bound())

    def _attend(self, q, k, v, x, state, offset, mask=None, pos=None, need_weights=False):
        log_f = F.logsigmoid(self._per_head(self.fgate_proj, x))
        if mask is not None:
            log_f = log_f.masked_fill(~mask[:, None, :], 0.0)  # padding adds no decay
        if state is None and mask is None and not need_weights:
            return forgetting_attention(q, k, v, log_f, check_inputs=False), None
        field, level = _pad_out(*(2 * (_continue_walk(log_f, state),)), mask)
        if state is not None:
            return _fpa_cached(q, k, v, field, level, 1.0, state, "auto", mask, pos, need_weights)
        # P2: FoX is FPA with field = level = cumsum(log f) and beta = 1
        o = forgetting_attention(q, k, v, log_f) if mask is None else first_passage_attention(q, k, v, field, level, beta=1.0)
        return o, (_dense_weights(q, k, field, level, 1.0) if need_weights else None)


def rope(x: Tensor, pos: Tensor, theta: float) -> Tensor:
    """Rotary position embedding of x (..., T, d) at positions pos (T,) or, for x (B, H, T, d),
    per-row positions (B, T); half-split pairing.

    The first 2 * (d // 2) channels are rotated in pairs (c, c + d // 2); for odd d the last
    channel passes through unrotated (so d = 1 carries no position at all).
    """
    d = x.shape[-1]
    h = d // 2
    inv = 1.0 / (theta ** (torch.arange(h, device=x.device, dtype=torch.float32) * 2 / (2 * h))) if h else x.new_zeros(0).float()
    ang = pos.float()[..., None] * inv  # (T, d // 2) or (B, T, d // 2)
    cos, sin = ang.cos(), ang.sin()
    if pos.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d // 2)
    xf = x.float()
    x1, x2, rest = xf[..., :h], xf[..., h:2 * h], xf[..., 2 * h:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], -1).to(x.dtype)


def alibi_slopes(n: int) -> Tensor:
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

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 position: str = "rope", qk_norm: bool = False, output_gate: bool = False,
                 head_dim: int | None = None, rope_theta: float = 10000.0):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, qk_norm, output_gate)
        if position not in ("rope", "alibi", "nope"):
            raise ValueError(f"position must be rope, alibi or nope, got {position!r}")
        self.position, self.rope_theta = position, rope_theta
        # One slope for every head instead of the standard geometric sequence (fpa.tasks.packed
        # packs independent one-head models as heads). Not a buffer: a non-persistent buffer is not
        # restored by from_pretrained (transformers builds the model on the meta device).
        self.alibi_slope_override: float | None = None

    @property
    def slopes(self) -> Tensor:
        """ALiBi slopes (H,), float32 on the CPU, computed from the head count on every call."""
        if self.alibi_slope_override is not None:
            return torch.full((self.num_heads,), float(self.alibi_slope_override))
        return alibi_slopes(self.num_heads)

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
            past = alibi_past_bias(state.store, qp, self.slopes) if self.position == "alibi" else None
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
        own[:, Tk - T:] = torch.eye(T, dtype=torch.bool, device=rel.device)
        allowed = allowed | own
        shape = torch.broadcast_shapes(rel.shape, allowed.shape)
        mask = torch.zeros(shape, device=rel.device, dtype=dtype).masked_fill(~allowed, float("-inf"))
        if self.position == "alibi":
            mask = mask - self.slopes.to(device=rel.device, dtype=dtype)[:, None, None] * rel.clamp(min=0).to(dtype)
        return mask


def make_attention(attention: str, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                   fpa_mode: str = "free", qk_norm: bool = False, output_gate: bool = False, **kw) -> AttentionBase:
    """One switch over the attention family: ``attention`` in ATTENTION_TYPES."""
    common = dict(qk_norm=qk_norm, output_gate=output_gate)
    if attention == "fpa":
        return FirstPassageAttention(hidden_size, num_heads, num_kv_heads, mode=fpa_mode, **common, **kw)
    if attention == "fox":
        return ForgettingAttention(hidden_size, num_heads, num_kv_heads, **common, **kw)
    if attention.startswith("softmax_") and attention in ATTENTION_TYPES:
        return SoftmaxAttention(hidden_size, num_heads, num_kv_heads, position=attention[len("softmax_"):], **common, **kw)
    raise ValueError(f"attention must be one of {ATTENTION_TYPES}, got {attention!r}")


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + SwiGLU(norm(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, attention: str = "fpa",
                 num_heads: int = 4, num_kv_heads: int | None = None, eps: float = 1e-6, **attn_kw):
        super().__init__()
        self.attn_norm = RMSNorm(hidden_size, eps)
        self.attn = make_attention(attention, hidden_size, num_heads, num_kv_heads, **attn_kw)
        self.mlp_norm = RMSNorm(hidden_size, eps)
        self.mlp = SwiGLU(hidden_size, intermediate_size)

    def forward(self, x: Tensor, state: LayerCache | dict | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, output_attentions: bool = False):
        """x (B, T, hidden) -> (B, T, hidden), or (that, attention weights) with output_attentions."""
        a = self.attn(self.attn_norm(x), state, attention_mask, position_ids, output_attentions)
        a, w = a if output_attentions else (a, None)
        x = x + a
        x = x + self.mlp(self.mlp_norm(x))
        return (x, w) if output_attentions else x


import fpa as _fpa  # noqa: E402

_fpa._finish_registration()  # Auto-class registration, if importing transformers here came first
