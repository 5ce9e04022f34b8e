"""Per-head padded key storage: every (batch row, KV head) holds its own number of keys.

Fields are stored along dim 2 ("slots"): per-KV-head fields (k, v, pos, valid, score) have shape
(B, Hkv, C, ...) and per-query-head fields (level, pm) have shape (B, Hq, C), where C (the
capacity) is the same for all heads; ``valid`` (B, Hkv, C) says which slots hold a key.

Evicting a key (``evict``) turns its slot into padding in place; ``compact`` then moves every
head's kept keys to the front and cuts C to the largest kept count, freeing the memory. The store
compacts itself when the padding common to all heads (C minus the largest count) reaches
``max(min_slack, slack * C)``, so compaction costs O(1) per step amortised. Appends write into
reserved room grown geometrically (``growth``), again O(1) per step amortised.
``bytes_held`` counts every allocated byte: keys, padding and reserved room.

Padding values make a slot invisible to attention: level = +PAD_BIG and pm = -PAD_BIG give a
penalty of about 2e30 * beta (weight exactly 0 in float32), valid = False masks it for softmax
layers, and pos = -1.
"""

from __future__ import annotations

import torch
from torch import Tensor

PAD_BIG = 1e30
Q_HEAD_FIELDS = ("level", "pm")
_PAD = {"level": PAD_BIG, "pm": -PAD_BIG, "pos": -1, "valid": False}


def _expand(idx: Tensor, x: Tensor) -> Tensor:
    """Index (B, H, n) -> (B, H, n, *x.shape[3:]) for gather/scatter along dim 2 of x."""
    extra = x.shape[3:]
    return idx.reshape(idx.shape + (1,) * len(extra)).expand(idx.shape + extra)


class HeadStore:
    """Padded per-head storage of one layer. ``groups`` = Hq // Hkv (query heads per KV head)."""

    def __init__(self, groups: int, growth: float = 0.0625, slack: float = 0.125, min_slack: int = 16):
        self.groups, self.growth, self.slack, self.min_slack = groups, growth, slack, min_slack
        self._buf: dict[str, Tensor] = {}
        self._size = 0

    def __contains__(self, name: str) -> bool:
        return name in self._buf

    def __getitem__(self, name: str) -> Tensor:
        """The field's C used slots (a view into the allocated buffer)."""
        return self._buf[name][:, :, :self._size]

    @property
    def capacity(self) -> int:
        """C, the number of slots per head in use (kept keys plus padding)."""
        return self._size

    def counts(self) -> Tensor:
        """(B, Hkv) int64: keys held by each (row, KV head)."""
        return self["valid"].sum(-1)

    def _group(self, name: str, x: Tensor) -> Tensor:
        """A per-KV-head (B, Hkv, ...) tensor repeated for per-query-head fields."""
        return x.repeat_interleave(self.groups, dim=1) if name in Q_HEAD_FIELDS else x

    def append(self, **new: Tensor) -> None:
        """Append T new valid slots after the current C; every existing field must be given."""
        expected = set(self._buf) - {"valid"}
        if self._buf and set(new) != expected:
            raise ValueError(f"append needs the fields {sorted(expected)}, got {sorted(new)}")
        ref = new["pos"]
        new = dict(new, valid=torch.ones(ref.shape, dtype=torch.bool, device=ref.device))
        T = ref.shape[2]
        alloc = next(iter(self._buf.values())).shape[2] if self._buf else 0
        if self._size + T > alloc:
            self._reallocate(self._size + T + int(self.growth * self._size))
        for name, x in new.items():
            if name not in self._buf:
                self._buf[name] = x.new_empty(x.shape[:2] + (T,) + x.shape[3:])
            self._buf[name][:, :, self._size:self._size + T] = x
        self._size += T

    def _reallocate(self, alloc: int) -> None:
        for name, x in self._buf.items():
            y = x.new_empty(x.shape[:2] + (alloc,) + x.shape[3:])
            y[:, :, :self._size] = x[:, :, :self._size]
            self._buf[name] = y

    def add_field(self, name: str, fill: float = 0.0) -> None:
        """Create a per-KV-head float field (B, Hkv, C) filled with ``fill`` if it is missing."""
        if name not in self._buf and self._buf:
            v = self._buf["valid"]
            self._buf[name] = torch.full(v.shape, fill, dtype=torch.float32, device=v.device)

    def minimum_(self, name: str, x: Tensor) -> None:
        """In place: field <- min(field, x) (x broadcastable to the field's used slots)."""
        self[name].copy_(torch.minimum(self[name], x))

    def add_(self, name: str, x: Tensor) -> None:
        """In place: field += x."""
        self[name].add_(x)

    def evict(self, keep: Tensor) -> None:
        """Turn the slots where ``keep`` (B, Hkv, C) bool is False into padding, then compact if
        the padding common to all heads reaches the slack."""
        gone = ~keep & self["valid"]
        if not bool(gone.any()):
            return
        for name, pad in _PAD.items():
            if name in self._buf:
                self[name].masked_fill_(self._group(name, gone), pad)
        free = self._size - int(self.counts().max())
        if free >= max(self.min_slack, self.slack * self._size):
            self.compact()

    def compact(self) -> None:
        """Move every head's valid slots (in order) to the front; C becomes the largest count.
        The buffers are reallocated to exactly C slots."""
        keep = self["valid"]
        n = keep.sum(-1)  # (B, Hkv)
        c_new = int(n.max()) if n.numel() else 0
        order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices[..., :c_new]
        filled = torch.arange(c_new, device=keep.device) < n[..., None]  # (B, Hkv, c_new)
        new = {}
        for name in self._buf:
            x = self[name]
            idx, ok = self._group(name, order), self._group(name, filled)
            y = torch.gather(x, 2, _expand(idx, x))
            ok = ok.reshape(ok.shape + (1,) * (x.dim() - 3))
            new[name] = torch.where(ok, y, torch.full((), _PAD.get(name, 0), dtype=x.dtype, device=x.device))
        self._buf, self._size = new, c_new

    def truncate(self, n: int) -> None:
        """Keep the first n slots (undoes appends; the rest becomes reserved room)."""
        self._size = max(0, min(self._size, n))

    def select_rows(self, index: Tensor) -> None:
        """Reorder / select batch rows (beam search)."""
        for name, x in self._buf.items():
            self._buf[name] = x.index_select(0, index.to(x.device))

    def bytes_held(self) -> int:
        """Bytes of every buffer this store has allocated (keys, padding and reserved room)."""
        return sum(x.numel() * x.element_size() for x in self._buf.values())

    def bytes_live(self) -> int:
        """Bytes the kept keys alone take (what a flat variable-length layout would hold)."""
        per_slot = sum(x[0, 0, 0].numel() * x.element_size() * (self.groups if n in Q_HEAD_FIELDS else 1)
                       for n, x in self._buf.items())  # one (row, KV head) slot, all fields
        return 0 if not self._buf else int(self.counts().sum()) * per_slot
