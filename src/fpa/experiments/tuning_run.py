"""The tuning preset's second half: select each core arm's configuration from the validation
stages; for the arms trained without a rule, sweep the selected configuration's own eviction rule
and select its inference threshold (fpa.experiments.tuning); a rule-trained arm keeps its
configuration's training threshold."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fpa.experiments.methods import INFERENCE_RULE_ARMS
from fpa.experiments.presets import ReproducePreset
from fpa.experiments.stages import Stages
from fpa.experiments.tuning import config_rows, select_config, select_threshold


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
