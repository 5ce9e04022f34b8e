"""Host-side O(T) preparation for the tiled Triton kernels, and the routing of field gradients.

Tiling. The queries are the last Tq of Tk positions (P = Tk - Tq earlier keys). The key axis
is padded at the FRONT by pad = (-P) % BLOCK fake keys, so that in padded key coordinates
j' = j + pad the first query sits at P' = P + pad, a multiple of BLOCK: query tile m (rows
[m*BLOCK, (m+1)*BLOCK)) is then exactly key tile nP + m (nP = P' / BLOCK), its diagonal tile.

With the virtual field vf[j'] = field[j' - P'] for j' >= P' (+inf before: an earlier key only
sees the field before the first query through its past_min pm[j]), the range minimum is

    M(i, j) = min(pm[j], min_{j < t <= i} vf[t])

and for a key tile J strictly before the query tile I (docs/fpa.md, "Computing it fast")

    M(i, j) = min(sfx[j], mid(J, I), pref[i])
    sfx[j]    = min(pm[j], min of vf inside J after j)        (exclusive suffix, per key)
    mid(J, I) = min of tmin over the tiles strictly between    (a running scalar in the kernel)
    pref[i]   = min of the field inside I up to i              (inclusive prefix, per query)

This module builds sfx, tmin, pref and the per-tile bounds (min level, first query's field)
with a few torch ops, plus, for the backward, the source of every minimum as an index into
the virtual gradient vector [field (Tq) | past_min (P)].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Tiling:
    """Sizes of the padded tiling. Lq = nQ * BLOCK query rows, Lk = nK * BLOCK key columns."""

    block: int
    Tq: int
    Tk: int
    P: int
    pad: int
    nP: int
    nQ: int
    nK: int

    @property
    def Lq(self) -> int:
        """Padded query length, nQ * block."""
        return self.nQ * self.block

    @property
    def Lk(self) -> int:
        """Padded key length, nK * block."""
        return self.nK * self.block


def make_tiling(Tq: int, Tk: int, block: int) -> Tiling:
    """The tiling of Tq queries (the last of Tk positions) and Tk keys into tiles of ``block``.

    The key axis gets ``pad`` fake keys at the front so that the first query starts key tile nP;
    the query axis is padded at the end to nQ tiles.
    """
    P = Tk - Tq
    pad = (-P) % block
    nP = (P + pad) // block
    nQ = -(-Tq // block)
    return Tiling(block, Tq, Tk, P, pad, nP, nQ, nP + nQ)


@dataclass
class FieldTiles:
    """Per-(batch*head) row tensors, all in the math dtype (BH = B * Hq).

    sfx (BH, Lk), tmin (BH, nK), pref (BH, Lq), minlvl (BH, nK), fq0 (BH, nQ); with sources:
    sfx_src (BH, Lk), tmin_src (BH, nK), pref_src (BH, Lq), int64 indices into [field | past_min].
    """

    sfx: Tensor
    tmin: Tensor
    pref: Tensor
    minlvl: Tensor
    fq0: Tensor
    sfx_src: Tensor | None = None
    tmin_src: Tensor | None = None
    pref_src: Tensor | None = None


def _padded(x: Tensor, length: int, start: int) -> Tensor:
    """x (BH, n) placed at [start, start + n) of a (BH, length) row of +inf."""
    out = x.new_full((x.shape[0], length), float("inf"))
    out[:, start : start + x.shape[1]] = x
    return out


def field_tiles(field: Tensor, past_min: Tensor, level: Tensor, t: Tiling, with_src: bool) -> FieldTiles:
    """field (BH, Tq), past_min (BH, P), level (BH, Tk), in the math dtype -> FieldTiles.

    Tie rules of the sources (a valid subgradient; only totals over tied positions are unique):
    inside a tile the suffix/prefix minimum keeps the position torch.cummin reports, and between
    pm[j] and the in-tile suffix the field (the later term) wins a tie.
    """
    BH, B_ = field.shape[0], t.block
    fq = _padded(field, t.Lq, 0)
    vf = torch.cat([field.new_full((BH, t.nP * B_), float("inf")), fq], dim=-1).view(BH, t.nK, B_)
    pm = _padded(past_min, t.Lk, t.pad)
    rev = torch.cummin(vf.flip(-1), dim=-1)
    incl = rev.values.flip(-1)  # min over [j, tile end]
    inf_col = torch.full_like(incl[..., :1], float("inf"))
    excl = torch.cat([incl[..., 1:], inf_col], dim=-1).view(BH, t.Lk)
    take_pm = pm < excl
    sfx = torch.where(take_pm, pm, excl)
    pref = torch.cummin(fq.view(BH, t.nQ, B_), dim=-1)
    lv = _padded(level, t.Lk, t.pad)
    tiles = FieldTiles(
        sfx=sfx.contiguous(),
        tmin=incl[..., 0].contiguous(),
        pref=pref.values.reshape(BH, t.Lq).contiguous(),
        minlvl=lv.view(BH, t.nK, B_).amin(-1).contiguous(),
        fq0=fq.view(BH, t.nQ, B_)[..., 0].contiguous(),
    )
    if with_src:
        P_ = t.nP * B_  # P' in padded key coordinates
        tile_start = (torch.arange(t.nK, device=field.device) * B_)[None, :, None]
        incl_pos = tile_start + (B_ - 1 - rev.indices).flip(-1)  # padded key position of the minimum
        excl_pos = torch.cat([incl_pos[..., 1:], incl_pos[..., :1]], dim=-1).view(BH, t.Lk)
        field_src = (excl_pos - P_).clamp(0, t.Tq - 1)
        past_src = t.Tq + (torch.arange(t.Lk, device=field.device) - t.pad).clamp(0, max(t.P - 1, 0))
        tiles.sfx_src = torch.where(take_pm, past_src.expand(BH, -1), field_src)
        tiles.tmin_src = (incl_pos[..., 0] - P_).clamp(0, t.Tq - 1)
        q_start = (torch.arange(t.nQ, device=field.device) * B_)[None, :, None]
        tiles.pref_src = (q_start + pref.indices).reshape(BH, t.Lq).clamp(max=t.Tq - 1)
    return tiles


def skip_thresholds(q: Tensor, k: Tensor, scale: float, tol: float, t: Tiling, dtype: torch.dtype) -> Tensor:
    """Per query tile, the penalty bound above which a key tile is skipped: (B * Hq, nQ).

    thr = 2 * |scale| * max_{i in I} |q_i| * max_j |k_j| + log(Tk / tol). A key j whose penalty
    exceeds thr has softmax weight <= exp(s_ij - s_ii) <= exp(2 c_i - pen) < tol / Tk (the key i
    itself is always live, and |scale <q_i, k_j>| <= c_i = |scale| |q_i| max|k|), so all skipped
    keys of a row together carry weight < tol.
    """
    B, Hq, Tq, _ = q.shape
    Hkv = k.shape[1]
    qn = q.to(dtype).norm(dim=-1)  # (B, Hq, Tq)
    qn = torch.nn.functional.pad(qn, (0, t.Lq - Tq)).view(B, Hq, t.nQ, t.block).amax(-1)
    kn = k.to(dtype).norm(dim=-1).amax(-1)  # (B, Hkv)
    kn = kn.repeat_interleave(Hq // Hkv, dim=1)  # (B, Hq)
    thr = 2 * abs(scale) * qn * kn[..., None] + math.log(t.Tk / tol)
    return thr.reshape(B * Hq, t.nQ).contiguous()


def route_field_grads(
    tiles: FieldTiles, t: Tiling, dsfx: Tensor, dtile: Tensor, dpref: Tensor, ddiag: Tensor
) -> tuple[Tensor, Tensor]:
    """Scatter the per-term gradients of the minima to their sources -> (dfield (BH, Tq), dpast (BH, P)).

    dsfx (BH, Lk): per key, the gradient that reached sfx; dtile (BH, nK): per tile minimum;
    dpref (BH, Lq): per query, the gradient that reached pref; ddiag (BH, Lq): already per
    field position (the kernel routed the diagonal tiles' in-tile minima itself).

    Raises:
        ValueError: ``tiles`` were built without the sources (``field_tiles(..., with_src=False)``).
    """
    sfx_src, tmin_src, pref_src = tiles.sfx_src, tiles.tmin_src, tiles.pref_src
    if sfx_src is None or tmin_src is None or pref_src is None:
        raise ValueError("tiles must carry the sources of the minima: build them with field_tiles(..., with_src=True)")
    dvirt = ddiag.new_zeros(ddiag.shape[0], t.Tq + t.P)
    dvirt[:, : t.Tq] += ddiag[:, : t.Tq]
    dvirt.scatter_add_(1, sfx_src, dsfx)
    dvirt.scatter_add_(1, tmin_src[:, t.nP :], dtile[:, t.nP :])
    dvirt.scatter_add_(1, pref_src, dpref)
    return dvirt[:, : t.Tq], dvirt[:, t.Tq :]
