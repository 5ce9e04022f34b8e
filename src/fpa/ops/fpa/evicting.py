"""FPA under a threshold eviction rule, for training under the rule the cache serves with.

fpa.cache.FPAEviction(threshold, within_chunks=True) hides key j from query i once, after query
i - 1, beta_h * dip(i - 1, j) > threshold for every query head h of j's KV group; the penalty only
grows (P1), so the key stays hidden from every later query. Since dip(i', j) = max over
j < t <= i' of relu(level_j - field_t), the rule hides key j from every query after the first t > j
at which beta_h * relu(level_j - field_t) > threshold for every head of the group (the latest of
the heads' first crossings), a per-key position ``hide_from``. The attention is then FPA's own
chunked op with those positions as its ``hide`` argument (fpa.ops.fpa.chunked.fpa_chunked, its C++
rows on CPU), which puts the hidden (query, key) pairs at -inf. The positions take no gradient,
as in the dense reference (fpa.layers.fpa_form.evicting_bias, which masks a boolean): gradients
flow through the penalties of the keys kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.ops.fpa.chunked import DEFAULT_CHUNK, fpa_chunked


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
        is float64), like the dense reference, and bit-for-bit its decisions: O(B * H * T log T).

    The search: g(x) = beta * relu(level_j - x) never increases with x (beta >= 0; for beta < 0
    nothing ever crosses a threshold >= 0), in floating point too, since rounding is monotone, so
    some t in a block crosses iff the block's minimum of the field does. A table of minima over
    blocks of 2^k positions and one binary-lifting pass per k find each key's first crossing.
    """
    dt = torch.float64 if torch.float64 in (field.dtype, level.dtype) else torch.float32
    B, H, T = field.shape
    f, lv, b = field.to(dt), level.to(dt), beta.to(dt).reshape(1, H, 1)
    minima = [f]  # minima[k][..., t] = min(f[..., t : t + 2^k]), t in [0, T - 2^k]
    while 2 ** len(minima) <= T:
        prev, half = minima[-1], 2 ** (len(minima) - 1)
        minima.append(torch.minimum(prev[..., :-half], prev[..., half:]))
    # pos: the first position not yet known to be free of crossings for key j (starts at j + 1)
    pos = torch.arange(1, T + 1, device=field.device).expand(B, H, T)
    for k in reversed(range(len(minima))):
        m = minima[k]
        n = m.shape[-1]  # the block [pos, pos + 2^k) exists iff pos < n
        block_min = m.gather(-1, pos.clamp(max=n - 1))
        free = (pos < n) & ~(b * torch.relu(lv - block_min) > threshold)
        pos = torch.where(free, pos + 2**k, pos)
    out = torch.where(pos < T, pos + 1, T)  # first crossing at pos: hidden from the query after it
    if groups > 1:
        out = out.view(B, H // groups, groups, T).amax(2, keepdim=True).expand(B, H // groups, groups, T)
    return out.reshape(B, H, T).contiguous()


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
    return fpa_chunked(q, k, v, field, level, field[..., :0], b, scale, chunk, hide=hide)
