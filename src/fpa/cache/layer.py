"""One layer's decoding state: the per-head key store plus what the eviction rules need."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fpa.cache.storage import HeadStore
from fpa.ops import past_min_from_field


WEIGHT_FIELDS = ("last", "score")


@dataclass
class LayerInfo:
    """What the attention layer tells its cache.

    kind: "fpa", "fox" or "softmax"; mode: FPA's "free"/"walk" (None otherwise);
    beta: (Hq,) penalty strength (ones for FoX); content_bound: c with |scale <q, k>| <= c
    (None without qk-norm); groups: Hq // Hkv.
    """

    kind: str
    groups: int
    beta: Tensor | None = None
    content_bound: float | None = None
    mode: str | None = None


class LayerCache:
    """Decoding state of one attention layer.

    store: a HeadStore with k (B, Hkv, C, D), v (B, Hkv, C, Dv), pos (B, Hkv, C) int32 and, for
    FPA/FoX layers, level and pm (B, Hq, C) float32, pm_j = min of the field over (j, now]
    (+inf for the newest key). length: tokens seen. last_field (B, Hq): the walk's last value
    (walk mode, FoX). With ``need_weights`` set (TOVA, H2O), each call also records the
    attention weights of the new queries in two store fields (B, Hkv, C): ``last`` = weights of
    the last query, mean over the query heads of each KV head, and ``score`` += the weights summed
    over every query and query head since the key arrived.
    """

    def __init__(self):
        self.store: HeadStore | None = None
        self.length = 0
        self.last_field: Tensor | None = None
        self.info: LayerInfo | None = None
        self.need_weights = False

    def configure(self, info: LayerInfo) -> None:
        """Set once, by the layer's first call: its kind, beta and bound (read by the policies)."""
        if self.info is None:
            self.info = info
            self.store = HeadStore(info.groups)

    def positions(self, B: int, H: int, T: int, device) -> Tensor:
        """(B, H, T) int32 absolute positions of T new tokens."""
        pos = torch.arange(self.length, self.length + T, device=device, dtype=torch.int32)
        return pos.expand(B, H, T)

    def past(self, name: str, like: Tensor) -> Tensor:
        """The stored field ``name`` or an empty (B, H, 0, ...) tensor shaped like ``like``."""
        if self.store is not None and name in self.store:
            return self.store[name]
        return like[:, :, :0]

    def append(self, k: Tensor, v: Tensor, field: Tensor | None = None, level: Tensor | None = None) -> None:
        """Store T new keys; with field/level (B, Hq, T) also update every pm_j <- min(pm_j, min field)."""
        B, Hkv, T, _ = k.shape
        new = dict(k=k, v=v, pos=self.positions(B, Hkv, T, k.device))
        if field is not None:
            if "pm" in self.store:
                self.store.minimum_("pm", field.min(-1, keepdim=True).values)
            new.update(level=level, pm=past_min_from_field(field))
        for name in WEIGHT_FIELDS:
            if name in self.store:
                new[name] = k.new_zeros(B, Hkv, T, dtype=torch.float32)
        self.store.append(**new)
        self.length += T

    def record_weights(self, w: Tensor) -> None:
        """w (B, Hq, T, C) attention weights of the T new queries over every stored slot (after append)."""
        B, Hq, T, C = w.shape
        g = self.info.groups
        wk = w.float().view(B, Hq // g, g, T, C)
        for name in WEIGHT_FIELDS:
            self.store.add_field(name)
        self.store["last"].copy_(wk[:, :, :, -1].mean(2))
        self.store.add_("score", wk.sum((2, 3)))

    def counts(self) -> Tensor:
        """(B, Hkv) keys held per row and KV head."""
        return self.store.counts()

    def bytes_held(self) -> int:
        return 0 if self.store is None else self.store.bytes_held()

    def bytes_live(self) -> int:
        return 0 if self.store is None else self.store.bytes_live()
