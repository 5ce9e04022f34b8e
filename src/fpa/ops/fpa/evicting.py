"""FPA under a threshold eviction rule, for training under the rule the cache serves with.

fpa.cache.FPAEviction(threshold, within_chunks=True) hides key j from query i once, after query
i - 1, beta_h * dip(i - 1, j) > threshold for every query head h of j's KV group; the penalty only
grows (P1), so the key stays hidden from every later query. Since dip(i', j) = max over
j < t <= i' of relu(level_j - field_t), the rule hides key j from every query after the first t > j
at which beta_h * relu(level_j - field_t) > threshold for every head of the group (the latest of
the heads' first crossings), a per-key position ``hide_from``; the attention is then FPA's own
chunked op with those (query, key) pairs at -inf (fpa.ops.fpa.chunked, its C++ rows on CPU). The
positions take no gradient, as in the dense reference (fpa.layers.fpa_form.evicting_bias, which
masks a boolean): gradients flow through the penalties of the keys kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops.chunked_attention import chunked_backward, chunked_forward
from fpa.ops.fpa.chunked import DEFAULT_CHUNK, _FPAChunkBias, _grouped, _math_dtype


@torch.no_grad()
def hide_from(field: Tensor, level: Tensor, beta: Tensor, threshold: float, groups: int = 1) -> Tensor:
    """The first query position from which the threshold rule hides each key.

    Args:
        field: (B, H, T) the field of one whole sequence (query heads).
        level: (B, H, T) the keys' levels.
        beta: (H,) penalty strength per query head.
        threshold: The rule's threshold (>= 0).
        groups: Consecutive query heads sharing one KV head; a key is hidden once every head of
            its group has crossed.

    Returns:
        (B, H, T) int64: key j is hidden from every query at position >= the value (T: never),
        the same for every head of a group. Computed in the inputs' math dtype (float64 if either
        is float64), like the dense reference, O(B * H * T^2) comparisons.
    """
    dt = torch.float64 if torch.float64 in (field.dtype, level.dtype) else torch.float32
    B, H, T = field.shape
    f, lv, b = field.to(dt), level.to(dt), beta.to(dt).reshape(1, H, 1, 1)
    t = torch.arange(T, device=field.device)
    # (t, j): the penalty of key j passes the threshold at step t > j
    cross = (b * torch.relu(lv[..., None, :] - f[..., :, None]) > threshold) & (t[:, None] > t[None, :])
    first = torch.where(cross, t[:, None], T).amin(dim=-2)  # (B, H, T): first crossing, T if none
    out = torch.where(first < T, first + 1, T)  # hidden from the query after the crossing
    if groups > 1:
        out = out.view(B, H // groups, groups, T).amax(2, keepdim=True).expand(B, H // groups, groups, T)
    return out.reshape(B, H, T).contiguous()


@torch.library.custom_op("fpa::evicting_forward", mutates_args=())
def _forward_op(
    q: Tensor, k: Tensor, v: Tensor, field: Tensor, level: Tensor, beta: Tensor, hide: Tensor, scale: float, chunk: int
) -> tuple[Tensor, Tensor]:
    dt = _math_dtype(q, field)
    B, Hq, Tq, _ = q.shape
    q5, (f, pm, lv), b5 = _grouped(q, k, field, field[..., :0], level, beta, dt)
    bias = _FPAChunkBias(f, pm, lv, b5, want_grad=False, hide=hide.reshape(f.shape))
    out, lse = chunked_forward(q5, k.to(dt), v.to(dt), scale, bias, chunk)
    return out.reshape(B, Hq, Tq, -1), lse.reshape(B, Hq, Tq)


@_forward_op.register_fake
def _(q, k, v, field, level, beta, hide, scale, chunk):
    dt = _math_dtype(q, field)
    B, Hq, Tq, _ = q.shape
    return q.new_empty(B, Hq, Tq, v.shape[-1], dtype=dt), q.new_empty(B, Hq, Tq, dtype=dt)


@torch.library.custom_op("fpa::evicting_backward", mutates_args=())
def _backward_op(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    beta: Tensor,
    hide: Tensor,
    out: Tensor,
    lse: Tensor,
    scale: float,
    chunk: int,
    bias_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    dt = out.dtype
    B, Hq, Tq, _ = q.shape
    Hkv = k.shape[1]
    q5, (f, pm, lv), b5 = _grouped(q, k, field, field[..., :0], level, beta, dt)
    bias = _FPAChunkBias(f, pm, lv, b5, want_grad=bias_grad, hide=hide.reshape(f.shape))
    do5 = dout.to(dt).reshape(B, Hkv, Hq // Hkv, Tq, -1)
    dq, dk, dv = chunked_backward(
        q5, k.to(dt), v.to(dt), out.reshape(do5.shape), lse.reshape(do5.shape[:-1]), do5, scale, bias, chunk, bias_grad
    )
    if bias_grad:
        bias.finish_grads()
        dfield = bias.dvirtual[..., :Tq].reshape(B, Hq, Tq).to(field.dtype, copy=True)
        dlevel = bias.dlevel.reshape(B, Hq, -1).to(level.dtype)
        dbeta = bias.dbeta.reshape(Hq).to(beta.dtype)
    else:
        dfield, dlevel, dbeta = (x.new_zeros(x.shape) for x in (field, level, beta))
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dfield, dlevel, dbeta


@_backward_op.register_fake
def _(dout, q, k, v, field, level, beta, hide, out, lse, scale, chunk, bias_grad):
    return tuple(x.new_empty(x.shape) for x in (q, k, v, field, level, beta))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, field, level, beta, hide, scale, chunk = inputs
    ctx.save_for_backward(q, k, v, field, level, beta, hide, *output)
    ctx.scale, ctx.chunk = scale, chunk


def _backward(ctx, dout: Tensor, dlse: Tensor | None):
    q, k, v, field, level, beta, hide, out, lse = ctx.saved_tensors
    bias_grad = any(ctx.needs_input_grad[3:6])
    grads = _backward_op(dout, q, k, v, field, level, beta, hide, out, lse, ctx.scale, ctx.chunk, bias_grad)
    grads = [g if need else None for g, need in zip(grads, ctx.needs_input_grad[:6])]
    return (*grads, None, None, None)


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def evicting_fpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    beta: Tensor,
    threshold: float,
    scale: float,
    chunk: int = DEFAULT_CHUNK,
) -> Tensor:
    """Causal FPA of a whole sequence under the threshold rule (module docstring).

    Args:
        q: (B, Hq, T, D).
        k: (B, Hkv, T, D), Hq % Hkv == 0.
        v: (B, Hkv, T, Dv).
        field: (B, Hq, T).
        level: (B, Hq, T).
        beta: (Hq,) penalty strength, differentiable.
        threshold: The rule's threshold (>= 0).
        scale: Logit scale.
        chunk: Query chunk of the chunked engine.

    Returns:
        (B, Hq, T, Dv) in q's dtype.
    """
    groups = q.shape[1] // k.shape[1]
    b = beta.reshape(-1).expand(q.shape[1])
    hide = hide_from(field.detach(), level.detach(), b.detach(), float(threshold), groups)
    out, _ = _forward_op(q, k, v, field, level, b, hide, float(scale), int(chunk))
    return out.to(q.dtype)
