"""Attention of T new queries over a paged cache (fpa.cache.storage) plus the T new keys.

The cached keys are read block by block from the pool: the queries of each block's row are
gathered (a (blocks, G * T, D) tensor: the queries, not the keys, are copied), scores are one
batched matmul per chunk of blocks, and the softmax is combined across the blocks of a row with a
running maximum (scatter_reduce amax) and index_add sums, as flash-decoding does. Working memory
is bounded by ``CHUNK_ELEMS`` per chunk of blocks, whatever the cache holds; no padded dense copy
of the keys is built. The T new keys are attended densely (a T x T block with the chunk's own
bias) and merged with the cached part through their log-sum-exp.

The bias of a cached key (cache form of FPA, docs/fpa.md): for FPA/FoX, -beta_h *
relu(level_j - min(pm_j, min of the new field up to the query)), pm_j = min of the field after j
up to the previous call; for softmax ALiBi, -slope_h * (query position - key position); RoPE/NoPE
none. Holes, padding and free blocks (valid = False) get weight exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fpa.cache.storage import PagedStore

CHUNK_ELEMS = 1 << 21  # float32 elements of the largest per-chunk temporary

BiasFn = Callable[[slice, Tensor], "Tensor | None"]  # (blocks, rows (nb,)) -> (nb, G, T, P) or None


def fpa_past_bias(store: PagedStore, field: Tensor, beta) -> BiasFn:
    """Bias of cached keys for FPA/FoX: field (B, Hq, T) of the new tokens, beta (Hq,) or a float."""
    G, T = store.groups, field.shape[-1]
    Hkv = field.shape[1] // G
    cm = torch.cummin(_up(field), -1).values.reshape(-1, G, T)  # (R, G, T)
    b = torch.as_tensor(beta, dtype=_dt(field), device=field.device).reshape(-1)
    b = b.expand(Hkv * G).reshape(Hkv, G)

    def bias(blocks: slice, rows: Tensor) -> Tensor:
        level = store.pool["level"][blocks].permute(0, 2, 1)[:, :, None, :]  # (nb, G, 1, P)
        pm = store.pool["pm"][blocks].permute(0, 2, 1)[:, :, None, :]
        m = torch.minimum(pm, cm[rows][..., None])  # (nb, G, T, P)
        return -b[rows % Hkv][..., None, None] * torch.relu(level - m)

    return bias


def alibi_past_bias(store: PagedStore, qpos: Tensor, slopes: Tensor) -> BiasFn:
    """Bias of cached keys for ALiBi: qpos (B, T) positions of the new queries, slopes (Hq,)."""
    s = slopes.float().to(qpos.device).reshape(-1, store.groups)  # (Hkv, G)
    Hkv = s.shape[0]

    def bias(blocks: slice, rows: Tensor) -> Tensor:
        qp = qpos[torch.div(rows, Hkv, rounding_mode="floor")].float()  # (nb, T)
        dist = (qp[:, None, :, None] - store.pool["pos"][blocks].float()[:, None, None, :]).clamp(min=0)
        return -s[rows % Hkv][..., None, None] * dist

    return bias


def _dt(x: Tensor) -> torch.dtype:
    """The math dtype: float64 for float64 inputs, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _up(x: Tensor) -> Tensor:
    return x.to(_dt(x))


