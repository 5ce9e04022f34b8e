"""FPA as a FlexAttention score_mod on a sparse-table range minimum (docs/fpa.md, "Computing it fast").

With ST[k][t] = min(field[t .. t + 2^k - 1]), the minimum over (j, i] is
min(ST[k][j + 1], ST[k][i - 2^k + 1]) for k = floor(log2(i - j)): a pointwise function of
(i, j) and two gathers, so the penalty runs inside FlexAttention's fused kernel.

CPU: forward only (FlexAttention runs eagerly there and has no backward; it also builds the
full score matrix, so it is for checking, not speed). CUDA: forward and backward, compiled;
the gradient reaches field, level and beta through FlexAttention's support for captured
tensors that require grad (torch >= 2.6).
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor


def unavailable_reason(q: Tensor, needs_grad: bool) -> str | None:
    """Why the flex backend cannot run q, or None.

    Args:
        q: The queries (their device decides).
        needs_grad: Whether a backward will be needed (FlexAttention has none on CPU).

    Returns:
        A message, or None when the backend can run.
    """
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the torch build
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
    if q.device.type == "cpu" and needs_grad:
        return "FlexAttention has no backward on CPU (use backend='chunked' to train on CPU)"
    if q.device.type not in ("cpu", "cuda"):
        return f"FlexAttention does not run on device type {q.device.type!r}"
    return None


def sparse_table(field: Tensor) -> Tensor:
    """field (B, H, T) -> ST (L, B, H, T), ST[k][t] = min(field[t : t + 2^k]) (+inf past the end)."""
    T = field.shape[-1]
    levels = [field]
    span = 1
    while 2 * span <= T:
        prev = levels[-1]
        shifted = torch.cat([prev[..., span:], torch.full_like(prev[..., :span], float("inf"))], dim=-1)
        levels.append(torch.minimum(prev, shifted))
        span *= 2
    return torch.stack(levels)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def fpa_score_mod(field: Tensor, level: Tensor, past_min: Tensor, beta: Tensor, Tk: int):
    """FPA's score_mod for FlexAttention: field (B, Hq, Tq) at the query positions, level (B, Hq, Tk),
    past_min (B, Hq, Tk - Tq), beta (Hq,) -> score_mod(score, b, h, q_idx, kv_idx) = score - beta[h]
    * dip, in float64 for float64 fields, else float32. Pointwise in its index arguments, so it
    also evaluates whole broadcast index grids (``dense_scores``)."""
    B, Hq, Tq = field.shape
    P = Tk - Tq
    dev = field.device
    dt = torch.float64 if field.dtype == torch.float64 else torch.float32
    f = field.to(dt)
    st = sparse_table(f)
    n = torch.arange(Tq + 1, device=dev)
    log2 = torch.floor(torch.log2(n.clamp(min=1).double())).long()  # floor(log2 n), n >= 1
    pow2 = 2**log2  # 2^floor(log2 n), indexed by n
    prefix = torch.cummin(f, dim=-1).values
    inf_tail = torch.full((B, Hq, Tq), float("inf"), dtype=dt, device=dev)
    past_full = torch.cat([past_min.to(dt), inf_tail], dim=-1)  # (B, Hq, Tk), indexed by key
    lvl = level.to(dt)
    b_h = beta.to(dt)
    last = Tq - 1

    def score_mod(score, b, h, q_idx, kv_idx):
        j = kv_idx - P
        span = (q_idx - j).clamp(1, Tq)
        kk = log2[span]
        left = (j + 1).clamp(0, last)
        right = (q_idx - pow2[span] + 1).clamp(0, last)
        m_new = torch.minimum(st[kk, b, h, left], st[kk, b, h, right])
        m_past = torch.minimum(past_full[b, h, kv_idx], prefix[b, h, q_idx])
        m = torch.where(j < 0, m_past, m_new)
        d = torch.relu(lvl[b, h, kv_idx] - m)
        d = torch.where(j == q_idx, torch.zeros_like(d), d)
        return score - b_h[h] * d

    return score_mod


def dense_scores(score_mod, scores: Tensor) -> Tensor:
    """score_mod applied to every entry of scores (B, H, Tq, Tk) at once, through broadcast index grids
    (FlexAttention's own math, without its kernel) -> (B, H, Tq, Tk); differentiable everywhere."""
    grids = [
        torch.arange(n, device=scores.device).view([n if d == dim else 1 for d in range(4)])
        for dim, n in enumerate(scores.shape)
    ]
    return score_mod(scores, *grids)


def fpa_flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    field: Tensor,
    level: Tensor,
    past_min: Tensor,
    beta: Tensor,
    scale: float,
    compiled: bool | None = None,
) -> Tensor:
    """Cache form: q (B, Hq, Tq, D); k, v (B, Hkv, Tk, *); field (B, Hq, Tq); level (B, Hq, Tk);
    past_min (B, Hq, Tk - Tq); beta (Hq,) -> (B, Hq, Tq, Dv).

    compiled: run FlexAttention through torch.compile (its fused kernel); default True on CUDA and
        False on CPU. On CPU the compiled kernel has no backward either: inputs are detached.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    Hq, Tq = q.shape[1], q.shape[2]
    Hkv, Tk = k.shape[1], k.shape[2]
    P = Tk - Tq
    dev = q.device
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    score_mod = fpa_score_mod(field, level, past_min, beta, Tk)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + P

    block_mask = create_block_mask(causal, None, None, Tq, Tk, device=dev)
    compiled = dev.type == "cuda" if compiled is None else compiled
    if dev.type == "cpu":
        # detach: dispatch has checked that no gradient is needed (no backward on CPU)
        args = (q.detach().to(dt), k.detach().to(dt), v.detach().to(dt))
        if compiled:
            score_mod = fpa_score_mod(field.detach(), level.detach(), past_min.detach(), beta.detach(), Tk)
            out = _compiled_flex()(*args, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=Hq != Hkv)
            return out.to(q.dtype)
        with warnings.catch_warnings():  # the eager, unfused path is expected on CPU
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out = flex_attention(*args, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=Hq != Hkv)
        return out.to(q.dtype)
    out = _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=Hq != Hkv)
    return out
