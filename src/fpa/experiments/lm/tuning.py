"""The tuning preset's selection, from validation figures only (tuning seeds, validation prompts and
the tuning half of the held-out split; nothing the reported run measures).

Configuration, per core arm: the highest validation passkey score (mean accuracy over every
length, 1x to the longest, averaged over tuning seeds); within ``SCORE_TIE`` of the best, the lowest
validation loss. Inference eviction threshold, for the selected configuration of an arm trained
without a rule: its own eviction rule is swept on validation prompts (the "sweep" stages) and the
smallest threshold whose validation accuracy, averaged over seeds and lengths, is within
``tolerance`` of the full cache's is selected. An arm trained under a rule keeps its training
threshold (a configuration of the grid).

``finish_tuning`` runs this after the validation stages; ``config_rows``, ``select_config`` and
``select_threshold`` are the rules alone, free of stages.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fpa.experiments.lm.methods import INFERENCE_RULE_ARMS
from fpa.experiments.lm.presets import ReproducePreset
from fpa.experiments.stages import Stages

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


def finish_tuning(
    p: ReproducePreset,
    runs: list[dict],
    trained: dict,
    evaluated: dict,
    stages: Stages,
    jobs: int,
    progress: bool,
    task: Callable,
    run_id: Callable[[dict], str],
) -> dict:
    """The tuning results dict: {"kind": "tuning", "preset", "tuning": {"seeds", "rows", "selected", "rule"}}."""
    from fpa.experiments.pool import run_tasks

    specs = list(dict.fromkeys(r["spec"].name for r in runs))
    spec_of = {r["spec"].name: r["spec"] for r in runs}
    validation = {
        name: [{**evaluated[f"validation-{run_id(r)}"], "seed": r["seed"]} for r in runs if r["spec"].name == name]
        for name in specs
    }
    for name in specs:
        for v, r in zip(validation[name], [r for r in runs if r["spec"].name == name]):
            t = trained[f"train-{run_id(r)}"]
            v["train_val_loss"], v["task_loss_curve"] = t.get("val_loss"), t.get("task_loss_curve")
    rows = config_rows([spec_of[n].to_dict() for n in specs], validation)
    arms = list(dict.fromkeys(spec_of[n].arm for n in specs))
    selected = {}
    for arm in arms:
        row = select_config(rows, arm)
        spec = spec_of[row["name"]]
        selected[arm] = {
            "config": row["name"],
            "label": row["name"][len(arm) + 1 : -1] if "[" in row["name"] else "",
            "score": row["score"],
            "val_loss": row["val_loss"],
            "training_threshold": spec.training_threshold,
        }
    sweep_runs = [
        r for r in runs if r["spec"].arm in INFERENCE_RULE_ARMS and r["spec"].name == selected[r["spec"].arm]["config"]
    ]
    sweeps = run_tasks(stages, [task("sweep", r) for r in sweep_runs], jobs, progress, desc="sweep threshold")
    for arm in arms:
        if arm not in INFERENCE_RULE_ARMS:
            continue
        mine = [r for r in sweep_runs if r["spec"].arm == arm]
        per_seed = [sweeps[f"sweep-{run_id(r)}"]["points"] for r in mine]
        mean_points = [
            {
                "threshold": per_seed[0][i]["threshold"],
                "accuracy_by_length": np.mean([s[i]["accuracy_by_length"] for s in per_seed], 0).tolist(),
                "kept_by_length": np.mean([s[i]["kept_by_length"] for s in per_seed], 0).tolist(),
            }
            for i in range(len(per_seed[0]))
        ]
        full = next(r for r in rows if r["name"] == selected[arm]["config"])["val_passkey_by_length"]
        selected[arm]["eviction"] = {
            **select_threshold(full, mean_points, p.threshold_tolerance),
            "sweep": mean_points,
            "tolerance": p.threshold_tolerance,
        }
    return {
        "kind": "tuning",
        "preset": p.to_dict(),
        "train_len": p.train_len,
        "tuning": {
            "seeds": list(p.tuning_seeds),
            "rows": rows,
            "selected": selected,
            "rule": {
                "config": "per core arm, highest mean validation passkey accuracy over 1x-"
                f"{max(p.passkey_multiples)}x (seeds averaged, as served: a rule-trained configuration "
                "under its rule); within 0.01 of the best, lowest validation loss",
                "threshold": "arms trained without a rule: smallest inference threshold whose mean validation "
                f"accuracy is within {p.threshold_tolerance:g} of the full cache's; a rule-trained arm: its "
                "configuration's training threshold",
            },
        },
    }
