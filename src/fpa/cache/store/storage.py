"""Paged per-head key storage: bytes held follow the keys kept, not the busiest head.

One ``PagedStore`` per layer. Every (batch row, KV head) -- a "row" r = b * Hkv + h of R = B * Hkv --
owns an ordered list of fixed-size blocks of ``block_size`` (P) slots, taken from one shared pool
(as vLLM's PagedAttention does for sequences). The block table ``table`` (R, M) int32 lists each
row's blocks in order; slot s of row r lives in block ``table[r, s // P]`` at offset ``s % P``.

Pool fields, one slot per (block, offset), shape (N, P, ...):

    k (N, P, D), v (N, P, Dv), pos (N, P) int32, valid (N, P) bool, and optionally
    level, pm (N, P, G) float32 (one per query head of the KV head, G = groups), last, score (N, P).

``owner`` (N,) int64 is each block's row (-1 for a free block). Free blocks and slots past a row's
``fill`` always have valid = False.

- ``append`` writes T new slots at the end of every row (a row whose last block is full takes a
  free block; the pool grows by ``growth`` x when none is left): O(T) per row, amortised.
- ``evict(keep)`` (keep (N, P) bool, pool layout) marks slots invalid (holes). Once ``P`` tokens
  were appended since the last time, it also reclaims (``reclaim``): a row whose holes reach
  ``max(P, slack * kept)`` is compacted (its kept slots move to the front of its own blocks, the
  emptied blocks return to the free list): O(1) amortised per evicted key. When the free blocks
  exceed ``R + N * growth * 2`` the pool is repacked into a smaller allocation.
- So, per layer, after every reclaim, slots allocated <= kept * (1 + slack + 2 * growth) + about
  3 R P; bytes_held counts every allocated byte (pool, block table, owner index). Between two
  reclaims (fewer than P tokens appended) the slots evicted since the last one stay allocated.

Host syncs: ``fill_host`` and ``nblk_host`` mirror ``fill`` and ``nblk`` on the host, so an append
knows how many blocks to take (its sizes follow from T alone) and never reads a device value (each
read is a host sync on an accelerator); neither does ``evict`` between reclaims, nor ``counts``,
``from_dense`` or the dense views. A reclaim reads the hole counts and the new fills (a few syncs,
once every P appended tokens); so do ``truncate``, ``select_rows`` and ``compact``.

Nothing builds a padded (B, H, C) copy of the keys on the decode path (fpa.cache.store.paged reads the
pool directly). ``store[name]`` is such a padded copy, for inspection, tests and the budget policies'
scalar scores: shape (B, Hkv, C, ...) or (B, Hq, C) for level/pm, C = the largest fill, slots past
a row's fill padded with level = +PAD_BIG, pm = -PAD_BIG, pos = -1, valid = False, 0 elsewhere.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fpa.checks import positive_int

PAD_BIG = 1e30
Q_HEAD_FIELDS = ("level", "pm")
_PAD = {"level": PAD_BIG, "pm": -PAD_BIG, "pos": -1, "valid": False}


class PagedStore:
    """Paged storage of one layer; ``groups`` = Hq // Hkv (query heads per KV head)."""

    def __init__(self, groups: int, block_size: int = 16, growth: float = 1 / 32, slack: float = 0.05):
        positive_int("block_size", block_size)
        self.groups, self.P, self.growth, self.slack = groups, block_size, growth, slack
        self.pool: dict[str, Tensor] = {}
        self.B = self.Hkv = 0
        self.owner = torch.zeros(0, dtype=torch.long)
        self.table = torch.zeros(0, 0, dtype=torch.int32)
        self.nblk = self.fill = torch.zeros(0, dtype=torch.long)
        self.free = torch.zeros(0, dtype=torch.long)  # stack of free block ids
        self.fill_host: list[int] = []  # fill and nblk per row, on the host
        self.nblk_host: list[int] = []
        self.tokens_since_reclaim = 0  # tokens appended to every row since the last reclaim

    def _reset(self) -> None:
        """Empty the store (as a new one)."""
        PagedStore.__init__(self, self.groups, self.P, self.growth, self.slack)

    # --- shape helpers ---------------------------------------------------------------------------
    @property
    def R(self) -> int:
        """Rows: batch rows x KV heads."""
        return self.B * self.Hkv

    @property
    def num_blocks(self) -> int:
        """N, blocks allocated in the pool (used and free)."""
        return self.owner.shape[0]

    def __contains__(self, name: str) -> bool:
        return name in self.pool

    def _to_slots(self, name: str, x: Tensor) -> Tensor:
        """(B, Hkv, T, ...) or (B, Hq, T) for level/pm -> (R * T, ...) / (R * T, G)."""
        if name in Q_HEAD_FIELDS:
            B, _, T = x.shape
            return x.reshape(B, self.Hkv, self.groups, T).permute(0, 1, 3, 2).reshape(-1, self.groups)
        return x.reshape((-1,) + x.shape[3:])

    def _from_slots(self, name: str, x: Tensor, C: int) -> Tensor:
        """Inverse of ``_to_slots`` for C slots per row."""
        if name in Q_HEAD_FIELDS:
            return x.reshape(self.B, self.Hkv, C, self.groups).permute(0, 1, 3, 2).reshape(self.B, -1, C)
        return x.reshape((self.B, self.Hkv, C) + x.shape[1:])

    def flat(self, name: str) -> Tensor:
        """Pool field as (N * P, ...) (a view)."""
        x = self.pool[name]
        return x.view((-1,) + x.shape[2:])

    def _slot_index(self, rows: Tensor, slots: Tensor) -> Tensor:
        """Flat pool index (N * P) of slot ``slots`` (..., n) of rows ``rows`` (...) (slots < fill)."""
        blk = self.table[rows[..., None], torch.div(slots, self.P, rounding_mode="floor")].long()
        return blk * self.P + slots % self.P

    def dense_index(self) -> Tensor:
        """(R, C) int64 flat pool index of every row's slots 0..C-1 (C = largest fill), -1 past a
        row's fill."""
        C = max(self.fill_host, default=0)
        s = torch.arange(C, device=self.owner.device)
        idx = self._slot_index(torch.arange(self.R, device=s.device), s.expand(self.R, C))
        return idx.masked_fill(s[None] >= self.fill[:, None], -1)

    # --- inspection / dense views ---------------------------------------------------------------
    def to_dense(self, x: Tensor, pad: float = 0, index: Tensor | None = None) -> Tensor:
        """A pool-layout tensor (N, P, ...) -> (R, C, ...) in slot order, ``pad`` past each fill."""
        idx = self.dense_index() if index is None else index
        flat = x.reshape((-1,) + x.shape[2:])
        out = flat[idx.clamp(min=0)]
        gone = (idx < 0).reshape(idx.shape + (1,) * (out.dim() - 2))
        return out.masked_fill(gone, pad)

    def from_dense(self, x: Tensor, fill: bool | float = True, index: Tensor | None = None) -> Tensor:
        """(B, Hkv, C) per-slot values aligned with ``store[...]`` -> pool layout (N, P); ``fill``
        where no dense slot maps."""
        idx = self.dense_index() if index is None else index
        n = self.num_blocks * self.P
        out = torch.full((n + 1,), fill, dtype=x.dtype, device=x.device)
        # dense slots past a row's fill write to one extra element, dropped after: a boolean mask
        # would size the write by its values (a host sync)
        out[torch.where(idx >= 0, idx, n).reshape(-1)] = x.reshape(-1)
        return out[:n].view(self.num_blocks, self.P)

    def __getitem__(self, name: str) -> Tensor:
        """A padded dense COPY of a field: (B, Hkv, C, ...) or (B, Hq, C) for level/pm."""
        d = self.to_dense(self.pool[name], _PAD.get(name, 0))
        return self._from_slots(name, d.reshape((-1,) + d.shape[2:]), d.shape[1])

    def set_dense(self, name: str, x: Tensor) -> None:
        """Write a field given densely (the shape ``store[name]`` has) into the pool."""
        idx = self.dense_index()
        ok = (idx >= 0).reshape(-1)
        self.flat(name)[idx.reshape(-1)[ok]] = self._to_slots(name, x)[ok].to(self.pool[name].dtype)

    def counts(self) -> Tensor:
        """(B, Hkv) int64: keys held by each (row, KV head)."""
        out = torch.zeros(self.R, dtype=torch.long, device=self.owner.device)
        if self.pool:  # a free block holds no valid slot: it adds 0 to row 0
            out.index_add_(0, self.block_rows(), self.pool["valid"].sum(-1))
        return out.view(self.B, self.Hkv)

    # --- allocation ------------------------------------------------------------------------------
    def _grow_pool(self, n_new: int) -> None:
        old = self.num_blocks
        for name, x in self.pool.items():
            y = x.new_zeros((old + n_new,) + x.shape[1:])
            y[:old] = x
            self.pool[name] = y
        self.owner = torch.cat([self.owner, self.owner.new_full((n_new,), -1)])
        self.free = torch.cat([self.free, torch.arange(old + n_new - 1, old - 1, -1, device=self.owner.device)])

    def _take_blocks(self, need: Tensor, need_host: list[int]) -> None:
        """Give row r need[r] more blocks (appended to its table); ``need_host`` holds the same
        counts on the host (every size here comes from it: no device value is read)."""
        total = sum(need_host)
        if total == 0:
            return
        if total > self.free.numel():
            used = self.num_blocks - self.free.numel()
            self._grow_pool(max(total - self.free.numel(), math.ceil((used + total) * self.growth) + self.R))
        cols = max(n + d for n, d in zip(self.nblk_host, need_host))
        if cols > self.table.shape[1]:
            grown = max(cols, int(self.table.shape[1] * (1 + self.growth)) + 1)
            t = self.table.new_full((self.R, grown), -1)
            t[:, : self.table.shape[1]] = self.table
            self.table = t
        ids, self.free = self.free[-total:], self.free[:-total]
        rows = torch.repeat_interleave(torch.arange(self.R, device=need.device), need, output_size=total)
        start = torch.cumsum(need, 0) - need
        col = self.nblk[rows] + torch.arange(total, device=need.device) - start[rows]
        self.table[rows, col] = ids.to(torch.int32)
        self.owner[ids] = rows
        self.nblk = self.nblk + need
        self.nblk_host = [n + d for n, d in zip(self.nblk_host, need_host)]

    def _release(self, rows: Tensor, keep_blocks: Tensor, rows_host: list[int], keep_host: list[int]) -> None:
        """Return the blocks of ``rows`` past their first ``keep_blocks`` (each <= the row's blocks)
        to the free list; ``rows_host``, ``keep_host``: the same on the host."""
        if all(self.nblk_host[r] == k for r, k in zip(rows_host, keep_host)):
            return
        cols = torch.arange(self.table.shape[1], device=rows.device)
        gone = (cols[None] >= keep_blocks[:, None]) & (cols[None] < self.nblk[rows][:, None])
        ids = self.table[rows][gone].long()
        if ids.numel():
            self.pool["valid"][ids] = False
            self.owner[ids] = -1
            self.free = torch.cat([self.free, ids])
            t = self.table[rows]
            self.table[rows] = t.masked_fill(gone, -1)
        self.nblk[rows] = keep_blocks
        for r, k in zip(rows_host, keep_host):
            self.nblk_host[r] = k

    # --- writing --------------------------------------------------------------------------------
    def append(self, **new: Tensor) -> Tensor:
        """Append T slots to every row. Fields (B, Hkv, T, ...) (level/pm: (B, Hq, T)); ``valid``
        (B, Hkv, T) bool defaults to True; every existing field must be given (but ``valid``).
        Returns the (R, T) flat pool index of the new slots."""
        expected = set(self.pool) - {"valid"}
        if self.pool and set(new) - {"valid"} != expected:
            raise ValueError(f"append needs the fields {sorted(expected)}, got {sorted(new)}")
        ref = new["pos"]
        B, Hkv, T = ref.shape[:3]
        if not self.pool:
            self.B, self.Hkv, dev = B, Hkv, ref.device
            self.owner = torch.zeros(0, dtype=torch.long, device=dev)
            self.table = torch.zeros(self.R, 0, dtype=torch.int32, device=dev)
            self.nblk = torch.zeros(self.R, dtype=torch.long, device=dev)
            self.fill = torch.zeros(self.R, dtype=torch.long, device=dev)
            self.free = torch.zeros(0, dtype=torch.long, device=dev)
            self.fill_host, self.nblk_host = [0] * self.R, [0] * self.R
        elif (B, Hkv) != (self.B, self.Hkv):
            raise ValueError(f"append got {B} rows x {Hkv} KV heads, the store holds {self.B} x {self.Hkv}")
        new.setdefault("valid", torch.ones(ref.shape, dtype=torch.bool, device=ref.device))
        for name, x in new.items():
            if name not in self.pool:
                s = self._to_slots(name, x)
                self.pool[name] = s.new_zeros((self.num_blocks, self.P) + s.shape[1:])
        P = self.P
        need_host = [max(0, (f + T + P - 1) // P - n) for f, n in zip(self.fill_host, self.nblk_host)]
        if any(need_host):
            need = torch.div(self.fill + T + P - 1, P, rounding_mode="floor") - self.nblk
            self._take_blocks(need.clamp(min=0), need_host)
        rows = torch.arange(self.R, device=ref.device)
        idx = self._slot_index(rows, self.fill[:, None] + torch.arange(T, device=ref.device))  # (R, T)
        for name, x in new.items():
            self.flat(name)[idx.reshape(-1)] = self._to_slots(name, x).to(self.pool[name].dtype)
        self.fill = self.fill + T
        self.fill_host = [f + T for f in self.fill_host]
        self.tokens_since_reclaim += T
        return idx

    def add_field(self, name: str, fill: float = 0.0) -> None:
        """Create a per-slot float field (N, P) filled with ``fill`` if it is missing."""
        if name not in self.pool and self.pool:
            self.pool[name] = torch.full(self.pool["valid"].shape, fill, dtype=torch.float32, device=self.owner.device)

    def block_rows(self) -> Tensor:
        """(N,) row of every block, 0 for free blocks (their slots are invalid): safe for gathers."""
        return self.owner.clamp(min=0)

    def minimum_per_row(self, name: str, x: Tensor) -> None:
        """In place: a level/pm field <- min(field, x[row, g]) for x (B, Hq)."""
        per_block = x.reshape(self.R, self.groups)[self.block_rows()]  # (N, G)
        self.pool[name].copy_(torch.minimum(self.pool[name], per_block[:, None, :]))

    # --- eviction ---------------------------------------------------------------------------------
    def evict(self, keep: Tensor) -> None:
        """Turn the valid slots where ``keep`` (N, P) bool is False into holes (no host sync); then
        ``reclaim`` if ``P`` tokens or more were appended since the last reclaim."""
        valid = self.pool["valid"]
        gone = valid & ~keep
        valid &= keep
        for name, pad in _PAD.items():
            if name in self.pool and name != "valid":
                x = self.pool[name]
                x.masked_fill_(gone.reshape(gone.shape + (1,) * (x.dim() - 2)), pad)
        if self.tokens_since_reclaim >= self.P:
            self.reclaim()

    def reclaim(self) -> None:
        """Compact every row whose holes reach max(P, slack * kept), then repack the pool if too
        much of it is free. Reads the hole counts (a host sync on an accelerator)."""
        self.tokens_since_reclaim = 0
        if not self.pool:
            return
        n = self.counts().reshape(-1)
        flags = (self.fill - n >= torch.clamp(self.slack * n, min=self.P)).tolist()
        rows_host = [r for r, f in enumerate(flags) if f]
        if rows_host:
            self._compact(self._on_device(rows_host), rows_host)

    def _on_device(self, values: list[int]) -> Tensor:
        """A host list as an int64 tensor on the store's device (an asynchronous copy)."""
        return torch.tensor(values, dtype=torch.long).to(self.owner.device, non_blocking=True)

    def compact(self, rows: Tensor | None = None) -> None:
        """Move the kept slots of ``rows`` (default: all) to the front of their blocks, in order,
        and free the blocks no longer needed; then repack the pool if too much of it is free."""
        if rows is None:
            self._compact(torch.arange(self.R, device=self.owner.device), list(range(self.R)))
        else:
            self._compact(rows, [int(r) for r in rows.reshape(-1).tolist()])

    def _compact(self, rows: Tensor, rows_host: list[int]) -> None:
        """``compact`` of ``rows``, given on the device and on the host."""
        if self.pool and rows_host:
            fill = self.fill[rows]
            C = max(self.fill_host[r] for r in rows_host)
            s = torch.arange(C, device=rows.device).expand(rows.numel(), C)
            src = self._slot_index(rows, s).masked_fill(s >= fill[:, None], -1)
            ok = (src >= 0) & self.flat("valid")[src.clamp(min=0)]
            n = ok.sum(-1)
            order = torch.sort((~ok).to(torch.int8), dim=-1, stable=True).indices
            src = src.gather(1, order)
            live = s < n[:, None]
            src_live = src[live]
            data = {name: self.flat(name)[src_live].clone() for name in self.pool}
            self.flat("valid")[src[src >= 0]] = False
            dst = self._slot_index(rows, s)[live]  # slot i < n of each row: inside its blocks
            for name, x in data.items():
                self.flat(name)[dst] = x
            self.fill[rows] = n
            n_host = n.tolist()
            for r, k in zip(rows_host, n_host):
                self.fill_host[r] = k
            keep_host = [-(-k // self.P) for k in n_host]
            self._release(rows, torch.div(n + self.P - 1, self.P, rounding_mode="floor"), rows_host, keep_host)
        if self.free.numel() > self.R + 2 * self.growth * self.num_blocks:
            self._repack()

    def _repack(self) -> None:
        """Move the used blocks to a new pool of used + R + growth * used blocks."""
        used = (self.owner >= 0).nonzero().reshape(-1)
        U = used.numel()
        spare = self.R + math.ceil(self.growth * U)
        new_id = torch.full((self.num_blocks,), -1, dtype=torch.long, device=used.device)
        new_id[used] = torch.arange(U, device=used.device)
        for name, x in self.pool.items():
            y = x.new_zeros((U + spare,) + x.shape[1:])
            y[:U] = x[used]
            self.pool[name] = y
        self.owner = torch.cat([self.owner[used], self.owner.new_full((spare,), -1)])
        t = self.table.long()
        self.table = torch.where(t >= 0, new_id[t.clamp(min=0)], -1).to(torch.int32)
        cols = max(1, max(self.nblk_host, default=0))
        if self.table.shape[1] > 2 * cols:
            self.table = self.table[:, :cols].clone()
        self.free = torch.arange(U + spare - 1, U - 1, -1, device=used.device)

    def truncate(self, n: int) -> None:
        """Keep each row's first n slots (undoes appends: crop without eviction)."""
        if not self.pool:
            return
        n = max(0, n)
        C = max(self.fill_host)
        if n < C:
            s = torch.arange(n, C, device=self.owner.device).expand(self.R, C - n)
            rows = torch.arange(self.R, device=s.device)
            idx = self._slot_index(rows, s).masked_fill(s >= self.fill[:, None], -1)
            self.flat("valid")[idx[idx >= 0]] = False
        self.fill = self.fill.clamp(max=n)
        self.fill_host = [min(f, n) for f in self.fill_host]
        self._release(
            torch.arange(self.R, device=self.owner.device),
            torch.div(self.fill + self.P - 1, self.P, rounding_mode="floor"),
            list(range(self.R)),
            [-(-f // self.P) for f in self.fill_host],
        )

    def select_rows(self, index: Tensor) -> None:
        """Reorder / select batch rows (beam search): rebuilt from the dense view."""
        if not self.pool:
            return
        dense = {name: self[name].index_select(0, index.to(self.owner.device)) for name in self.pool}
        self._reset()
        self.append(**dense)

    # --- accounting -----------------------------------------------------------------------------
    def slot_bytes(self) -> int:
        """Bytes of one slot over every field (what one kept key costs)."""
        return (
            sum(x[0].numel() // self.P * x.element_size() for x in self.pool.values())
            if self.num_blocks
            else sum(x.shape[2:].numel() * x.element_size() for x in self.pool.values())
        )

    def bytes_held(self) -> int:
        """Every allocated byte: pool (kept slots, holes, partial and free blocks), owner index,
        block table, free list."""
        meta = sum(t.numel() * t.element_size() for t in (self.owner, self.table, self.free, self.nblk, self.fill))
        return meta + sum(x.numel() * x.element_size() for x in self.pool.values())

    def bytes_live(self) -> int:
        """Bytes the kept keys alone take (no holes, no free room, no metadata)."""
        return 0 if not self.pool else int(self.counts().sum()) * self.slot_bytes()

    def overhead_bound(self) -> int:
        """The fixed per-layer allowance of the memory bound (bytes): 3 R P slots (one partial tail
        block, P holes before a compaction and one spare block per row) plus the metadata."""
        meta = sum(t.numel() * t.element_size() for t in (self.owner, self.table, self.free, self.nblk, self.fill))
        return 3 * self.R * self.P * self.slot_bytes() + meta


HeadStore = PagedStore  # the former name
