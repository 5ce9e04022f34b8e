"""Attention of T new queries over a paged cache (fpa.cache.store.storage) plus the T new keys.

Decoding (G * T < P queries per KV head, G = query heads per KV head) reads the pool block by
block: the queries of each block's row are gathered (a (blocks, G * T, D) tensor: the queries,
not the keys, are copied), scores are one batched matmul per chunk of blocks, and the softmax is
combined across the blocks of a row with a running maximum (scatter_reduce amax) and index_add
sums, as flash-decoding does. A prefill chunk (G * T >= P) instead reads each row's blocks in runs
(a transient copy of at most CHUNK_ELEMS elements of that row's keys, cheaper than copying the
many queries per block) and does one GEMM per run, merged with the same running maximum. Working
memory is bounded by ``CHUNK_ELEMS`` per chunk whatever the cache holds; no padded dense copy of
the keys is ever built. The T new keys are attended densely (a T x T block with the chunk's own
bias) and merged with the cached part through their log-sum-exp.

The bias of a cached key (cache form of FPA, docs/fpa.md): for FPA/FoX, -beta_h *
relu(level_j - min(pm_j, min of the new field up to the query)), pm_j = min of the field after j
up to the previous call; for softmax ALiBi, -slope_h * (query position - key position); RoPE/NoPE
none. Holes, padding and free blocks (valid = False) get weight exactly 0.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from fpa.cache.store.storage import PagedStore

CHUNK_ELEMS = 1 << 21  # elements of the largest per-chunk temporary
# exp arguments are clamped here: torch's vectorised exp is 10-20x slower on arguments whose result
# is subnormal or 0 (far below -87). A key at the floor weighs e^-80 = 2e-35 of the row's best
# key, below the float32 (and float64) rounding of any sum that contains the best key's 1, so
# results do not change; masked and evicted keys are kept out of the row maxima, which use -inf.
EXP_FLOOR = -80.0


def _dt(x: Tensor) -> torch.dtype:
    """The math dtype: float64 for float64 inputs, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _up(x: Tensor) -> Tensor:
    """x in its math dtype (see ``_dt``)."""
    return x.to(_dt(x))


class PastBias:
    """Bias of the cached keys, in two layouts: ``blocks(ids, rows)`` -> (nb, G, T, P) for the
    blocks ``ids`` (a slice or (nb,) ids) of rows ``rows`` (nb,), and ``row(r, ids)`` -> (G, T, n)
    for the n = nb * P slots of row r's blocks ``ids``. The base class adds nothing (RoPE, NoPE)."""

    dtype = torch.float32  # the scores' dtype, set by the caller

    def blocks(self, ids: slice | Tensor, rows: Tensor) -> Tensor | None:
        """Bias (nb, G, T, P) of the pool blocks ``ids`` owned by ``rows`` (nb,), or None for none.

        Args:
            ids: a slice of block ids or (nb,) block ids.
            rows: (nb,) the row of every block.
        """
        return None

    def row(self, r: int, ids: Tensor) -> Tensor | None:
        """Bias (G, T, nb * P) of row ``r``'s blocks ``ids`` (nb,), slots in order, or None for none."""
        return None


