"""One layer's decoding state: the per-head key store plus what the eviction rules need.

``LayerCache`` is a transformers ``CacheLayerMixin`` (one per model layer inside ``FPACache``),
but the attention layers use it through ``attend`` (attention over the cached keys plus the new
ones, then ``append``), not through ``update``: its keys live in a paged per-head store
(fpa.cache.storage) that the attention reads block by block (fpa.cache.paged).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

try:  # a transformers cache layer when transformers is installed (the models extra)
    from transformers.cache_utils import CacheLayerMixin
except ImportError:  # pragma: no cover - core install: fpa.layers works without transformers
    CacheLayerMixin = object

from fpa.cache.paged import cached_attention, dense_weights
from fpa.cache.storage import _PAD, PAD_BIG, Q_HEAD_FIELDS, PagedStore
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


class LayerCache(CacheLayerMixin):
    """Decoding state of one attention layer.

    store: a PagedStore (fpa.cache.storage) with the fields k, v, pos, valid and, for FPA/FoX
    layers, level and pm (one per query head), pm_j = min of the field over (j, now] (+inf for the
    newest key); ``store[name]`` is a padded dense copy (B, Hkv, C, ...) / (B, Hq, C) for inspection. length: tokens seen, padding included (the logical sequence length
    transformers reads with ``get_seq_length``). next_position (B,): the position the next real
    token of each row gets (tokens seen minus padding, unless explicit position ids said otherwise).
    last_field (B, Hq): the walk's last value (walk mode, FoX). With ``need_weights`` set (TOVA,
    H2O), each call also records the attention weights of the new queries in two per-slot store fields: ``last`` = weights of the last query, mean over the query heads of each KV head,
    and ``score`` += the weights summed over every query and query head since the key arrived.

    Padding tokens (attention_mask 0) are stored as padding slots: no key, no walk step, no decay.
    ``crop`` (assisted and prompt-lookup decoding) works while nothing was evicted: the cache keeps
    the field history (B, Hq, length) of FPA/FoX layers to rebuild the running minima.
    """

    is_compileable = False
    is_sliding = False
    supports_early_init = False
    chunk_policy = None  # a threshold policy with within_chunks=True (set by FPACache): applied inside calls

    def __init__(self, croppable: bool = True, block_size: int = 16):
        self.store: PagedStore | None = None
        self.block_size = block_size
        self.length = 0
        self.next_position: Tensor | None = None
        self.last_field: Tensor | None = None
        self.info: LayerInfo | None = None
        self.need_weights = False
        self.is_initialized = False
        self.is_croppable = croppable
        self._fields: list[Tensor] = []  # field history chunks (B, Hq, T), kept while croppable

    # --- transformers CacheLayerMixin interface -------------------------------------------------
    @property
    def keys(self) -> Tensor | None:
        """(B, Hkv, C, D) a padded dense COPY of the stored keys (``store["valid"]`` tells which
        slots hold a key); for inspection only, decoding never builds it."""
        return None if self.store is None or "k" not in self.store else self.store["k"]

    @property
    def values(self) -> Tensor | None:
        return None if self.store is None or "v" not in self.store else self.store["v"]

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        """Nothing to do: the store is created by ``configure`` on the layer's first call."""

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        raise NotImplementedError("FPA attention layers write to their LayerCache with append(); "
                                  "an FPACache cannot serve a model that calls Cache.update")

    def get_seq_length(self) -> int:
        """Tokens seen so far, padding included (not keys held)."""
        return self.length

    def get_mask_sizes(self, query, *args, **kwargs) -> tuple[int, int]:
        """(kv_length, kv_offset) for a query of ``query`` tokens (transformers >= 5.3: an int;
        earlier: the cache_position tensor)."""
        q = query if isinstance(query, int) else int(query.shape[-1])
        return self.length + q, 0

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:
        return -1

    def offload(self) -> None:  # the paged store stays where it is
        pass

    def prefetch(self) -> None:
        pass

    def reset(self) -> None:
        self.__init__(self.is_croppable, self.block_size)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Select / reorder batch rows (beam search)."""
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.store is None:
            return
        idx = torch.as_tensor(indices, device=self.next_position.device).reshape(-1)
        if idx.dtype == torch.bool:
            idx = idx.nonzero().reshape(-1)
        self.store.select_rows(idx)
        self.next_position = self.next_position.index_select(0, idx)
        if self.last_field is not None:
            self.last_field = self.last_field.index_select(0, idx.to(self.last_field.device))
        self._fields = [f.index_select(0, idx.to(f.device)) for f in self._fields]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.next_position is not None:
            n = self.next_position.shape[0]
            self.batch_select_indices(torch.arange(n, device=self.next_position.device).repeat_interleave(repeats))

    def crop(self, n: int) -> None:
        """Forget the latest tokens: ``n < 0`` removes -n tokens (transformers >= 5.3 convention),
        ``n > 0`` keeps the first n (earlier versions), ``n == 0`` does nothing. Only while nothing
        was evicted (``is_croppable``: an FPACache without a policy)."""
        keep = self.length + n if n < 0 else (self.length if n == 0 else n)
        if keep >= self.length or self.store is None:
            return
        if not self.is_croppable:
            raise ValueError("crop (assisted or prompt-lookup decoding) needs an FPACache without an eviction "
                             "policy: evicted keys cannot be restored")
        keep = max(keep, 0)
        self.store.truncate(keep)  # slot i holds token i: nothing was evicted or compacted
        valid, pos = self.store["valid"][:, 0], self.store["pos"][:, 0].long()
        self.next_position = (pos.masked_fill(~valid, -1).max(-1).values + 1 if keep else
                              torch.zeros_like(self.next_position))
        if self._fields:
            field = torch.cat(self._fields, -1)[..., :keep]
            self._fields = [field]
            pm = past_min_from_field(field).masked_fill(~self._grouped(self.store["valid"]), -PAD_BIG)
            self.store.set_dense("pm", pm)
            if self.last_field is not None:
                real = field < PAD_BIG / 2  # padding positions hold +PAD_BIG
                last = torch.where(real, torch.arange(keep, device=field.device), -1).max(-1).values
                value = field.gather(-1, last.clamp(min=0)[..., None])[..., 0]
                self.last_field = torch.where(last >= 0, value, torch.zeros_like(value))
        self.length = keep

    # --- FPA interface --------------------------------------------------------------------------
    def configure(self, info: LayerInfo) -> None:
        """Set once, by the layer's first call: its kind, beta and bound (read by the policies).
        A cache filled by one attention type refuses another."""
        if self.info is None:
            self.info = info
            self.store = PagedStore(info.groups, self.block_size)
            self.is_initialized = True
        elif (info.kind, info.mode, info.groups) != (self.info.kind, self.info.mode, self.info.groups):
            raise ValueError(f"this cache layer was filled by a {self.info.kind!r} attention layer "
                             f"(mode={self.info.mode}, groups={self.info.groups}); it cannot serve a "
                             f"{info.kind!r} layer (mode={info.mode}, groups={info.groups}): use a new FPACache")

    def _grouped(self, x: Tensor) -> Tensor:
        """(B, Hkv, ...) -> (B, Hq, ...) for per-query-head fields."""
        return x.repeat_interleave(self.info.groups, dim=1)

    def positions(self, B: int, T: int, device, mask: Tensor | None = None) -> Tensor:
        """(B, T) int64 positions of T new tokens: each row counts its own real tokens (padding
        positions get the position of the next real token; they are never used)."""
        start = self.next_position if self.next_position is not None else torch.zeros(B, dtype=torch.long, device=device)
        if mask is None:
            return start[:, None] + torch.arange(T, device=device)
        return start[:, None] + torch.cumsum(mask.long(), -1) - mask.long()

    def past(self, name: str, like: Tensor) -> Tensor:
        """The stored field ``name`` or an empty (B, H, 0, ...) tensor shaped like ``like``."""
        if self.store is not None and name in self.store:
            return self.store[name]
        return like[:, :, :0]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, past_bias, new_bias: Tensor, need_weights: bool = False,
               **append_kw) -> tuple[Tensor, Tensor | None]:
        """Attention of the T new queries q (B, Hq, T, D) over the cached keys and the new keys
        k, v (B, Hkv, T, D), then ``append(k, v, **append_kw)``. past_bias: a fpa.cache.paged bias
        function for the cached keys (or None); new_bias broadcastable to (B, Hq, T, T) (-inf where
        not allowed). Returns (o (B, Hq, T, Dv), weights (B, Hq, T, C + T) over the slots cached
        before the call in ``store[...]`` order and then the new keys, or None)."""
        mode = "full" if need_weights else ("record" if self.need_weights else None)
        o, w_past, w_new = cached_attention(self.store, q, k, v, q.shape[-1] ** -0.5, past_bias, new_bias, mode)
        w, new_w = None, None
        if need_weights:
            w = dense_weights(self.store, w_past, w_new)
            if self.need_weights:
                w_past = (w_past[..., -1].mean(-1), w_past.sum((2, 3)))
        if self.need_weights:
            if self.store.num_blocks:
                for name in WEIGHT_FIELDS:
                    self.store.add_field(name)
                self.store.pool["last"].copy_(w_past[0])
                self.store.pool["score"].add_(w_past[1])
            B, Hq, T, _ = w_new.shape
            wk = w_new.view(B, Hq // self.info.groups, self.info.groups, T, T)
            new_w = dict(last=wk[:, :, :, -1].mean(2), score=wk.sum((2, 3)))
        self.append(k, v, weights=new_w, **append_kw)
        return o, w

    def append(self, k: Tensor, v: Tensor, field: Tensor | None = None, level: Tensor | None = None,
               pos: Tensor | None = None, mask: Tensor | None = None, weights: dict | None = None) -> None:
        """Store T new keys k, v (B, Hkv, T, D). field/level (B, Hq, T) (FPA/FoX; +PAD_BIG at padding
        positions) also update every pm_j <- min(pm_j, min field). pos (B, T): positions (default
        ``positions``); mask (B, T) bool: False for padding tokens, stored as invalid slots;
        weights: the new keys' "last" and "score" (B, Hkv, T) (TOVA/H2O; default 0)."""
        B, Hkv, T, _ = k.shape
        if self.next_position is None:
            self.next_position = torch.zeros(B, dtype=torch.long, device=k.device)
        if pos is None:
            pos = self.positions(B, T, k.device, mask)
        new = dict(k=k, v=v, pos=pos.to(torch.int32)[:, None, :].expand(B, Hkv, T))
        if field is not None:
            if "pm" in self.store:
                self.store.minimum_per_row("pm", field.min(-1).values)
            new.update(level=level, pm=past_min_from_field(field))
            if self.is_croppable:
                self._fields.append(field.detach())
        for name in WEIGHT_FIELDS:
            if name in self.store or self.need_weights:
                new[name] = (weights or {}).get(name, k.new_zeros(B, Hkv, T, dtype=torch.float32))
        if mask is not None:
            gone = ~mask[:, None, :].expand(B, Hkv, T)
            new["valid"] = ~gone
            for name, pad in _PAD.items():
                if name in new and name != "valid":
                    x = new[name]
                    new[name] = x.masked_fill(self._grouped(gone) if name in Q_HEAD_FIELDS else gone, pad)
        self.store.append(**new)
        real = pos.long() if mask is None else pos.long().masked_fill(~mask, -1)
        self.next_position = torch.maximum(self.next_position, real.max(-1).values + 1)
        self.length += T

    def counts(self) -> Tensor:
        """(B, Hkv) keys held per row and KV head."""
        return self.store.counts()

    def tokens_seen(self) -> int:
        """Real (non-padding) tokens seen, summed over batch rows."""
        return 0 if self.next_position is None else int(self.next_position.sum())

    def bytes_held(self) -> int:
        """Bytes of the store (keys, values, positions, levels, minima, scores, padding included)
        plus the field history kept for ``crop``."""
        hist = sum(f.numel() * f.element_size() for f in self._fields)
        return hist + (0 if self.store is None else self.store.bytes_held())

    def bytes_live(self) -> int:
        """Bytes of the kept keys alone (all store fields of the held slots)."""
        return 0 if self.store is None else self.store.bytes_live()
