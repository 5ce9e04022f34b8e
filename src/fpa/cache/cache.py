"""FPACache: the decoding cache of FPAForCausalLM, with an optional eviction policy."""

from __future__ import annotations

from torch import Tensor

from fpa.cache.layer import LayerCache
from fpa.cache.policies import Policy


class FPACache:
    """Per-layer decoding state (LayerCache), allocated lazily as layers first use it.

    Pass it as ``past_key_values=`` to FPAForCausalLM.forward(..., use_cache=True) or to
    ``model.generate``. After every forward call the model calls ``step_done()``, which applies the
    policy to every layer (policy=None keeps everything).
    """

    is_compileable = False  # read by transformers' generate

    def __init__(self, policy: Policy | None = None):
        if policy is not None and not isinstance(policy, Policy):
            raise ValueError(f"policy must be an fpa.cache policy (FPAEviction, TOVA, ...) or None, got {policy!r}")
        self.policy = policy
        self.layers: list[LayerCache] = []

    def layer(self, idx: int) -> LayerCache:
        """The LayerCache of layer ``idx``, created on first use."""
        while len(self.layers) <= idx:
            lc = LayerCache()
            lc.need_weights = self.policy is not None and self.policy.needs_weights
            self.layers.append(lc)
        return self.layers[idx]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def is_linear(self) -> list[bool]:
        """Per layer, whether the state is a fixed-size recurrent one (transformers' generate asks): no."""
        return [False] * max(1, len(self.layers))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens seen so far (not keys held)."""
        return self.layers[layer_idx].length if layer_idx < len(self.layers) else 0

    def step_done(self) -> None:
        """Apply the policy to every layer (after a forward call) and update its kept_fraction."""
        if self.policy is not None:
            for lc in self.layers:
                self.policy.check_layer(lc)
                lc.store.evict(self.policy.keep_mask(lc))
            self.policy.record(*self.held_and_seen())

    def held_and_seen(self) -> tuple[int, int]:
        """(keys held, keys seen), each summed over layers, batch rows and KV heads."""
        held = sum(int(lc.counts().sum()) for lc in self.layers)
        seen = sum(lc.length * lc.counts().numel() for lc in self.layers)
        return held, seen

    def kept_fraction(self) -> float:
        """Keys held / keys seen, summed over layers, rows and KV heads (see fpa.cache.policies)."""
        held, seen = self.held_and_seen()
        return held / seen if seen else float("nan")

    def keys_held(self) -> list[Tensor]:
        """Per layer, (B, Hkv) int64 keys held."""
        return [lc.counts() for lc in self.layers]

    def bytes_held(self) -> int:
        """Bytes of every tensor the cache holds (keys, values, positions, levels, minima, scores),
        padding slots included."""
        return sum(lc.bytes_held() for lc in self.layers)

    def bytes_live(self) -> int:
        """Bytes the kept keys alone take (no padding, no reserve): what a flat variable-length
        layout would hold. bytes_held() - bytes_live() is the cost of per-head padding."""
        return sum(lc.bytes_live() for lc in self.layers)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        for lc in self.layers:
            if lc.store is not None:
                lc.store.select_rows(beam_idx)
            if lc.last_field is not None:
                lc.last_field = lc.last_field.index_select(0, beam_idx.to(lc.last_field.device))
