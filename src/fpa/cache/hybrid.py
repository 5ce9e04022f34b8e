"""A threshold rule with a per-head budget on what it keeps.

The model's own rule (FPAEviction, FoXEviction) frees the keys of the heads that forget, but a
head that keeps every key live (a "global" head: its penalties stay near 0) is left whole, so
the kept fraction of the rule is set by how many heads stay global. ``RuleThenBudget`` applies
the rule first and then caps every head at a budget, ranking the rule's survivors with a budget
policy's score (H2O's accumulated attention, TOVA's last attention, or recency): the heads that
forget hold what the rule keeps (usually far below the cap), the global heads hold the cap.
"""

from __future__ import annotations

from torch import Tensor

from fpa.cache.layer import LayerCache
from fpa.cache.policies import Policy, _BudgetPolicy, top_k_keep


class RuleThenBudget(Policy):
    """Keep a key iff ``rule`` keeps it and it is among the ``budget_policy.budget`` survivors of
    highest ``budget_policy.score`` in its KV head."""

    def __init__(self, rule: Policy, budget_policy: Policy):
        super().__init__()
        if not isinstance(budget_policy, _BudgetPolicy):
            raise ValueError(
                f"budget_policy must be a budget policy (SlidingWindow, StreamingLLM, TOVA, H2O), got {budget_policy!r}"
            )
        if getattr(rule, "within_chunks", False):
            raise ValueError(
                f"rule must apply its threshold between calls (within_chunks=False): the cache runs a "
                f"within-chunks rule inside the attention, which a combined policy cannot; got {rule!r}"
            )
        self.rule, self.budget_policy = rule, budget_policy
        self.needs_weights = rule.needs_weights or budget_policy.needs_weights
        self.name = f"{rule.name}+{budget_policy.name}"

    def check_layer(self, layer: LayerCache) -> None:
        """Raise ValueError if either policy cannot run on the layer."""
        self.rule.check_layer(layer)
        self.budget_policy.check_layer(layer)

    def keep_mask(self, layer: LayerCache) -> Tensor:
        """(N, P) bool, pool layout (see fpa.cache.policies)."""
        st = layer.configured()[0]
        survivors = st.to_dense(self.rule.keep_mask(layer) & st.pool["valid"], False).view(st["valid"].shape)
        return st.from_dense(top_k_keep(self.budget_policy.score(layer), survivors, self.budget_policy.budget))