class FPAPastBias(PastBias):
    """FPA/FoX: -beta_h * relu(level_j - min(pm_j, cummin of the new field up to the query));
    field (B, Hq, T) of the new tokens, beta (Hq,) or a float. With a ``threshold``, a key whose
    penalty passes it at query t - 1 for every query head of its group gets -inf from query t on
    (the threshold rule applied inside the call)."""

    def __init__(self, store: PagedStore, field: Tensor, beta: Tensor | float, threshold: float | None = None):
        self.threshold = threshold
        G, T = store.groups, field.shape[-1]
        self.store, self.G, self.Hkv = store, G, field.shape[1] // G
        self.cm = torch.cummin(_up(field), -1).values.reshape(-1, G, T)  # (R, G, T)
        if torch.is_tensor(beta):
            b = beta.to(device=field.device, dtype=_dt(field)).reshape(-1).expand(self.Hkv * G)
        else:  # torch.full, not torch.as_tensor: no host-to-device copy (a sync on an accelerator)
            b = torch.full((self.Hkv * G,), float(beta), dtype=_dt(field), device=field.device)
        self.b = b.reshape(self.Hkv, G)

    def blocks(self, ids: slice | Tensor, rows: Tensor) -> Tensor:
        """Bias (nb, G, T, P) of the pool blocks ``ids`` owned by ``rows`` (nb,)."""
        level = self.store.pool["level"][ids].permute(0, 2, 1)[:, :, None, :]  # (nb, G, 1, P)
        pm = self.store.pool["pm"][ids].permute(0, 2, 1)[:, :, None, :]
        m = torch.minimum(pm, self.cm[rows][..., None])  # (nb, G, T, P)
        return self._evict((level - m).relu_().mul_(-self.b[rows % self.Hkv][..., None, None]), 1)

    def row(self, r: int, ids: Tensor) -> Tensor:
        """Bias (G, T, nb * P) of row ``r``'s blocks ``ids`` (nb,)."""
        level = self.store.pool["level"][ids].reshape(-1, self.G).T[:, None, :]  # (G, 1, n)
        pm = self.store.pool["pm"][ids].reshape(-1, self.G).T[:, None, :]
        m = torch.minimum(pm, self.cm[r][..., None])  # (G, T, n)
        return self._evict((level - m).relu_().mul_(-self.b[r % self.Hkv][:, None, None]), 0)

    def _evict(self, bias: Tensor, group_dim: int) -> Tensor:
        """-inf at query t for the keys whose penalty passed the threshold at query t - 1 for every
        head of the group (``group_dim``; the query dim follows it)."""
        if self.threshold is None:
            return bias
        gone = (bias < -self.threshold).all(group_dim, keepdim=True)
        before = torch.zeros_like(gone)
        before.narrow(group_dim + 1, 1, gone.shape[group_dim + 1] - 1).copy_(
            gone.narrow(group_dim + 1, 0, gone.shape[group_dim + 1] - 1)
        )
        return bias.masked_fill_(before, float("-inf"))


