"""First Passage Attention as a model layer: field and level from the hidden state (free heads or
a walk with an optional level offset), and the FPA form of attention shared with FoX (P2).

The offset of a walk's level (``level_offset``): with level = field (no offset) every key on the
walk's current floor has penalty 0 until the walk goes below it, so no threshold rule can evict
it. "head" adds one learned constant per head; "token" adds softplus(u_h . x_t + c_h) per head and
token, so a key whose offset is positive dips as soon as anything after it stays on its floor
(docs/fpa.md, "Level offset").
"""

from __future__ import annotations

import difflib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpa.layers.base import AttentionBase
from fpa.layers.fpa_form import continue_walk, dense_weights, evicting_attention, evicting_bias, fpa_cached, pad_out
from fpa.ops import first_passage_attention
from fpa.ops.cached.state import LayerInfo, LayerState

FPA_MODES = ("free", "walk")
WALK_INCREMENTS = ("linear", "tanh", "gated")
BETA_ACTIVATIONS = ("softplus", "exp")
LEVEL_OFFSETS = ("none", "head", "token")  # the values FPAConfig.fpa_level_offset takes; the layer also takes "auto"

# The FPAConfig fields that set FirstPassageAttention arguments: each sets the argument of the same
# name without "fpa_" (fpa_mode is make_attention's own argument, the layer's ``mode``).
FPA_CONFIG_FIELDS = (
    "fpa_level_offset",
    "fpa_level_offset_init",
    "fpa_level_offset_bias_init",
    "fpa_beta_init",
    "fpa_beta_activation",
    "fpa_walk_increment",
    "fpa_walk_bias_init",
    "fpa_field_lr_multiplier",
)


def config_layer_kwargs(fpa_kwargs: dict) -> dict:
    """FPA arguments under their FPAConfig names (``{"fpa_level_offset": "none"}``, the names
    ``fpa train --model-overrides`` and ``fpa synth --fpa-kwargs`` take) -> FirstPassageAttention's
    (``{"level_offset": "none"}``). ValueError naming any other key (and the valid ones)."""
    unknown = sorted(set(fpa_kwargs) - set(FPA_CONFIG_FIELDS))
    if unknown:
        hints = [
            f"{k!r} (did you mean {m[0]!r}?)"
            for k in unknown
            if (m := difflib.get_close_matches(str(k), FPA_CONFIG_FIELDS, 1, 0.6))
        ]
        raise ValueError(
            f"unknown FPA arguments {unknown}"
            + (f"; {', '.join(hints)}" if hints else "")
            + f"; valid: {list(FPA_CONFIG_FIELDS)}"
        )
    return {k[len("fpa_") :]: v for k, v in fpa_kwargs.items()}


def check_level_offset(level_offset: str, mode: str) -> str | None:
    """The kind of level offset a ``level_offset`` argument asks for: None, "head" or "token".
    "auto" (the layer's default) is "head" in walk mode and None ("none") in free mode.
    ValueError for any other value (a bool included: use "none" or "head"), or for an offset
    outside walk mode."""
    if isinstance(level_offset, bool):
        raise ValueError(
            f"level_offset must be 'auto' or one of {LEVEL_OFFSETS}, got {level_offset!r}: "
            f"use 'none' (was False) or 'head' (was True)"
        )
    if level_offset == "auto":
        return "head" if mode == "walk" else None
    if not isinstance(level_offset, str) or level_offset not in LEVEL_OFFSETS:
        raise ValueError(f"level_offset must be 'auto' or one of {LEVEL_OFFSETS}, got {level_offset!r}")
    kind = None if level_offset == "none" else level_offset
    if kind is not None and mode != "walk":
        raise ValueError(
            f"level_offset={level_offset!r} needs mode='walk' (it offsets the walk's level), "
            f"got mode={mode!r}; mode='free' has its own level head"
        )
    return kind


