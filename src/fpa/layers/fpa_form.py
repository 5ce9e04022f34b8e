"""The FPA form of attention, shared by FPA and FoX (P2: FoX is FPA with field = level =
cumsum(log f) and beta = 1): the walk continued across cache calls, padding, dense weights for
inspection, and attention against the paged KV cache."""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.cache.store.paged import fpa_past_bias
from fpa.cache.store.state import LayerState
from fpa.cache.store.storage import PAD_BIG
from fpa.cache.store.weights import attention_weights, fpa_bias
from fpa.checks import check_number
from fpa.ops.dispatch import first_passage_attention
from fpa.ops.field import range_min
from fpa.ops.fpa.evicting import evicting_fpa
from fpa.ops.softmax import causal_softmax_attention


def pad_out(field: Tensor, level: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """field, level (B, H, T) with +PAD_BIG at padding positions (mask (B, T) False)."""
    if mask is None:
        return field, level
    pad = ~mask[:, None, :]
    return field.masked_fill(pad, PAD_BIG), level.masked_fill(pad, PAD_BIG)


def dense_weights(q: Tensor, k: Tensor, field: Tensor, level: Tensor, beta) -> Tensor:
    """Attention probabilities (B, Hq, T, T) of a whole sequence, FPA penalties included."""
    b = beta.detach() if torch.is_tensor(beta) else beta
    return attention_weights(q, k, fpa_bias(field, level, field[..., :0], b), q.shape[-1] ** -0.5)


def evicting_bias(field: Tensor, level: Tensor, beta: Tensor, threshold: float, groups: int = 1) -> Tensor:
    """The FPA bias with the cache's threshold rule inside attention (eviction in the training
    loop): -beta * dip(i, j), and -inf for every key j < i that fpa.cache.FPAEviction(threshold)
    has evicted before query i arrives when decoding token by token, i.e. once beta * dip(i - 1, j)
    > threshold for every query head of its KV group (``groups`` consecutive heads share one KV
    head, and the cache holds one copy of the key for all of them); the penalty only grows, so it
    stays out for every later query. Training and
    token-by-token decoding under the rule then compute the same thing. Gradients flow through the
    penalties of the keys kept. field, level (B, H, T), beta (H,) -> (B, H, T, T) float32, -inf
    above the diagonal (float64 for float64 inputs)."""
    dt = torch.float64 if torch.float64 in (field.dtype, level.dtype) else torch.float32
    T = field.shape[-1]
    dip = torch.relu(level.to(dt)[..., None, :] - range_min(field.to(dt)))  # (B, H, T, T)
    bias = (-beta.to(dt)[None, :, None, None] * dip).masked_fill(
        torch.ones(T, T, dtype=torch.bool, device=field.device).triu(1), float("-inf")
    )
    gone = torch.isfinite(bias) & (bias < -threshold)  # (i, j): evicted after query i
    if groups > 1:
        B, H = gone.shape[:2]
        gone = gone.view(B, H // groups, groups, T, T).all(2).repeat_interleave(groups, 1)
    before = torch.zeros_like(gone)
    before[..., 1:, :] = gone[..., :-1, :]  # evicted before query i: after query i - 1
    return bias.masked_fill(before, float("-inf"))


def check_training_threshold(threshold: object) -> float | None:
    """A layer's ``set_training_eviction`` argument: None, or a finite number >= 0 (as float).
    ValueError otherwise."""
    return None if threshold is None else check_number("threshold", threshold, low=0, what="or None")


def check_straight_through(straight_through: object) -> bool:
    """A layer's ``set_training_eviction`` ``straight_through``: True or False. ValueError otherwise."""
    if not isinstance(straight_through, bool):
        raise ValueError(f"straight_through must be True or False, got {straight_through!r}")
    return straight_through


def evicting_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    beta: Tensor,
    threshold: float,
    scale: float,
    need_weights: bool = False,
    straight_through: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attention of a whole sequence under the threshold rule (eviction in the training loop): what
    ``evicting_bias`` describes, computed by fpa.ops.fpa.evicting.evicting_fpa (the chunked FPA op
    with each key hidden from the query after its eviction; O(T) memory per query chunk). With
    ``need_weights``, the dense reference (``evicting_bias`` and softmax, O(T^2) memory) also
    returns the weights. q (B, Hq, T, D), k, v (B, Hkv, T, D), field, level (B, Hq, T), beta (Hq,)
    -> ((B, Hq, T, D), weights (B, Hq, T, T) or None).

    ``straight_through``: the output is the evicting attention's, its gradient the plain FPA
    attention's (no key hidden): ``soft + (hard - soft).detach()``. A hidden key sends no gradient,
    so under the rule alone a key whose penalty drifts past the threshold is lost for good, even if
    a later answer needs it; the plain attention's gradient still pulls such a key's penalty down
    (and its content match up) while the forward pass, and so the loss, stays the rule's. Costs one
    more attention forward (the evicting one, without autograd)."""
    if straight_through and torch.is_grad_enabled():
        with torch.no_grad():
            hard, weights = evicting_attention(q, k, v, field, level, beta, threshold, scale, need_weights)
        soft = first_passage_attention(q, k, v, field, level, beta=beta, scale=scale, check_inputs=False)
        return soft + (hard - soft).detach(), weights
    if not need_weights:
        return evicting_fpa(q, k, v, field, level, beta, threshold, scale), None
    bias = evicting_bias(field, level, beta.reshape(-1).expand(q.shape[1]), threshold, q.shape[1] // k.shape[1])
    out = causal_softmax_attention(q, k, v, bias, scale)
    return out, attention_weights(q, k, bias.detach(), scale)


def continue_walk(increments: Tensor, state: LayerState | None) -> Tensor:
    """field = cumsum(increments) (B, H, T), continued from the cached walk's last value."""
    field = torch.cumsum(increments, dim=-1)
    if state is not None:
        if state.last_field is not None:
            field = field + state.last_field[..., None]
        state.last_field = field[..., -1]
    return field


def fpa_cached(q, k, v, field, level, beta, state: LayerState, backend="auto", mask=None, pos=None, need_weights=False):
    """Cache form of FPA: attend over the paged cache (level and pm_j = min of the field after key j
    up to before the new tokens, docs/fpa.md) and the new keys, then store the new keys. With a
    ``state.chunk_policy`` (a threshold rule with within_chunks=True) a key the rule evicts after
    query i - 1 of this call is hidden from query i on, cached and new keys alike.
    q (B, Hq, T, D), k, v (B, Hkv, T, D), field/level (B, Hq, T) -> ((B, Hq, T, D), weights or None).
    ``backend`` is unused: the cache is read block by block by fpa.cache.store.paged. ValueError if
    ``state`` was not configured (``LayerState.configure``, done by the layer's first call)."""
    if state.store is None or state.info is None:
        raise ValueError("state must be configured (LayerState.configure) before fpa_cached attends over it")
    b = beta.detach() if torch.is_tensor(beta) else beta
    tau = None if state.chunk_policy is None else state.chunk_policy.effective_threshold(state)
    if tau is None:
        new_bias = fpa_bias(field, level, field[..., :0], b)  # (B, Hq, T, T), -inf above the diagonal
    else:  # the threshold rule inside the call, as token-by-token decoding under it would apply it
        bt = torch.as_tensor(b, dtype=torch.float32, device=field.device).reshape(-1).expand(field.shape[1])
        new_bias = evicting_bias(field, level, bt, tau, state.info.groups)
    return state.attend(
        q,
        k,
        v,
        fpa_past_bias(state.store, field, b, tau),
        new_bias,
        need_weights,
        field=field,
        level=level,
        pos=pos,
        mask=mask,
    )
