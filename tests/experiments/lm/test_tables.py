"""Report tables: the eviction table's lossless column for plain and rule-served arms."""

from __future__ import annotations

from fpa.experiments.lm.tables import eviction_table


def _arm(served: dict | None) -> dict:
    by = {
        "kept_fraction": [0.2, 0.3],
        "accuracy": [1.0, 0.5],
        "full_accuracy": [1.0, 1.0],
        "window_accuracy": [0.0, 0.0],
        "lossless": [True, False],
    }
    return {
        "role": "core",
        "served": served,
        "eviction": {
            "threshold": 2.0,
            "by_multiple": {"8": by},
            "growth": {"lengths": [1024, 2048], "kept_keys": [100.0, 200.0]},
            "keys_growth_exponent": 1.0,
            "keys_growth_exponent_by_seed": [1.0, 1.0],
        },
    }


def test_lossless_is_counted_for_a_plain_arm_and_not_for_one_served_under_its_rule():
    rule = {"attention": "fpa", "threshold": 2.0}
    table = eviction_table({"methods": {"plain": _arm(None), "trained": _arm(rule)}})
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if "| 8x |" in line}
    assert rows["plain"].rstrip().endswith("| 1/2 |")
    # under its rule "as served" is the rule itself: a count would be met by construction
    assert rows["trained"].rstrip().endswith("| served under the rule |")