class FirstPassageAttention(AttentionBase):
    """First Passage Attention layer.

    mode="free": field and level are separate linear heads of the hidden state (one scalar per
    head and position). mode="walk": field = walk(increments), level = field + offset, the offset
    set by ``level_offset``: "head" (the default "auto" in walk mode: one learned constant per
    head, starting at ``level_offset_init``, default 1), "none" (level = field) or "token"
    (softplus(u_h . x_t + c_h) per head h and token t, one linear projection hidden ->
    heads, ``level_offset_proj``; u ~ N(0, field_init_std^2) and c = ``level_offset_bias_init``,
    default -4: the offset starts near softplus(-4) = 0.018). A per-token offset lets a key dip
    (and the cache evict it) while the walk stays on its floor.

    Why a head offset starting at 1 is the default: with level = field, a walk whose increments
    are all >= 0 never dips, every dip is 0 and the increments get no gradient (the max(0, .) is
    flat), so a head that drifts there early is stuck for good (a "dead zone"; 26 of 540 one-layer
    synthetic runs). With an offset c > 0 every key j starts with a dip of c minus the next step,
    so each step gets a gradient from the key before it, and once c >= 1 > |tanh step| no walk
    can leave every key undipped. It adds no recency bias: the penalty of a key does not grow with
    its distance while the walk is flat. The offset is learned and shrinks where the task wants it
    (docs/synthetic.md has the measurements, on the synthetic tasks and on the language model).
    Each increment is ``tanh(w x + b)`` (default, ``walk_increment="tanh"``: steps in (-1, 1), so
    saturated push and pop steps cancel) or the unbounded ``w x + b`` (``"linear"``). The penalty
    strength is beta_h = exp(beta_param_h) (default ``beta_activation="exp"``: Adam grows it by a
    factor per step, not a constant) or softplus(beta_param_h); either way beta starts at
    softplus(beta_init) (0.69 for 0).

    Initialisation: field/level/increment weights ~ N(0, field_init_std^2), biases
    ``walk_bias_init`` (increment, default 0) and 0 (free heads), so the layer starts close to
    causal softmax without positional encoding (with the default head offset, every key but the
    newest carries the same penalty beta * (1 - step)). ``walk_bias_init < 0`` also keeps heads
    out of the dead zone, by starting the walk as a decay, but its initial recency bias
    (beta * tanh(|b|) per token) stopped a language model from learning long-range retrieval.

    ``set_training_eviction(threshold)`` trains with the cache's eviction rule in the loop (a key
    whose penalty passes the threshold is masked out, as FPAEviction evicts it) in every forward
    pass without a cache; off by default.

    ``field_lr_multiplier`` (default 1.0): the field heads, the level offset (or its projection)
    and beta (``field_parameters()``) train at that multiple of the learning rate
    (``fpa.train.parameter_groups``, used by ``fpa train``; use it in your own loop too). 0.1 was
    the default of the linear, softplus parametrisation, whose unbounded increments grew noisy
    at the full rate (``fpa.models.configuration_fpa.FPA_PARAMETRISATION_LEGACY``).

    FPAConfig sets these arguments from its ``fpa_*`` fields of the same names (``fpa_mode`` ->
    ``mode``, ``fpa_level_offset`` -> ``level_offset``, ...; ``config_layer_kwargs``); the
    parametrisation versions are in docs/fpa.md, "Parametrisation and its versions".
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        mode: str = "walk",
        qk_norm: bool = False,
        output_gate: bool = False,
        head_dim: int | None = None,
        level_offset: str = "auto",
        beta_init: float = 0.0,
        field_init_std: float = 0.02,
        field_lr_multiplier: float = 1.0,
        backend: str = "auto",
        walk_increment: str = "tanh",
        walk_bias_init: float = 0.0,
        beta_activation: str = "exp",
        level_offset_bias_init: float = -4.0,
        level_offset_init: float = 1.0,
    ):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, qk_norm, output_gate)
        if mode not in FPA_MODES:
            raise ValueError(f"mode must be one of {FPA_MODES}, got {mode!r}")
        if walk_increment not in WALK_INCREMENTS:
            raise ValueError(f"walk_increment must be one of {WALK_INCREMENTS}, got {walk_increment!r}")
        self.walk_increment = walk_increment
        if beta_activation not in BETA_ACTIVATIONS:
            raise ValueError(f"beta_activation must be one of {BETA_ACTIVATIONS}, got {beta_activation!r}")
        self.beta_activation = beta_activation
        self.level_offset_kind = check_level_offset(level_offset, mode)
        for name, val in (("level_offset_bias_init", level_offset_bias_init), ("level_offset_init", level_offset_init)):
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
                raise ValueError(f"{name} must be a finite number, got {val!r}")
        if (
            not isinstance(field_lr_multiplier, (int, float))
            or isinstance(field_lr_multiplier, bool)
            or not 0 < field_lr_multiplier <= 1e3
        ):
            raise ValueError(f"field_lr_multiplier must be a number in (0, 1000], got {field_lr_multiplier!r}")
        self.mode, self.backend = mode, backend
        self.field_lr_multiplier = float(field_lr_multiplier)
        if mode == "free":
            self.field_proj = nn.Linear(hidden_size, num_heads)
            self.level_proj = nn.Linear(hidden_size, num_heads)
            heads: tuple[nn.Linear, ...] = (self.field_proj, self.level_proj)
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
        self.level_offset = (
            nn.Parameter(torch.full((num_heads,), float(level_offset_init)))
            if self.level_offset_kind == "head"
            else None
        )
        self.level_offset_proj = None
        if self.level_offset_kind == "token":
            self.level_offset_proj = nn.Linear(hidden_size, num_heads)
            nn.init.normal_(self.level_offset_proj.weight, std=field_init_std)
            nn.init.constant_(self.level_offset_proj.bias, float(level_offset_bias_init))
        beta0 = float(beta_init)
        if beta_activation == "exp":  # the same initial beta, softplus(beta_init), in log space (no tensor: meta init)
            beta0 = math.log(max(beta0, 0.0) + math.log1p(math.exp(-abs(beta0))))
        self.beta_param = nn.Parameter(torch.full((num_heads,), beta0))

    training_eviction_threshold: float | None = None

    def set_training_eviction(self, threshold: float | None) -> None:
        """In every forward pass without a cache (training, and the trainer's evaluations in eval
        mode, so a held-out loss or a probe measures the model under the rule it trains with), mask
        key j out of query i once beta * dip(i - 1, j) > ``threshold``: what
        fpa.cache.FPAEviction(threshold, within_chunks=True) does when decoding, so the model learns
        under the eviction it will be served with (fpa_form.evicting_attention; dense, O(T^2)
        memory). None turns it off. With a cache, the cache's policy decides."""
        if threshold is not None and (
            isinstance(threshold, bool)
            or not isinstance(threshold, (int, float))
            or not math.isfinite(threshold)
            or threshold < 0
        ):
            raise ValueError(f"threshold must be a finite number >= 0 or None, got {threshold!r}")
        self.training_eviction_threshold = None if threshold is None else float(threshold)

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
        computed here (LayerState.append, fpa.ops.cached.state), so decoding and eviction use the same levels.
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
            bias = evicting_bias(
                field, level, self.beta, self.training_eviction_threshold, self.num_heads // self.num_kv_heads
            )
            return evicting_attention(q, k, v, bias, self.scale, need_weights)
        if state is None:
            o = first_passage_attention(
                q, k, v, field, level, beta=self.beta, backend=self.backend, check_inputs=False
            )  # built here: no value checks, no host sync
            return o, (dense_weights(q, k, field, level, self.beta) if need_weights else None)
        return fpa_cached(q, k, v, field, level, self.beta, state, self.backend, mask, pos, need_weights)
