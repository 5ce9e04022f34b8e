"""FPACache: the decoding cache of FPAForCausalLM (a transformers ``Cache``), with an optional
eviction policy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from torch import Tensor

if TYPE_CHECKING:
    from transformers.cache_utils import Cache
else:
    try:  # a transformers Cache when transformers is installed (the models extra)
        from transformers.cache_utils import Cache
    except ImportError:  # pragma: no cover - core install: fpa.cache works without transformers

        class Cache:
            """The part of transformers' Cache that FPACache uses."""

            def __init__(self, layer_class_to_replicate: type | None = None):
                self.layers = []


from fpa.cache.layer import LayerCache
from fpa.cache.policies import Policy, _ThresholdEviction
from fpa.checks import positive_int


class FPACache(Cache):
    """A transformers ``Cache`` made of one ``LayerCache`` per model layer, created lazily as the
    layers first use it; each (batch row, KV head) keeps its own keys (per-head eviction).

    Pass it as ``cache=`` to FPAForCausalLM.forward(..., use_cache=True) or to ``model.generate``
    (on transformers 5.2, which has no ``cache=`` yet, ``past_key_values=``: fpa.compat.CACHE_ARG is
    the installed name). After every forward call
    the model calls ``step_done()``, which applies the policy to every layer (policy=None keeps
    everything). ``get_seq_length()`` is the logical sequence length (tokens seen, padding
    included), not the keys held (``keys_held()``). Without a policy the cache can be cropped
    (assisted and prompt-lookup decoding). A cache remembers the model configuration that filled it
    and refuses a model with another one.

    Storage is paged (fpa.cache.store.storage): blocks of ``block_size`` keys per (row, KV head), so the
    bytes held follow the keys kept. ``peak_bytes`` is the largest ``bytes_held()`` seen so far,
    measured after each forward call and before the policy runs (the cache's high-water mark).
    """

    def __init__(self, policy: Policy | None = None, block_size: int = 16):
        if policy is not None and not isinstance(policy, Policy):
            raise ValueError(f"policy must be an fpa.cache policy (FPAEviction, TOVA, ...) or None, got {policy!r}")
        positive_int("block_size", block_size)
        super().__init__(layer_class_to_replicate=LayerCache)
        self.policy = policy
        self.block_size = block_size
        self.peak_bytes = 0
        self.model_signature: dict[str, Any] | None = None

    @property
    def layer_caches(self) -> list[LayerCache]:
        """The layers, as created by ``layer`` (transformers types ``layers`` as its own classes)."""
        return cast("list[LayerCache]", self.layers)

    def bind(self, signature: dict[str, Any]) -> None:
        """Remember the configuration of the model that fills this cache; refuse another."""
        if self.model_signature is None:
            self.model_signature = dict(signature)
        elif self.model_signature != dict(signature):
            diff = {
                k: (self.model_signature.get(k), v) for k, v in signature.items() if self.model_signature.get(k) != v
            }
            raise ValueError(
                f"this FPACache was filled by a model with another configuration "
                f"(field: (cache's, this model's) = {diff}); use a new FPACache for this model"
            )

    def layer(self, idx: int) -> LayerCache:
        """The LayerCache of layer ``idx``, created on first use."""
        layers = self.layer_caches
        while len(layers) <= idx:
            lc = LayerCache(croppable=self.policy is None, block_size=self.block_size)
            lc.need_weights = self.policy is not None and self.policy.needs_weights
            if isinstance(self.policy, _ThresholdEviction) and self.policy.within_chunks:
                lc.chunk_policy = self.policy  # fpa_cached applies its threshold inside each call
            layers.append(lc)
        return layers[idx]

    @property
    def is_compileable(self) -> bool:
        """False: the cache's storage grows and is compacted in Python (no torch.compile)."""
        return False

    @property
    def is_linear(self) -> list[bool]:
        """Per layer, whether the state is a fixed-size recurrent one (transformers' generate asks): no."""
        return [False] * max(1, len(self.layers))

    @property
    def is_croppable(self) -> bool:
        """Whether ``crop`` works: only without a policy (evicted keys cannot be restored)."""
        return self.policy is None

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens seen so far, padding included (not keys held)."""
        layers = self.layer_caches
        return layers[layer_idx].length if layer_idx < len(layers) else 0

    def next_position(self) -> Tensor | None:
        """(B,) position of the next real token of every row (None before the first call)."""
        layers = self.layer_caches
        return layers[0].next_position if layers else None

    def crop(self, max_length: int) -> None:
        """Forget the latest tokens (see LayerCache.crop: n < 0 removes -n, n > 0 keeps n)."""
        for lc in self.layer_caches:
            lc.crop(max_length)

    def step_done(self) -> None:
        """Apply the policy to every layer (after a forward call) and update its kept_fraction.

        Reads no device value (no host sync) but where a layer's store reclaims evicted slots,
        once every ``block_size`` tokens (``PagedStore.evict``)."""
        self.peak_bytes = max(self.peak_bytes, self.bytes_held())
        if self.policy is not None:
            for lc in self.layer_caches:
                self.policy.check_layer(lc)
                lc.configured()[0].evict(self.policy.keep_mask(lc))
            self.policy.record(*self._held_and_seen_tensors())

    def _held_and_seen_tensors(self) -> tuple[Tensor | int, Tensor | int]:
        """``held_and_seen`` as 0-dim tensors on the cache's device (nothing read back)."""
        held: Tensor | int = 0
        seen: Tensor | int = 0
        for lc in self.layer_caches:
            if lc.store is not None and lc.store.pool and lc.next_position is not None:
                held = held + lc.store.pool["valid"].sum()
                seen = seen + lc.next_position.sum() * lc.store.Hkv
        return held, seen

    def held_and_seen(self) -> tuple[int, int]:
        """(keys held, keys seen), each summed over layers, batch rows and KV heads (padding
        tokens are not keys). Reads them from the device (a host sync on an accelerator)."""
        held, seen = self._held_and_seen_tensors()
        return int(held), int(seen)

    def kept_fraction(self) -> float:
        """Keys held / keys seen, summed over layers, rows and KV heads (see fpa.cache.policies)."""
        held, seen = self.held_and_seen()
        return held / seen if seen else float("nan")

    def keys_held(self) -> list[Tensor]:
        """Per layer, (B, Hkv) int64 keys held."""
        return [lc.counts() for lc in self.layer_caches]

    def bytes_held(self) -> int:
        """Bytes of every tensor the cache holds (keys, values, positions, levels, minima, scores),
        holes, partly filled and free blocks and the block tables included, and without a policy
        the field history kept for ``crop``."""
        return sum(lc.bytes_held() for lc in self.layer_caches)

    def bytes_live(self) -> int:
        """Bytes the kept keys alone take (every stored field of the held slots, no holes, no free
        room, no metadata). bytes_held() <= 1.15 bytes_live() + a fixed allowance per layer
        (``LayerCache.store.overhead_bound()``; plus the field history without a policy)."""
        return sum(lc.bytes_live() for lc in self.layer_caches)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Select / reorder the batch rows of every layer (beam search): (n,) row ids."""
        for lc in self.layer_caches:
            lc.reorder_cache(beam_idx)
