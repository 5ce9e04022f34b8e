"""KV-cache policies by short name, for the evaluations.

Budget policies (window, StreamingLLM, TOVA, H2O) keep ``budget = round(fraction * prompt
length)`` keys per head. Threshold policies (the model's own rule: FPAEviction for FPA,
FoXEviction for FoX) have no budget: they are evaluated at fixed thresholds and report the kept
fraction they achieve (fpa.eval.curves).
"""

from __future__ import annotations

BUDGET_POLICIES = ("window", "streamingllm", "tova", "h2o")
THRESHOLD_POLICIES = {"fpa": "fpa", "fox": "fox"}  # attention type -> its own rule
# the own rule applied inside each prefill chunk too (within_chunks=True): for models trained under it
WITHIN_SUFFIX = "-within"
THRESHOLD_RULES = tuple(THRESHOLD_POLICIES.values()) + tuple(p + WITHIN_SUFFIX for p in THRESHOLD_POLICIES.values())
# "<own rule>+<budget policy>": the own rule at a threshold, then a per-head budget on its survivors
HYBRID_BUDGETS = ("h2o", "tova", "window")


def hybrids_for(attention: str) -> list[str]:
    """The hybrid policies of a model with this attention type ([] without an own rule)."""
    own = THRESHOLD_POLICIES.get(attention)
    return [f"{own}+{b}" for b in HYBRID_BUDGETS] if own else []


def policies_for(attention: str) -> list[str]:
    """The policies that apply to a model with this attention type: its own rule (if any) first."""
    own = [THRESHOLD_POLICIES[attention]] if attention in THRESHOLD_POLICIES else []
    return own + list(BUDGET_POLICIES)


def make_policy(name: str, *, budget: int | None = None, threshold: float | None = None):
    """An fpa.cache policy object from its short name and its budget or threshold."""
    from fpa.cache import H2O, TOVA, FoXEviction, FPAEviction, SlidingWindow, StreamingLLM

    budget_cls = {"window": SlidingWindow, "streamingllm": StreamingLLM, "tova": TOVA, "h2o": H2O}
    if name in budget_cls:
        if budget is None:
            raise ValueError(f"budget is required for policy {name!r}")
        return budget_cls[name](budget=int(budget))
    if name in THRESHOLD_RULES:
        if threshold is None:
            raise ValueError(f"threshold is required for policy {name!r}")
        rule = name.removesuffix(WITHIN_SUFFIX)
        return (FPAEviction if rule == "fpa" else FoXEviction)(
            threshold=float(threshold), within_chunks=name.endswith(WITHIN_SUFFIX)
        )
    if "+" in name:
        from fpa.cache.hybrid import RuleThenBudget

        own, budget_name = name.split("+", 1)
        if own not in THRESHOLD_POLICIES or budget_name not in HYBRID_BUDGETS:
            raise ValueError(
                f"a hybrid policy is <own rule>+<budget>, own in {tuple(THRESHOLD_POLICIES)} and budget in "
                f"{HYBRID_BUDGETS}, got {name!r}"
            )
        return RuleThenBudget(make_policy(own, threshold=threshold), make_policy(budget_name, budget=budget))
    raise ValueError(
        f"policy must be one of {BUDGET_POLICIES + THRESHOLD_RULES} or a hybrid such as 'fpa+h2o', got {name!r}"
    )


def budget_for(fraction: float, length: int) -> int:
    """Keys per head for a budget policy at ``fraction`` of a ``length``-token prompt (>= 1)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    return max(1, int(round(fraction * length)))