class AlibiPastBias(PastBias):
    """ALiBi: -slope_h * (query position - key position); qpos (B, T), slopes (Hq,)."""

    def __init__(self, store: PagedStore, qpos: Tensor, slopes: Tensor):
        self.store = store
        # non_blocking: slopes made on the host would otherwise be a synchronous copy (a host sync)
        self.s = slopes.float().to(qpos.device, non_blocking=True).reshape(-1, store.groups)  # (Hkv, G)
        self.Hkv, self.qpos = self.s.shape[0], qpos

    def blocks(self, ids: slice | Tensor, rows: Tensor) -> Tensor:
        """Bias (nb, G, T, P) of the pool blocks ``ids`` owned by ``rows`` (nb,)."""
        qp = self.qpos[torch.div(rows, self.Hkv, rounding_mode="floor")].to(self.dtype)  # (nb, T)
        kp = self.store.pool["pos"][ids].to(self.dtype)
        dist = (qp[:, None, :, None] - kp[:, None, None, :]).clamp_(min=0)
        return dist * -self.s[rows % self.Hkv][..., None, None].to(self.dtype)

    def row(self, r: int, ids: Tensor) -> Tensor:
        """Bias (G, T, nb * P) of row ``r``'s blocks ``ids`` (nb,)."""
        qp = self.qpos[r // self.Hkv].to(self.dtype)  # (T,)
        dist = (qp[None, :, None] - self.store.pool["pos"][ids].reshape(1, 1, -1).to(self.dtype)).clamp_(min=0)
        return dist.mul(-self.s[r % self.Hkv][:, None, None].to(self.dtype))  # (G, T, n)


def fpa_past_bias(store: PagedStore, field: Tensor, beta: Tensor | float, threshold: float | None = None) -> PastBias:
    """The cached keys' bias for FPA/FoX (see FPAPastBias)."""
    return FPAPastBias(store, field, beta, threshold)


def alibi_past_bias(store: PagedStore, qpos: Tensor, slopes: Tensor) -> PastBias:
    """The cached keys' bias for ALiBi (see AlibiPastBias)."""
    return AlibiPastBias(store, qpos, slopes)


def _safe(m: Tensor) -> Tensor:
    """m with its infinities (rows without a key) replaced by 0, safe to subtract."""
    return torch.where(torch.isinf(m), torch.zeros_like(m), m)


def _block_chunks(store: PagedStore, GT: int, D: int) -> Iterator[slice]:
    """Slices of pool blocks whose temporaries stay within CHUNK_ELEMS."""
    P, N = store.P, store.num_blocks
    step = max(1, CHUNK_ELEMS // max(GT * P, P * D, GT * D))
    for a in range(0, N, step):
        yield slice(a, min(N, a + step))


def _row_chunks(store: PagedStore, GT: int, D: int) -> Iterator[tuple[int, Tensor]]:
    """(r, ids): each row's block ids in order, in runs whose temporaries stay within CHUNK_ELEMS."""
    P = store.P
    step = max(1, CHUNK_ELEMS // max(GT * P, P * D))
    table, nblk = store.table.long(), store.nblk_host
    for r in range(store.R):
        for a in range(0, nblk[r], step):
            yield r, table[r, a : min(nblk[r], a + step)]


def _block_scores(
    store: PagedStore, qr: Tensor, ids: slice, bias: PastBias | None, scale: float, T: int
) -> tuple[Tensor, Tensor]:
    """Scores (nb, G, T, P) of the blocks ``ids`` (a slice); rows (nb,)."""
    rows = store.block_rows()[ids]
    kb = store.pool["k"][ids].to(qr.dtype)  # (nb, P, D): a view of the pool
    s = torch.bmm(qr[rows], kb.transpose(1, 2)).mul_(scale).view(len(rows), store.groups, T, store.P)
    extra = None if bias is None else bias.blocks(ids, rows)
    if extra is not None:
        s += extra
    return s.masked_fill_(~store.pool["valid"][ids][:, None, None, :], float("-inf")), rows


def _row_scores(
    store: PagedStore, qr: Tensor, r: int, ids: Tensor, bias: PastBias | None, scale: float, T: int
) -> Tensor:
    """Scores (G, T, n) of row r's blocks ``ids`` (n = nb * P slots, in order)."""
    k = store.pool["k"][ids].reshape(-1, qr.shape[-1]).to(qr.dtype)  # (n, D)
    s = torch.matmul(qr[r], k.T).mul_(scale).view(store.groups, T, -1)
    extra = None if bias is None else bias.row(r, ids)
    if extra is not None:
        s += extra
    return s.masked_fill_(~store.pool["valid"][ids].reshape(1, 1, -1), float("-inf"))


def use_rows(store: PagedStore, T: int) -> bool:
    """Per-row reading (a transient copy of each run of a row's keys, then one GEMM) when the
    queries per KV head outnumber a block's keys; else block by block (the queries are copied)."""
    return store.groups * T >= store.P


def past_attention(store: PagedStore, q: Tensor, scale: float, bias: PastBias | None) -> tuple[Tensor, Tensor, Tensor]:
    """Unnormalised attention of q (B, Hq, T, D) over the store's keys.

    Returns (M, L, O): M (B, Hq, T) running max (-inf where no key), L (B, Hq, T) = sum exp(s - M),
    O (B, Hq, T, Dv) = sum exp(s - M) v, all float32 (float64 for a float64 q)."""
    B, Hq, T, D = q.shape
    G = store.groups
    R, GT = B * Hq // G, G * T
    Dv = store.pool["v"].shape[-1] if "v" in store else D
    M = q.new_full((R, GT), float("-inf"), dtype=_dt(q))
    L = torch.zeros(R, GT, dtype=_dt(q), device=q.device)
    O = torch.zeros(R, GT, Dv, dtype=_dt(q), device=q.device)
    if "k" not in store or store.num_blocks == 0:
        return M.view(B, Hq, T), L.view(B, Hq, T), O.view(B, Hq, T, Dv)
    qr = _up(q).reshape(R, GT, D)
    if bias is not None:
        bias.dtype = qr.dtype
    if use_rows(store, T):
        for r, ids in _row_chunks(store, GT, max(D, Dv)):
            s = _row_scores(store, qr, r, ids, bias, scale, T).view(GT, -1)
            Mn = torch.maximum(M[r], s.amax(-1))
            Ms = _safe(Mn)
            alpha = torch.exp(M[r] - Ms)
            p = s.sub_(Ms[:, None]).clamp_(min=EXP_FLOOR).exp_()
            L[r] = L[r] * alpha + p.sum(-1)
            O[r] = O[r] * alpha[:, None] + p @ store.pool["v"][ids].reshape(-1, Dv).to(p.dtype)
            M[r] = Mn
        return M.view(B, Hq, T), L.view(B, Hq, T), O.view(B, Hq, T, Dv)
    for blk in _block_chunks(store, GT, max(D, Dv)):
        s, rows = _block_scores(store, qr, blk, bias, scale, T)
        nb = len(rows)
        Mn = M.scatter_reduce(0, rows[:, None].expand(nb, GT), s.amax(-1).view(nb, GT), "amax", include_self=True)
        Ms = _safe(Mn)
        alpha = torch.exp(M - Ms)
        L.mul_(alpha)
        O.mul_(alpha[..., None])
        p = s.view(nb, GT, store.P).sub_(Ms[rows][..., None]).clamp_(min=EXP_FLOOR).exp_()
        L.index_add_(0, rows, p.sum(-1))
        O.index_add_(0, rows, torch.bmm(p, store.pool["v"][blk].to(p.dtype)))
        M = Mn
    return M.view(B, Hq, T), L.view(B, Hq, T), O.view(B, Hq, T, Dv)


def past_weights(
    store: PagedStore, q: Tensor, scale: float, bias: PastBias | None, M: Tensor, L: Tensor, full: bool = True
) -> Tensor | tuple[Tensor, Tensor]:
    """Normalised weights of the cached keys in pool layout given the final M, L (B, Hq, T) of the
    whole softmax (cached and new keys): (N, P, G, T) if ``full``, else the two per-slot sums
    TOVA/H2O record, (last (N, P): the last query's weight, mean over the G query heads;
    total (N, P): summed over the queries and the G query heads)."""
    B, Hq, T, D = q.shape
    G, P, N = store.groups, store.P, store.num_blocks
    R = B * Hq // G
    qr = _up(q).reshape(R, G * T, D)
    Ms, Lr = _safe(M).reshape(R, G, T), L.reshape(R, G, T)
    dt = _dt(q)
    if bias is not None:
        bias.dtype = dt
    out = torch.zeros((N, P, G, T) if full else (N, P), dtype=dt, device=q.device)  # full, or the last query's
    total = torch.zeros((0, P) if full else (N, P), dtype=dt, device=q.device)
    if "k" not in store or N == 0:
        return out if full else (out, total)
    if use_rows(store, T):
        for r, ids in _row_chunks(store, G * T, D):
            w = _row_scores(store, qr, r, ids, bias, scale, T).sub_(Ms[r][..., None]).clamp_(min=EXP_FLOOR).exp_()
            w = w.div_(Lr[r][..., None])
            w = w.view(G, T, len(ids), P)  # (G, T, nb, P)
            if full:
                out[ids] = w.permute(2, 3, 0, 1)
            else:
                out[ids], total[ids] = w[:, -1].mean(0), w.sum((0, 1))
        return out if full else (out, total)
    for blk in _block_chunks(store, G * T, D):
        s, rows = _block_scores(store, qr, blk, bias, scale, T)
        w = s.sub_(Ms[rows][..., None]).clamp_(min=EXP_FLOOR).exp_().div_(Lr[rows][..., None])  # (nb, G, T, P)
        if full:
            out[blk] = w.permute(0, 3, 1, 2)
        else:
            out[blk], total[blk] = w[:, :, -1].mean(1), w.sum((1, 2))
    return out if full else (out, total)


def new_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Tensor, pad_to: int = 16
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
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


def cached_attention(
    store: PagedStore,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    past_bias: PastBias | None,
    new_bias: Tensor,
    weights: str | None = None,
) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor] | None, Tensor | None]:
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


def weights_in_dense_order(store: PagedStore, w_past: Tensor, w_new: Tensor) -> Tensor:
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
