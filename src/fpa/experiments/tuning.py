"""The tuning stage's choices, from validation figures only (tuning seeds, validation prompts and
the tuning half of the held-out split; nothing the reported run measures).

Configuration, per base method: the highest validation passkey score (mean accuracy over every
length, 1x to the longest, averaged over tuning seeds); within ``SCORE_TIE`` of the best, the lowest
validation loss. Inference eviction threshold, for the selected configuration of an arm trained
without a rule: the smallest threshold whose validation accuracy, averaged over seeds and lengths,
is within ``tolerance`` of the full cache's. An arm trained under a rule keeps its training
threshold (a configuration of the grid).
"""

from __future__ import annotations

import numpy as np

SCORE_TIE = 0.01


def config_rows(specs: list[dict], validation: dict[str, list[dict]]) -> list[dict]:
    """One row per configuration: {"name", "base", "model", "train", "seeds", "val_loss",
    "val_passkey_by_length" (mean over seeds), "val_passkey_by_seed" (per seed, per length),
    "score"}. ``validation[name]`` lists the "validation" stage outputs of its seeds."""
    rows = []
    for s in specs:
        vals = validation[s["name"]]
        by_seed = [v["passkey"]["accuracy_by_length"] for v in vals]
        by_len = np.mean(by_seed, 0)
        rows.append(
            {
                **s,
                "seeds": [v["seed"] for v in vals],
                "val_loss": float(np.mean([v["loss"]["loss"] for v in vals])),
                "val_loss_by_seed": [v["loss"]["loss"] for v in vals],
                "val_passkey_by_length": by_len.tolist(),
                "val_passkey_by_seed": by_seed,
                "score": float(by_len.mean()),
            }
        )
    return rows


def select_config(rows: list[dict], arm: str) -> dict:
    """The selected row among the configurations of core arm ``arm`` (a row's "arm", else its
    "base"; see the module docstring)."""
    mine = [r for r in rows if (r.get("arm") or r["base"]) == arm]
    if not mine:
        raise ValueError(f"no tuning configuration of arm {arm!r}")
    best = max(r["score"] for r in mine)
    near = [r for r in mine if r["score"] >= best - SCORE_TIE]
    return min(near, key=lambda r: r["val_loss"])


def select_threshold(full_by_length: list[float], sweeps: list[dict], tolerance: float) -> dict:
    """The smallest threshold whose mean validation accuracy is within ``tolerance`` of the full cache's.

    full_by_length: mean full-cache accuracy per length (over seeds). sweeps: per threshold
    {"threshold", "accuracy_by_length", "kept_by_length"} averaged over seeds. Returns
    {"threshold", "accuracy", "full_accuracy", "kept", "within"} (the largest threshold if none
    is within tolerance, with "within": False)."""
    full = float(np.mean(full_by_length))
    pts = sorted(sweeps, key=lambda s: s["threshold"])
    ok = [s for s in pts if np.mean(s["accuracy_by_length"]) >= full - tolerance]
    pick = ok[0] if ok else pts[-1]
    return {
        "threshold": pick["threshold"],
        "accuracy": float(np.mean(pick["accuracy_by_length"])),
        "full_accuracy": full,
        "kept": float(np.mean(pick["kept_by_length"])),
        "within": bool(ok),
    }
