"""One attention layer's decoding state: the interface the attention layers call.

An attention layer given a state (``fpa.layers.base.AttentionBase.forward``) calls
``configure(info)`` on its first call, reads ``length`` (tokens seen), ``positions`` (of the new
tokens), ``store`` (the cached keys, for the cached keys' bias: fpa.cache.store.paged),
``last_field`` (walk mode and FoX: the walk continues from it), ``key_carry`` (a key-shift layer:
the last real token's key, fpa.layers.key_shift), ``info.groups`` and
``chunk_policy`` (a threshold rule applied inside the call, or None), and attends with
``attend`` (attention over the cached keys plus the new ones, then ``append``).

``LayerState`` is that state in torch alone. ``fpa.cache.LayerCache`` is a ``LayerState`` that is
also a transformers cache layer (and adds crop, beam reordering and the eviction policies'
bookkeeping); a layer called with a plain dict keeps a ``LayerState`` in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from fpa.cache.store.paged import PastBias, cached_attention, weights_in_dense_order
from fpa.cache.store.storage import _PAD, Q_HEAD_FIELDS, PagedStore
from fpa.ops.field import past_min_from_field

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


class ChunkPolicy(Protocol):
    """A threshold rule applied inside each forward call (``fpa.cache`` policies with
    ``within_chunks=True``)."""

    def effective_threshold(self, layer: Any) -> float:
        """The threshold the rule applies to ``layer`` (a ``LayerState``)."""
        ...


class LayerState:
    """Decoding state of one attention layer.

    store: a PagedStore (fpa.cache.store.storage) with the fields k, v, pos, valid and, for FPA/FoX
    layers, level and pm (one per query head), pm_j = min of the field over (j, now] (+inf for the
    newest key); ``store[name]`` is a padded dense copy (B, Hkv, C, ...) / (B, Hq, C) for
    inspection. length: tokens seen, padding included. next_position (B,): the position the next
    real token of each row gets (tokens seen minus padding, unless explicit position ids said
    otherwise). last_field (B, Hq): the walk's last value (walk mode, FoX). key_carry (B, Hkv, D):
    a key-shift layer's unshifted key of the latest real token (``carry_keys``). With ``need_weights``
    set (TOVA, H2O), each call also records the attention weights of the new queries in two
    per-slot store fields: ``last`` = weights of the last query, mean over the query heads of each
    KV head, and ``score`` += the weights summed over every query and query head since the key
    arrived. While ``is_croppable``, the field history (B, Hq, length) of FPA/FoX layers is kept
    (``_fields``) so that the running minima can be rebuilt after a crop, and so are a key-shift
    layer's unshifted keys (``_raw_keys``), to rebuild its carry.

    Padding tokens (mask False) are stored as padding slots: no key, no walk step, no decay.
    """

    chunk_policy: ChunkPolicy | None = None  # set by FPACache for a rule with within_chunks=True

    def __init__(self, croppable: bool = True, block_size: int = 16):
        self.store: PagedStore | None = None
        self.block_size = block_size
        self.length = 0
        self.next_position: Tensor | None = None
        self.last_field: Tensor | None = None
        self.info: LayerInfo | None = None
        self.need_weights = False
        self.is_croppable = croppable
        self._fields: list[Tensor] = []  # field history chunks (B, Hq, T), kept while croppable
        self.key_carry: Tensor | None = None
        self._raw_keys: list[Tensor] = []  # unshifted key chunks (B, Hkv, T, D), kept while croppable

    def configure(self, info: LayerInfo) -> None:
        """Set once, by the layer's first call: its kind, beta and bound (read by the policies).
        A state filled by one attention type refuses another."""
        if self.info is None:
            self.info = info
            self.store = PagedStore(info.groups, self.block_size)
        elif (info.kind, info.mode, info.groups) != (self.info.kind, self.info.mode, self.info.groups):
            raise ValueError(
                f"this cache layer was filled by a {self.info.kind!r} attention layer "
                f"(mode={self.info.mode}, groups={self.info.groups}); it cannot serve a "
                f"{info.kind!r} layer (mode={info.mode}, groups={info.groups}): use a new FPACache"
            )

    def configured(self) -> tuple[PagedStore, LayerInfo]:
        """(store, info) of a configured state.

        Raises:
            ValueError: ``configure`` was never called (the layer never ran on this state).
        """
        if self.store is None or self.info is None:
            raise ValueError(
                "this cache layer is not configured yet: an attention layer configures it on its first call"
            )
        return self.store, self.info

    def _grouped(self, x: Tensor) -> Tensor:
        """(B, Hkv, ...) -> (B, Hq, ...) for per-query-head fields."""
        return x.repeat_interleave(self.configured()[1].groups, dim=1)

    def positions(self, B: int, T: int, device: torch.device | str, mask: Tensor | None = None) -> Tensor:
        """(B, T) int64 positions of T new tokens: each row counts its own real tokens (padding
        positions get the position of the next real token; they are never used)."""
        start = self.next_position
        if start is None:
            start = torch.zeros(B, dtype=torch.long, device=device)
        if mask is None:
            return start[:, None] + torch.arange(T, device=device)
        return start[:, None] + torch.cumsum(mask.long(), -1) - mask.long()

    def carry_keys(self, raw: Tensor, carry: Tensor) -> None:
        """A key-shift layer's call: its unshifted new keys raw (B, Hkv, T, D) and the carry for the
        next call (B, Hkv, D), the unshifted key of the latest real token."""
        self.key_carry = carry.detach()
        if self.is_croppable:
            self._raw_keys.append(raw.detach())

    def past(self, name: str, like: Tensor) -> Tensor:
        """The stored field ``name`` or an empty (B, H, 0, ...) tensor shaped like ``like``."""
        if self.store is not None and name in self.store:
            return self.store[name]
        return like[:, :, :0]

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        past_bias: PastBias | None,
        new_bias: Tensor,
        need_weights: bool = False,
        **append_kw: Any,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of the T new queries q (B, Hq, T, D) over the cached keys and the new keys
        k, v (B, Hkv, T, D), then ``append(k, v, **append_kw)``. past_bias: a fpa.cache.store.paged
        bias for the cached keys (or None); new_bias broadcastable to (B, Hq, T, T) (-inf where
        not allowed). Returns (o (B, Hq, T, Dv), weights (B, Hq, T, C + T) over the slots cached
        before the call in ``store[...]`` order and then the new keys, or None)."""
        store, info = self.configured()
        mode = "full" if need_weights else ("record" if self.need_weights else None)
        o, w_past, w_new = cached_attention(store, q, k, v, q.shape[-1] ** -0.5, past_bias, new_bias, mode)
        w, sums, new_w = None, None, None
        if isinstance(w_past, Tensor):  # "full": (N, P, G, T)
            w = None if w_new is None else weights_in_dense_order(store, w_past, w_new)
            if self.need_weights:
                sums = (w_past[..., -1].mean(-1), w_past.sum((2, 3)))
        elif w_past is not None:  # "record": (last, score)
            sums = w_past
        if sums is not None and w_new is not None:
            if store.num_blocks:
                for name in WEIGHT_FIELDS:
                    store.add_field(name)
                store.pool["last"].copy_(sums[0])
                store.pool["score"].add_(sums[1])
            B, Hq, T, _ = w_new.shape
            wk = w_new.view(B, Hq // info.groups, info.groups, T, T)
            new_w = dict(last=wk[:, :, :, -1].mean(2), score=wk.sum((2, 3)))
        self.append(k, v, weights=new_w, **append_kw)
        return o, w

    def append(
        self,
        k: Tensor,
        v: Tensor,
        field: Tensor | None = None,
        level: Tensor | None = None,
        pos: Tensor | None = None,
        mask: Tensor | None = None,
        weights: dict[str, Tensor] | None = None,
    ) -> None:
        """Store T new keys k, v (B, Hkv, T, D). field/level (B, Hq, T) (FPA/FoX; +PAD_BIG at padding
        positions) also update every pm_j <- min(pm_j, min field). pos (B, T): positions (default
        ``positions``); mask (B, T) bool: False for padding tokens, stored as invalid slots;
        weights: the new keys' "last" and "score" (B, Hkv, T) (TOVA/H2O; default 0)."""
        store, _ = self.configured()
        B, Hkv, T, _ = k.shape
        if self.next_position is None:
            self.next_position = torch.zeros(B, dtype=torch.long, device=k.device)
        if pos is None:
            pos = self.positions(B, T, k.device, mask)
        new = dict(k=k, v=v, pos=pos.to(torch.int32)[:, None, :].expand(B, Hkv, T))
        if field is not None:
            if level is None:
                raise ValueError("append needs the level with the field (FPA/FoX layers)")
            if "pm" in store:
                store.minimum_per_row("pm", field.min(-1).values)
            new.update(level=level, pm=past_min_from_field(field))
            if self.is_croppable:
                self._fields.append(field.detach())
        for name in WEIGHT_FIELDS:
            if name in store or self.need_weights:
                new[name] = (weights or {}).get(name, k.new_zeros(B, Hkv, T, dtype=torch.float32))
        if mask is not None:
            gone = ~mask[:, None, :].expand(B, Hkv, T)
            new["valid"] = ~gone
            for name, pad in _PAD.items():
                if name in new and name != "valid":
                    x = new[name]
                    new[name] = x.masked_fill(self._grouped(gone) if name in Q_HEAD_FIELDS else gone, pad)
        store.append(**new)
        real = pos.long() if mask is None else pos.long().masked_fill(~mask, -1)
        self.next_position = torch.maximum(self.next_position, real.max(-1).values + 1)
        self.length += T

    def counts(self) -> Tensor:
        """(B, Hkv) keys held per row and KV head."""
        return self.configured()[0].counts()

    def tokens_seen(self) -> int:
        """Real (non-padding) tokens seen, summed over batch rows."""
        return 0 if self.next_position is None else int(self.next_position.sum())

    def bytes_held(self) -> int:
        """Bytes of the store (keys, values, positions, levels, minima, scores, padding included)
        plus the key-shift carry and the histories kept for crop."""
        kept = self._fields + self._raw_keys + ([] if self.key_carry is None else [self.key_carry])
        hist = sum(f.numel() * f.element_size() for f in kept)
        return hist + (0 if self.store is None else self.store.bytes_held())

    def bytes_live(self) -> int:
        """Bytes of the kept keys alone (all store fields of the held slots)."""
        return 0 if self.store is None else self.store.bytes_live()
