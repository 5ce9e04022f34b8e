"""Triton kernels of tiled First Passage Attention: forward, dq (+ query-side field terms), dk/dv
(+ key-side field terms). See triton_prep.py for the tiling and the three-term range minimum.

Every kernel works on one (batch, query head) row of the flattened inputs (contiguous):
q (BH, Tq, D), k (BHkv, Tk, D), v (BHkv, Tk, Dv), field (BH, Tq), level (BH, Tk); the
prepared rows sfx (BH, Lk), tmin (BH, nK), pref (BH, Lq), minlvl (BH, nK), fq0 (BH, nQ),
thr (BH, nQ). ACC is the math dtype (float32, or float64 for float64 inputs); the dots take
the input dtype (float32 as exact IEEE, never tf32) and accumulate in ACC.

Tile skipping: an off-diagonal pair (key tile J, query tile I) is skipped, in all three
kernels alike, when beta * (min level in J - min(mid(J, I), field at I's first query)) > thr[I]:
every penalty in the pair is at least that bound. Its inputs are exact minima, so the three
kernels take the same decisions. thr = +inf turns skipping off.

Names reassigned inside loops and branches keep their types (Triton's compiled mode requires it,
the interpreter does not check it).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in ACC. UPCAST (interpreter only): bfloat16 operands are widened to float32
    first (exact), because Triton's interpreter multiplies bfloat16 dots wrongly (its raw bits)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), out_dtype=ACC)
    else:
        return tl.dot(a, b, input_precision=PREC, out_dtype=ACC)


@triton.jit
def _diag_min(FROW, r0, Tq, BLOCK: tl.constexpr, ACC: tl.constexpr):
    """Diagonal tile: M[i, j] = min_{j < t <= i} field[r0 + t] and its argmin t (local; ties: later t).

    An in-tile scan over t: BLOCK steps of an elementwise min on the (BLOCK, BLOCK) tile.
    """
    offs = tl.arange(0, BLOCK)
    rows = offs[:, None]
    cols = offs[None, :]
    m = tl.full((BLOCK, BLOCK), float("inf"), ACC)
    arg = tl.zeros((BLOCK, BLOCK), tl.int32)
    for t in range(0, BLOCK):
        ft = tl.load(FROW + r0 + t, mask=r0 + t < Tq, other=float("inf")).to(ACC)
        take = (cols < t) & (rows >= t) & (ft <= m)
        m = tl.where(take, ft, m)
        arg = tl.where(take, t, arg)
    return m, arg


@triton.jit
def _off_min(sfx, mid, pref):
    """Off-diagonal tile: M = min(sfx[j], mid, pref[i]) -> (BLOCK, BLOCK)."""
    return tl.minimum(tl.minimum(sfx[None, :], mid), pref[:, None])


@triton.jit
def _skip(beta, minlvl, mid, fq0, thr):
    """True when every penalty of an off-diagonal tile pair exceeds thr (thr = +inf: never)."""
    return beta * (minlvl - tl.minimum(mid, fq0)) > thr


@triton.jit
def _load_t(X, kj, kvalid, ncols, BC: tl.constexpr):
    """Transposed (BC, len(kj)) tile of a row-major (n, ncols) matrix at rows kj, zero outside."""
    c = tl.arange(0, BC)
    return tl.load(X + kj[None, :] * ncols + c[:, None], mask=kvalid[None, :] & (c[:, None] < ncols), other=0.0)


@triton.jit
def _load_rows(X, rows, rvalid, ncols, BC: tl.constexpr):
    """(len(rows), BC) tile of a row-major (n, ncols) matrix, zero outside."""
    cols = tl.arange(0, BC)
    return tl.load(X + rows[:, None] * ncols + cols[None, :], mask=rvalid[:, None] & (cols[None, :] < ncols), other=0.0)


@triton.jit
def _scores(q, kt, lvl, m, beta, scale, ok, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """s = scale * q k^T - beta * relu(level - M), -inf where not ok; and dip. q (BLOCK, BD), kt (BD, BLOCK)."""
    dip = tl.maximum(lvl[None, :] - m, 0.0)
    s = _dot(q, kt, ACC, PREC, UPCAST) * scale - beta * dip
    return tl.where(ok, s, float("-inf")), dip


@triton.jit
def _query_tile(
    Q, PREF, BETA, FQ0, THR, m_idx, bh, Tq, Hq, G, nQ, D, BLOCK: tl.constexpr, BD: tl.constexpr, ACC: tl.constexpr
):
    """A query-tile program's inputs -> (kvbh, rows, rvalid, q, pref, beta, fq0, thr)."""
    kvbh = (bh // Hq) * (Hq // G) + (bh % Hq) // G
    rows = m_idx * BLOCK + tl.arange(0, BLOCK)
    rvalid = rows < Tq
    q = _load_rows(Q + bh * Tq * D, rows, rvalid, D, BD)
    pref = tl.load(PREF + bh * nQ * BLOCK + rows).to(ACC)
    beta = tl.load(BETA + bh % Hq).to(ACC)
    fq0 = tl.load(FQ0 + bh * nQ + m_idx).to(ACC)
    thr = tl.load(THR + bh * nQ + m_idx).to(ACC)
    return kvbh, rows, rvalid, q, pref, beta, fq0, thr


@triton.jit
def _diag_tile(
    q,
    Kb,
    LEVEL,
    FIELD,
    bh,
    m_idx,
    rows,
    Tq,
    Tk,
    beta,
    scale,
    D,
    BLOCK: tl.constexpr,
    BD: tl.constexpr,
    ACC: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """The query tile's diagonal key tile -> (s, dip, kt, kj, kvalid, argmin of the in-tile minima)."""
    offs = tl.arange(0, BLOCK)
    kj = Tk - Tq + rows
    kvalid = kj < Tk
    lvl = tl.load(LEVEL + bh * Tk + kj, mask=kvalid, other=0.0).to(ACC)
    md, arg = _diag_min(FIELD + bh * Tq, m_idx * BLOCK, Tq, BLOCK, ACC)
    kt = _load_t(Kb, kj, kvalid, D, BD)
    ok = (offs[None, :] <= offs[:, None]) & kvalid[None, :]
    s, dip = _scores(q, kt, lvl, md, beta, scale, ok, ACC, PREC, UPCAST)
    return s, dip, kt, kj, kvalid, arg


@triton.jit
def _off_tile(
    q,
    Kb,
    LEVEL,
    SFX,
    bh,
    n,
    pad,
    Tk,
    nK,
    mid,
    pref,
    beta,
    scale,
    D,
    BLOCK: tl.constexpr,
    BD: tl.constexpr,
    ACC: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Key tile n strictly before the query tile -> (s, dip, kt, kj, kvalid, sfx)."""
    offs = tl.arange(0, BLOCK)
    kj = n * BLOCK + offs - pad
    kvalid = kj >= 0
    lvl = tl.load(LEVEL + bh * Tk + kj, mask=kvalid, other=0.0).to(ACC)
    sfx = tl.load(SFX + bh * nK * BLOCK + n * BLOCK + offs).to(ACC)
    kt = _load_t(Kb, kj, kvalid, D, BD)
    ok = kvalid[None, :] & (offs[:, None] >= 0)
    s, dip = _scores(q, kt, lvl, _off_min(sfx, mid, pref), beta, scale, ok, ACC, PREC, UPCAST)
    return s, dip, kt, kj, kvalid, sfx


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    FIELD,
    LEVEL,
    SFX,
    TMIN,
    PREF,
    MINLVL,
    FQ0,
    THR,
    BETA,
    OUT,
    LSE,
    NSKIP,
    scale,
    Tq,
    Tk,
    pad,
    nP,
    nQ,
    nK,
    Hq,
    G,
    D,
    Dv,
    BLOCK: tl.constexpr,
    BD: tl.constexpr,
    BDV: tl.constexpr,
    ACC: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    m_idx = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # int64 offsets: B*H*T*D may exceed 2**31
    kvbh, rows, rvalid, q, pref, beta, fq0, thr = _query_tile(
        Q, PREF, BETA, FQ0, THR, m_idx, bh, Tq, Hq, G, nQ, D, BLOCK, BD, ACC
    )
    Kb = K + kvbh * Tk * D
    Vb = V + kvbh * Tk * Dv

    # the diagonal tile first: every real row then has a finite running max
    s, dip, kt, kj, kvalid, _arg = _diag_tile(
        q, Kb, LEVEL, FIELD, bh, m_idx, rows, Tq, Tk, beta, scale, D, BLOCK, BD, ACC, PREC, UPCAST
    )
    row_max = tl.max(s, 1)
    p = tl.exp(s - row_max[:, None])
    row_sum = tl.sum(p, 1)
    v = _load_rows(Vb, kj, kvalid, Dv, BDV)
    acc = _dot(p.to(v.dtype), v, ACC, PREC, UPCAST)

    mid = tl.full([], float("inf"), ACC)
    nskip = tl.zeros([], tl.int32)
    nd = nP + m_idx
    for it in range(0, nd):
        n = nd - 1 - it
        minlvl = tl.load(MINLVL + bh * nK + n).to(ACC)
        if _skip(beta, minlvl, mid, fq0, thr):
            nskip += 1
        else:
            s, dip, kt, kj, kvalid, _sfx = _off_tile(
                q, Kb, LEVEL, SFX, bh, n, pad, Tk, nK, mid, pref, beta, scale, D, BLOCK, BD, ACC, PREC, UPCAST
            )
            new_max = tl.maximum(row_max, tl.max(s, 1))
            alpha = tl.exp(row_max - new_max)
            p = tl.exp(s - new_max[:, None])
            row_sum = row_sum * alpha + tl.sum(p, 1)
            v = _load_rows(Vb, kj, kvalid, Dv, BDV)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, ACC, PREC, UPCAST)
            row_max = new_max
        mid = tl.minimum(mid, tl.load(TMIN + bh * nK + n).to(ACC))

    out = acc / row_sum[:, None]
    dv_offs = tl.arange(0, BDV)
    tl.store(
        OUT + bh * Tq * Dv + rows[:, None] * Dv + dv_offs[None, :],
        out.to(OUT.dtype.element_ty),
        mask=rvalid[:, None] & (dv_offs[None, :] < Dv),
    )
    tl.store(LSE + bh * nQ * BLOCK + rows, row_max + tl.log(row_sum))
    tl.store(NSKIP + bh * nQ + m_idx, nskip)


@triton.jit
def _probs_and_ds(s, lse, do, vt, delta, ACC: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """From scores s and the saved log-sum-exp: p = exp(s - lse) and ds = p * (do v^T - delta)."""
    p = tl.exp(s - lse[:, None])
    dp = _dot(do, vt, ACC, PREC, UPCAST)
    return p, p * (dp - delta[:, None])


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    FIELD,
    LEVEL,
    SFX,
    TMIN,
    PREF,
    MINLVL,
    FQ0,
    THR,
    BETA,
    DO,
    LSE,
    DELTA,
    DQ,
    DPREF,
    DDIAG,
    DTILE,
    DBETA,
    scale,
    Tq,
    Tk,
    pad,
    nP,
    nQ,
    nK,
    Hq,
    G,
    D,
    Dv,
    BLOCK: tl.constexpr,
    BD: tl.constexpr,
    BDV: tl.constexpr,
    ACC: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Per query tile: dq, the gradient reaching pref (per row) and mid (per tile minimum,
    atomically), the diagonal tile's in-tile minima routed to field positions, and dbeta's part."""
    m_idx = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # int64 offsets: B*H*T*D may exceed 2**31
    kvbh, rows, rvalid, q, pref, beta, fq0, thr = _query_tile(
        Q, PREF, BETA, FQ0, THR, m_idx, bh, Tq, Hq, G, nQ, D, BLOCK, BD, ACC
    )
    Lq = nQ * BLOCK
    offs = tl.arange(0, BLOCK)
    do = _load_rows(DO + bh * Tq * Dv, rows, rvalid, Dv, BDV)
    lse = tl.load(LSE + bh * Lq + rows)
    delta = tl.load(DELTA + bh * Lq + rows)
    Kb = K + kvbh * Tk * D
    Vb = V + kvbh * Tk * Dv

    s, dip, kt, kj, kvalid, arg = _diag_tile(
        q, Kb, LEVEL, FIELD, bh, m_idx, rows, Tq, Tk, beta, scale, D, BLOCK, BD, ACC, PREC, UPCAST
    )
    p, ds = _probs_and_ds(s, lse, do, _load_t(Vb, kj, kvalid, Dv, BDV), delta, ACC, PREC, UPCAST)
    dq = _dot(ds.to(kt.dtype), tl.trans(kt), ACC, PREC, UPCAST)
    dbeta = -tl.sum(tl.sum(ds * dip, 1), 0)
    g = tl.where(dip > 0, ds * beta, 0.0)
    ddiag = tl.zeros((BLOCK,), ACC)
    for t in range(0, BLOCK):
        ddiag += tl.where(offs == t, tl.sum(tl.sum(tl.where(arg == t, g, 0.0), 1), 0), 0.0)
    tl.store(DDIAG + bh * Lq + rows, ddiag)

    dpref = tl.zeros((BLOCK,), ACC)
    mid = tl.full([], float("inf"), ACC)
    mid_tile = tl.full([], -1, tl.int32)
    pending = tl.zeros([], ACC)  # gradient that reached mid while its argmin tile was mid_tile
    nd = nP + m_idx
    for it in range(0, nd):
        n = nd - 1 - it
        minlvl = tl.load(MINLVL + bh * nK + n).to(ACC)
        if ~_skip(beta, minlvl, mid, fq0, thr):
            s, dip, kt, kj, kvalid, sfx = _off_tile(
                q, Kb, LEVEL, SFX, bh, n, pad, Tk, nK, mid, pref, beta, scale, D, BLOCK, BD, ACC, PREC, UPCAST
            )
            p, ds = _probs_and_ds(s, lse, do, _load_t(Vb, kj, kvalid, Dv, BDV), delta, ACC, PREC, UPCAST)
            dq += _dot(ds.to(kt.dtype), tl.trans(kt), ACC, PREC, UPCAST)
            dbeta -= tl.sum(tl.sum(ds * dip, 1), 0)
            g = tl.where(dip > 0, ds * beta, 0.0)
            # ties go to the later term: pref over mid over sfx
            pref_wins = (pref[:, None] <= mid) & (pref[:, None] <= sfx[None, :])
            mid_wins = (~pref_wins) & (mid <= sfx[None, :])
            dpref += tl.sum(tl.where(pref_wins, g, 0.0), 1)
            pending += tl.sum(tl.sum(tl.where(mid_wins, g, 0.0), 1), 0)
        tn = tl.load(TMIN + bh * nK + n).to(ACC)
        change = tn < mid
        tl.atomic_add(DTILE + bh * nK + tl.maximum(mid_tile, 0), pending, mask=change & (mid_tile >= 0))
        pending = tl.where(change, 0.0, pending)
        mid_tile = tl.where(change, n, mid_tile)
        mid = tl.minimum(mid, tn)
    tl.atomic_add(DTILE + bh * nK + tl.maximum(mid_tile, 0), pending, mask=mid_tile >= 0)

    d_offs = tl.arange(0, BD)
    tl.store(
        DQ + bh * Tq * D + rows[:, None] * D + d_offs[None, :],
        (dq * scale).to(DQ.dtype.element_ty),
        mask=rvalid[:, None] & (d_offs[None, :] < D),
    )
    tl.store(DPREF + bh * Lq + rows, dpref)
    tl.store(DBETA + bh * nQ + m_idx, dbeta)


@triton.jit
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    FIELD,
    LEVEL,
    SFX,
    TMIN,
    PREF,
    MINLVL,
    FQ0,
    THR,
    BETA,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    DLEVEL,
    DSFX,
    scale,
    Tq,
    Tk,
    pad,
    nP,
    nQ,
    nK,
    Hq,
    G,
    D,
    Dv,
    BLOCK: tl.constexpr,
    BD: tl.constexpr,
    BDV: tl.constexpr,
    ACC: tl.constexpr,
    PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Per key tile and key/value head (the G query heads of the group in a loop): dk, dv, dlevel,
    and the gradient reaching sfx (per key)."""
    n = tl.program_id(0)
    kvbh = tl.program_id(1).to(tl.int64)
    Hkv = Hq // G
    Lq = nQ * BLOCK
    Lk = nK * BLOCK
    offs = tl.arange(0, BLOCK)
    kj = n * BLOCK + offs - pad
    kvalid = (kj >= 0) & (kj < Tk)
    kt = _load_t(K + kvbh * Tk * D, kj, kvalid, D, BD)
    vt = _load_t(V + kvbh * Tk * Dv, kj, kvalid, Dv, BDV)
    dk = tl.zeros((BLOCK, BD), ACC)
    dv = tl.zeros((BLOCK, BDV), ACC)
    m0 = tl.maximum(n - nP, 0)
    for gi in range(0, G):
        bh = (kvbh // Hkv) * Hq + (kvbh % Hkv) * G + gi
        beta = tl.load(BETA + bh % Hq).to(ACC)
        lvl = tl.load(LEVEL + bh * Tk + kj, mask=kvalid, other=0.0).to(ACC)
        sfx = tl.load(SFX + bh * Lk + n * BLOCK + offs).to(ACC)
        minlvl = tl.load(MINLVL + bh * nK + n).to(ACC)
        dlevel = tl.zeros((BLOCK,), ACC)
        dsfx = tl.zeros((BLOCK,), ACC)
        mid = tl.full([], float("inf"), ACC)
        for m_idx in range(m0, nQ):
            nd = nP + m_idx
            diag = nd == n
            offdiag = nd != n
            fq0 = tl.load(FQ0 + bh * nQ + m_idx).to(ACC)
            thr = tl.load(THR + bh * nQ + m_idx).to(ACC)
            if diag | ~_skip(beta, minlvl, mid, fq0, thr):
                rows = m_idx * BLOCK + offs
                rvalid = rows < Tq
                q = _load_rows(Q + bh * Tq * D, rows, rvalid, D, BD)
                do = _load_rows(DO + bh * Tq * Dv, rows, rvalid, Dv, BDV)
                lse = tl.load(LSE + bh * Lq + rows)
                delta = tl.load(DELTA + bh * Lq + rows)
                pref = tl.load(PREF + bh * Lq + rows).to(ACC)
                if diag:
                    mm, _ = _diag_min(FIELD + bh * Tq, m_idx * BLOCK, Tq, BLOCK, ACC)
                    ok = (offs[None, :] <= offs[:, None]) & kvalid[None, :]
                else:
                    mm = _off_min(sfx, mid, pref)
                    ok = kvalid[None, :] & (offs[:, None] >= 0)
                s, dip = _scores(q, kt, lvl, mm, beta, scale, ok, ACC, PREC, UPCAST)
                p, ds = _probs_and_ds(s, lse, do, vt, delta, ACC, PREC, UPCAST)
                dv += _dot(tl.trans(p).to(do.dtype), do, ACC, PREC, UPCAST)
                dk += _dot(tl.trans(ds).to(q.dtype), q, ACC, PREC, UPCAST)
                g = tl.where(dip > 0, ds * beta, 0.0)
                dlevel -= tl.sum(g, 0)
                if offdiag:
                    sfx_wins = (sfx[None, :] < mid) & (sfx[None, :] < pref[:, None])
                    dsfx += tl.sum(tl.where(sfx_wins, g, 0.0), 0)
            if offdiag:
                mid = tl.minimum(mid, tl.load(TMIN + bh * nK + nd).to(ACC))
        tl.store(DLEVEL + bh * Lk + n * BLOCK + offs, dlevel)
        tl.store(DSFX + bh * Lk + n * BLOCK + offs, dsfx)
    d_offs = tl.arange(0, BD)
    dv_offs = tl.arange(0, BDV)
    tl.store(
        DK + kvbh * Tk * D + kj[:, None] * D + d_offs[None, :],
        (dk * scale).to(DK.dtype.element_ty),
        mask=kvalid[:, None] & (d_offs[None, :] < D),
    )
    tl.store(
        DV + kvbh * Tk * Dv + kj[:, None] * Dv + dv_offs[None, :],
        dv.to(DV.dtype.element_ty),
        mask=kvalid[:, None] & (dv_offs[None, :] < Dv),
    )
