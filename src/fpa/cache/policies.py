"""Eviction policies: the model's own rule (FPAEviction, FoXEviction) and budget baselines.

A policy is applied by FPACache after every forward call (a prefill chunk or a decode step),
layer by layer: ``keep_mask(layer)`` returns (N, P) bool in the paged store's pool layout
(fpa.cache.store.storage), True for the slots to keep. The threshold rules work on the pool directly;
the budget policies rank a padded (B, Hkv, C) copy of their scalar score (``score(layer)``, in the
order of ``layer.store[...]``) and map the kept slots back with ``store.from_dense``.

Grouped-query attention: a KV head's key is shared by ``groups`` query heads. The threshold
rules evict it only when EVERY query head of its group agrees (each one's penalty exceeds the
threshold); budget policies score keys per KV head (TOVA/H2O average / sum the weights of the
group's query heads). With num_kv_heads == num_heads this is simply per head.

``kept_fraction`` (read-only): after the latest application, the keys held divided by the keys
seen, where both are summed over layers, batch rows and KV heads. Every (layer, row, KV head)
has seen the same number of tokens, so this is also the plain mean over layers, rows and KV heads
of held / seen. NaN before the first application. A policy object reports the last cache it
was applied to; use one policy per cache. The counts stay on the device until it is read.

Host syncs: computing a keep mask reads no device value (every size comes from the store's host
copies of its fills); the store then reclaims the evicted slots once every ``block_size`` tokens
(fpa.cache.store.storage), which reads a few values then.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fpa.cache.layer import LayerCache
from fpa.cache.store.storage import PagedStore
from fpa.checks import check_number, non_negative_int, positive_int


class Policy:
    """Base: ``name``, ``needs_weights`` (TOVA/H2O) and the achieved ``kept_fraction``."""

    name = "policy"
    needs_weights = False

    def __init__(self) -> None:
        self._held: Tensor | int = 0
        self._seen: Tensor | int = 0

    @property
    def kept_fraction(self) -> float:
        """Keys held / keys seen after the latest application (NaN before the first one)."""
        held, seen = int(self._held), int(self._seen)
        return held / seen if seen else float("nan")

    def record(self, held: Tensor | int, seen: Tensor | int) -> None:
        """Remember the keys held and seen (ints, or 0-dim tensors read only by ``kept_fraction``)."""
        self._held, self._seen = held, seen

    def check_layer(self, layer: LayerCache) -> None:
        """Raise ValueError if this policy cannot run on the layer's attention type."""

    def keep_mask(self, layer: LayerCache) -> Tensor:  # pragma: no cover - abstract
        """(N, P) bool in the layer's pool layout: True for the slots to keep."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


def _check_threshold(threshold: object) -> float:
    return check_number("threshold", threshold, low=0, what="math.inf keeps everything", finite=False)


def penalties(layer: LayerCache) -> Tensor:
    """(N, P, G) pool layout: beta_h * max(0, level_j - m_j), the penalty every later query of
    query head h (the g-th of its KV head's group) gives key j at least."""
    st, info = layer.configured()
    if info.beta is None:
        raise ValueError(f"a {info.kind!r} layer reports no beta: its keys have no penalty")
    beta = info.beta.float().to(st.owner.device).reshape(-1, info.groups)  # (Hkv, G)
    b = beta[st.block_rows() % st.Hkv]  # (N, G)
    return b[:, None, :] * torch.relu(st.pool["level"] - st.pool["pm"])


def group_all(x: Tensor) -> Tensor:
    """(N, P, G) bool -> (N, P): True where every query head of the KV head's group is True."""
    return x.all(-1)


class _ThresholdEviction(Policy):
    """A threshold rule. ``within_chunks=True`` also applies it inside each forward call: query i
    of a multi-token call (a prefill chunk) does not see a key the rule would have evicted after
    query i - 1 had the tokens come one by one, so chunked prefill computes exactly what
    token-by-token decoding under the rule does (and what ``fpa train --evict-threshold`` trains). The
    default evicts after each call only (keys evicted within a chunk stay visible to it)."""

    kind = ""

    def __init__(self, threshold: float, within_chunks: bool = False):
        super().__init__()
        self.threshold = _check_threshold(threshold)
        if not isinstance(within_chunks, bool):
            raise ValueError(f"within_chunks must be a bool, got {within_chunks!r}")
        self.within_chunks = within_chunks

    def check_layer(self, layer: LayerCache) -> None:
        """Raise ValueError unless the layer's attention is this rule's kind."""
        kind = layer.configured()[1].kind
        if kind != self.kind:
            raise ValueError(f"{type(self).__name__} needs a model with attention={self.kind!r}, got a {kind!r} layer")

    def effective_threshold(self, layer: LayerCache) -> float:
        """The threshold applied to ``layer``'s penalties."""
        return self.threshold

    def keep_mask(self, layer: LayerCache) -> Tensor:
        """(N, P) bool: False where every query head of the group has a penalty above the threshold."""
        evict = penalties(layer) > self.effective_threshold(layer)
        return ~group_all(evict)


class FPAEviction(_ThresholdEviction):
    """Evict key j for good once beta * max(0, level_j - m_j) > threshold (P1: it only grows).

    certified=True needs qk-norm and uses threshold + 2c, where c bounds every content logit:
    with per-head RMS norm, ||q|| <= sqrt(D) max|w_q| and ||k|| <= sqrt(D) max|w_k| (w the norm
    weights; the normalised vector has RMS <= 1), so |scale <q, k>| <= c = scale * D * max|w_q| *
    max|w_k|. An evicted key then has logit < c - (tau + 2c) = -c - tau, while the query's own key
    (penalty 0) has logit >= -c: its weight is < e^-tau times the best live key's, now and later.
    In walk mode with threshold 0 the evicted keys are exactly the stack pops of P3 (every key whose
    level lies above the new field value); for threshold > 0 the same rule is applied as is.
    """

    kind = "fpa"

    def __init__(self, threshold: float, certified: bool = False, within_chunks: bool = False):
        super().__init__(threshold, within_chunks)
        if not isinstance(certified, bool):
            raise ValueError(f"certified must be a bool, got {certified!r}")
        self.certified = certified
        extra = (", certified" if certified else "") + (", within chunks" if within_chunks else "")
        self.name = f"fpa(threshold={self.threshold:g}{extra})"

    def check_layer(self, layer: LayerCache) -> None:
        """Raise ValueError unless the layer is FPA (and, if certified, has qk-norm)."""
        super().check_layer(layer)
        self.effective_threshold(layer)

    def effective_threshold(self, layer: LayerCache) -> float:
        """The threshold, plus 2c if certified (c: the layer's bound on content logits)."""
        if not self.certified:
            return self.threshold
        bound = layer.configured()[1].content_bound
        if bound is None:
            raise ValueError(
                "FPAEviction(certified=True) needs a model with qk_norm=True "
                "(the bound on content logits comes from the qk-norm weights)"
            )
        return self.threshold + 2 * bound


class FoXEviction(_ThresholdEviction):
    """FoX's decay as the penalty: evict key j once -sum_{j<u<=now} log f_u > threshold (P2)."""

    kind = "fox"

    def __init__(self, threshold: float, within_chunks: bool = False):
        super().__init__(threshold, within_chunks)
        self.name = f"fox(threshold={self.threshold:g}{', within chunks' if within_chunks else ''})"


def _check_budget(budget: object) -> int:
    return positive_int("budget", budget, "keys kept per head")


def _check_part(name: str, value: object, budget: int) -> int:
    what = f"at most budget={budget}"
    n = non_negative_int(name, value, what)
    if n > budget:
        raise ValueError(f"{name} must be a non-negative int ({what}), got {value!r}")
    return n


def pinned(score: Tensor, always: Tensor) -> Tensor:
    """The score as float, +inf where ``always`` (slots a policy keeps regardless of score)."""
    score = score.float()
    return torch.where(always, torch.full_like(score, float("inf")), score)


def top_k_keep(score: Tensor, valid: Tensor, budget: int) -> Tensor:
    """(B, Hkv, C) bool: the ``budget`` valid slots of highest score per head (all if fewer)."""
    k = min(budget, score.shape[-1])
    s = score.float().masked_fill(~valid, float("-inf"))
    keep = torch.zeros_like(valid)
    keep.scatter_(-1, s.topk(k, dim=-1).indices, True)
    return keep & valid


def _store(layer: LayerCache) -> PagedStore:
    """The layer's paged store (ValueError if the layer never ran)."""
    return layer.configured()[0]


class _BudgetPolicy(Policy):
    """Keep the ``budget`` valid keys of highest ``score`` per (row, KV head)."""

    def __init__(self, budget: int):
        super().__init__()
        self.budget = _check_budget(budget)

    def score(self, layer: LayerCache) -> Tensor:  # pragma: no cover - abstract
        """(B, Hkv, C) per-slot score in the order of ``layer.store[...]`` (higher is kept first)."""
        raise NotImplementedError

    def keep_mask(self, layer: LayerCache) -> Tensor:
        """(N, P) bool: the ``budget`` valid slots of highest score per (row, KV head)."""
        st = _store(layer)
        return st.from_dense(top_k_keep(self.score(layer), st["valid"], self.budget))


class SlidingWindow(_BudgetPolicy):
    """Keep the last ``budget`` tokens."""

    def __init__(self, budget: int):
        super().__init__(budget)
        self.name = f"window(N={self.budget})"

    def score(self, layer: LayerCache) -> Tensor:
        """The position: the newest keys score highest."""
        return _store(layer)["pos"]


class StreamingLLM(_BudgetPolicy):
    """Keep the first ``sinks`` tokens (attention sinks) and the last ``budget - sinks``."""

    def __init__(self, budget: int, sinks: int = 4):
        super().__init__(budget)
        self.sinks = _check_part("sinks", sinks, self.budget)
        self.name = f"streamingllm(N={self.budget}, sinks={sinks})"

    def score(self, layer: LayerCache) -> Tensor:
        """The position, +inf for the first ``sinks`` positions."""
        pos = _store(layer)["pos"]
        return pinned(pos, pos < self.sinks)


class TOVA(_BudgetPolicy):
    """Keep the ``budget`` keys with the highest attention weight from the current (last) query,
    the weights averaged over the query heads of each KV head."""

    needs_weights = True

    def __init__(self, budget: int):
        super().__init__(budget)
        self.name = f"tova(N={self.budget})"

    def score(self, layer: LayerCache) -> Tensor:
        """The last query's attention weight (mean over the KV head's query heads)."""
        return _store(layer)["last"]


class H2O(_BudgetPolicy):
    """Heavy hitters + recent: always keep the last ``recent`` tokens, fill the rest of the budget
    with the keys of highest attention weight accumulated over every query since they arrived
    (summed over the query heads of each KV head). Default recent = budget // 2."""

    needs_weights = True

    def __init__(self, budget: int, recent: int | None = None):
        super().__init__(budget)
        self.recent = _check_part("recent", self.budget // 2 if recent is None else recent, self.budget)
        self.name = f"h2o(N={self.budget}, recent={self.recent})"

    def score(self, layer: LayerCache) -> Tensor:
        """The accumulated attention weight, +inf for the last ``recent`` positions."""
        st = _store(layer)
        if layer.next_position is None:
            raise ValueError("H2O needs a layer that holds tokens")
        return pinned(st["score"], st["pos"] >= layer.next_position[:, None, None] - self.recent)