def _chunks(store: PagedStore, GT: int, D: int):
    P, N = store.P, store.num_blocks
    per_block = max(GT * P, P * D, GT * D)
    step = max(1, CHUNK_ELEMS // per_block)
    for a in range(0, N, step):
        yield slice(a, min(N, a + step))


def _scores(store: PagedStore, qr: Tensor, blocks: slice, bias_fn: BiasFn | None, scale: float, T: int):
    """Scores (nb, G, T, P) (float32, float64 for float64 q) of the chunk's blocks; rows (nb,)."""
    rows = store.block_rows()[blocks]
    kb = store.pool["k"][blocks].to(qr.dtype)  # (nb, P, D)
    s = torch.bmm(qr[rows], kb.transpose(1, 2)).mul_(scale).view(len(rows), store.groups, T, store.P)
    if bias_fn is not None:
        s = s + bias_fn(blocks, rows)
    return s.masked_fill_(~store.pool["valid"][blocks][:, None, None, :], float("-inf")), rows


def _safe(m: Tensor) -> Tensor:
    return torch.where(torch.isinf(m), torch.zeros_like(m), m)


def past_attention(store: PagedStore, q: Tensor, scale: float, bias_fn: BiasFn | None):
    """Unnormalised attention of q (B, Hq, T, D) over the store's keys.

    Returns (M, L, O): M (B, Hq, T) running max (-inf where no key), L (B, Hq, T) = sum exp(s - M),
    O (B, Hq, T, Dv) = sum exp(s - M) v, all float32 (float64 for a float64 q)."""
    B, Hq, T, D = q.shape
    G = store.groups
    R = B * Hq // G
    GT = G * T
    Dv = store.pool["v"].shape[-1] if "v" in store else D
    M = q.new_full((R, GT), float("-inf"), dtype=_dt(q))
    L = torch.zeros(R, GT, dtype=_dt(q), device=q.device)
    O = torch.zeros(R, GT, Dv, dtype=_dt(q), device=q.device)
    if "k" not in store or store.num_blocks == 0:
        return M.view(B, Hq, T), L.view(B, Hq, T), O.view(B, Hq, T, Dv)
    qr = _up(q).reshape(R, GT, D)
    for blocks in _chunks(store, GT, max(D, Dv)):
        s, rows = _scores(store, qr, blocks, bias_fn, scale, T)
        nb = len(rows)
        mb = s.amax(-1).view(nb, GT)
        Mn = M.scatter_reduce(0, rows[:, None].expand(nb, GT), mb, "amax", include_self=True)
        Ms = _safe(Mn)
        alpha = torch.exp(M - Ms)
        L.mul_(alpha)
        O.mul_(alpha[..., None])
        p = torch.exp(s.view(nb, GT, store.P) - Ms[rows][..., None])
        L.index_add_(0, rows, p.sum(-1))
        O.index_add_(0, rows, torch.bmm(p, store.pool["v"][blocks].to(p.dtype)))
        M = Mn
    return M.view(B, Hq, T), L.view(B, Hq, T), O.view(B, Hq, T, Dv)


def past_weights(store: PagedStore, q: Tensor, scale: float, bias_fn: BiasFn | None, M: Tensor, L: Tensor,
                 full: bool = True):
    """Normalised weights of the cached keys in pool layout given the final M, L (B, Hq, T) of the
    whole softmax (cached and new keys): (N, P, G, T) float32 if ``full``, else the two per-slot
    sums TOVA/H2O record, (last (N, P): the last query's weight, mean over the G query heads;
    total (N, P): summed over the queries and the G query heads)."""
    B, Hq, T, D = q.shape
    G = store.groups
    R = B * Hq // G
    qr = _up(q).reshape(R, G * T, D)
    Ms, Lr = _safe(M).reshape(R, G, T), L.reshape(R, G, T)
    out = []
    for blocks in _chunks(store, G * T, D):
        s, rows = _scores(store, qr, blocks, bias_fn, scale, T)
        w = torch.exp(s - Ms[rows][..., None]) / Lr[rows][..., None]  # (nb, G, T, P)
        out.append(w.permute(0, 3, 1, 2) if full else (w[:, :, -1].mean(1), w.sum((1, 2))))
    if full:
        return torch.cat(out) if out else q.new_zeros(0, store.P, G, T, dtype=torch.float32)
    return tuple(torch.cat(x) for x in zip(*out)) if out else (q.new_zeros(0, store.P),) * 2


def new_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Tensor, pad_to: int = 16):
    """Dense attention of q (B, Hq, T, D) over the T new keys k, v (B, Hkv, T, D) with ``bias``
    (broadcastable to (B, Hq, T, T), -inf where not allowed; every row has a finite entry).
    Returns (m, l, o, s): row max, sum exp(s - m), sum exp(s - m) v, and the scores s (B, Hq, T, T).

    The key dimension is padded to a multiple of ``pad_to`` (weight 0), so the sums over keys have
    the same length whatever T is within a multiple: a query row then gets bitwise the same result
    from a call of 6 tokens and of 10 (what crop after a longer call relies on)."""
    G, T = q.shape[1] // k.shape[1], k.shape[2]
    Tp = -(-T // pad_to) * pad_to
    kk, vv = (torch.nn.functional.pad(_up(x).repeat_interleave(G, 1), (0, 0, 0, Tp - T)) for x in (k, v))
    s = torch.matmul(_up(q), kk.transpose(-1, -2))[..., :T] * scale + bias
    m = s.amax(-1)
    p = torch.nn.functional.pad(torch.exp(s - m[..., None]), (0, Tp - T))
    return m, p.sum(-1), torch.matmul(p, vv), s


def cached_attention(store: PagedStore, q: Tensor, k: Tensor, v: Tensor, scale: float, past_bias: BiasFn | None,
                     new_bias: Tensor, weights: str | None = None):
    """Attention of q (B, Hq, T, D) over the store (before the new keys are appended) and the new
    keys k, v (B, Hkv, T, D). Returns (o (B, Hq, T, Dv) in q's dtype, w_past, w_new). With
    ``weights`` "full" or "record", w_past is ``past_weights(..., full=weights == "full")`` and
    w_new (B, Hq, T, T) the weights of the new keys; else both are None."""
    Mp, Lp, Op = past_attention(store, q, scale, past_bias)
    mn, ln, on, sn = new_attention(q, k, v, scale, new_bias)
    M = torch.maximum(Mp, mn)
    ap, an = torch.exp(Mp - M), torch.exp(mn - M)
    L = Lp * ap + ln * an
    o = (Op * ap[..., None] + on * an[..., None]) / L[..., None]
    if not weights:
        return o.to(q.dtype), None, None
    w_new = torch.exp(sn - M[..., None]) / L[..., None]
    return o.to(q.dtype), past_weights(store, q, scale, past_bias, M, L, full=weights == "full"), w_new


def dense_weights(store: PagedStore, w_past: Tensor, w_new: Tensor) -> Tensor:
    """(B, Hq, T, C + T): the weights of the cached slots in the dense order of ``store[...]``
    (as it was before the append) followed by the T new keys; w_past (N, P, G, T), w_new
    (B, Hq, T, T)."""
    B, Hq, T, _ = w_new.shape
    if store.R == 0 or store.num_blocks == 0:
        return w_new
    d = store.to_dense(w_past, 0.0)  # (R, C, G, T)
    C = d.shape[1]
    d = d.view(B, store.Hkv, C, store.groups, T).permute(0, 1, 3, 4, 2).reshape(B, Hq, T, C)
    return torch.cat([d, w_new], -1)

