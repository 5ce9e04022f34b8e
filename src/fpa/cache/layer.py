"""One layer's decoding state inside ``FPACache``: a transformers cache layer.

``LayerCache`` is the torch-only decoding state the attention layers call
(fpa.cache.store.state.LayerState: ``configure``, ``positions``, ``attend``; its keys live in a
paged per-head store, fpa.cache.store.storage, that the attention reads block by block,
fpa.cache.store.paged) made a transformers ``CacheLayerMixin`` (one per model layer inside
``FPACache``): sequence length and mask sizes for ``generate``, ``crop`` (assisted and
prompt-lookup decoding), beam-search reordering. The layers never call ``update``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from transformers.cache_utils import CacheLayerMixin
else:
    try:  # a transformers cache layer when transformers is installed (the models extra)
        from transformers.cache_utils import CacheLayerMixin
    except ImportError:  # pragma: no cover - core install: fpa.cache works without transformers
        CacheLayerMixin = object

from fpa.cache.store.state import LayerInfo, LayerState
from fpa.cache.store.storage import PAD_BIG
from fpa.ops.field import past_min_from_field

__all__ = ["LayerCache", "LayerInfo"]


class LayerCache(LayerState, CacheLayerMixin):
    """Decoding state of one attention layer (fpa.cache.store.state.LayerState) as a transformers
    cache layer.

    ``length`` is the logical sequence length transformers reads with ``get_seq_length`` (tokens
    seen, padding included). ``crop`` (assisted and prompt-lookup decoding) works while nothing
    was evicted: the cache keeps the field history (B, Hq, length) of FPA/FoX layers to rebuild
    the running minima.
    """

    is_compileable = False
    is_sliding = False
    supports_early_init = False

    def __init__(self, croppable: bool = True, block_size: int = 16):
        LayerState.__init__(self, croppable, block_size)
        self.is_initialized = False

    def configure(self, info: LayerInfo) -> None:
        """``LayerState.configure``, and mark the layer initialised for transformers."""
        super().configure(info)
        self.is_initialized = True

    # --- transformers CacheLayerMixin interface -------------------------------------------------
    # transformers declares keys / values as plain attributes; here they are read-only views
    @property
    def keys(self) -> Tensor | None:  # type: ignore[override]
        """(B, Hkv, C, D) a padded dense COPY of the stored keys (``store["valid"]`` tells which
        slots hold a key); for inspection only, decoding never builds it."""
        return None if self.store is None or "k" not in self.store else self.store["k"]

    @property
    def values(self) -> Tensor | None:  # type: ignore[override]
        """(B, Hkv, C, Dv) a padded dense COPY of the stored values, as ``keys``."""
        return None if self.store is None or "v" not in self.store else self.store["v"]

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        """Nothing to do: the store is created by ``configure`` on the layer's first call."""

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Not supported: FPA attention layers write with ``append``.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(
            "FPA attention layers write to their LayerCache with append(); "
            "an FPACache cannot serve a model that calls Cache.update"
        )

    def get_seq_length(self) -> int:
        """Tokens seen so far, padding included (not keys held)."""
        return self.length

    def get_mask_sizes(self, query_length: int | Tensor, *args: Any, **kwargs: Any) -> tuple[int, int]:
        """(kv_length, kv_offset) for a query of ``query_length`` tokens (transformers >= 5.3: an
        int; earlier: the cache_position tensor, of which only the shape is read)."""
        q = query_length if isinstance(query_length, int) else int(query_length.shape[-1])
        return self.length + q, 0

    def get_max_length(self) -> int:
        """-1: the cache has no maximum length."""
        return -1

    def get_max_cache_shape(self) -> int:
        """-1: the cache has no maximum shape."""
        return -1

    def offload(self) -> None:
        """Nothing: the paged store stays where it is."""

    def prefetch(self) -> None:
        """Nothing: the paged store stays where it is."""

    def reset(self) -> None:
        """Forget every token (the settings FPACache gave the layer stay)."""
        need_weights, chunk_policy = self.need_weights, self.chunk_policy
        LayerCache.__init__(self, self.is_croppable, self.block_size)
        self.need_weights, self.chunk_policy = need_weights, chunk_policy

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Select / reorder batch rows (beam search)."""
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep the batch rows ``indices`` ((n,) ids or a (B,) bool mask), in that order."""
        if self.store is None or self.next_position is None:
            return
        idx = torch.as_tensor(indices, device=self.next_position.device).reshape(-1)
        if idx.dtype == torch.bool:
            idx = idx.nonzero().reshape(-1)
        self.store.select_rows(idx)
        self.next_position = self.next_position.index_select(0, idx)
        if self.last_field is not None:
            self.last_field = self.last_field.index_select(0, idx.to(self.last_field.device))
        self._fields = [f.index_select(0, idx.to(f.device)) for f in self._fields]
        if self.key_carry is not None:
            self.key_carry = self.key_carry.index_select(0, idx.to(self.key_carry.device))
        self._raw_keys = [k.index_select(0, idx.to(k.device)) for k in self._raw_keys]

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times in place (row b becomes rows b * repeats ...)."""
        if self.next_position is not None:
            n = self.next_position.shape[0]
            self.batch_select_indices(torch.arange(n, device=self.next_position.device).repeat_interleave(repeats))

    def crop(self, n: int) -> None:
        """Forget the latest tokens: ``n < 0`` removes -n tokens (transformers >= 5.3 convention),
        ``n > 0`` keeps the first n (earlier versions), ``n == 0`` does nothing. Only while nothing
        was evicted (``is_croppable``: an FPACache without a policy)."""
        keep = self.length + n if n < 0 else (self.length if n == 0 else n)
        if keep >= self.length or self.store is None or self.next_position is None:
            return
        if not self.is_croppable:
            raise ValueError(
                "crop (assisted or prompt-lookup decoding) needs an FPACache without an eviction "
                "policy: evicted keys cannot be restored"
            )
        if keep <= 0:  # nothing left: the state of a new cache layer
            self.reset()
            return
        self.store.truncate(keep)  # slot i holds token i: nothing was evicted or compacted
        valid, pos = self.store["valid"][:, 0], self.store["pos"][:, 0].long()
        self.next_position = pos.masked_fill(~valid, -1).max(-1).values + 1
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
        if self._raw_keys:
            self._crop_key_carry(keep, valid)
        self.length = keep

    def _crop_key_carry(self, keep: int, valid: Tensor) -> None:
        """After a crop to ``keep`` > 0 tokens: the key-shift carry is the unshifted key of each row's
        latest real token among them (zero if none); valid (B, keep) marks the real ones."""
        raw = torch.cat(self._raw_keys, 2)[:, :, :keep]  # (B, Hkv, keep, D)
        self._raw_keys = [raw]
        B, Hkv, _, D = raw.shape
        slot = torch.where(valid, torch.arange(keep, device=valid.device), -1).max(-1).values  # (B,)
        last = raw.gather(2, slot.clamp(min=0).to(raw.device)[:, None, None, None].expand(B, Hkv, 1, D))[:, :, 0]
        self.key_carry = torch.where((slot >= 0).to(raw.device)[:, None, None], last, torch.zeros_like(last))
