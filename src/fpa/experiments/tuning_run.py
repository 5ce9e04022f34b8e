"""The tuning preset's second half: select each base method's configuration from the validation
stages, sweep the selected configuration's own eviction rule, select its tau (fpa.experiments.tuning)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fpa.experiments.presets import ReproducePreset
from fpa.experiments.stages import Stages
from fpa.experiments.tuning import config_rows, select_config, select_tau

OWN_RULE_BASES = ("fpa-walk", "fox")


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
    """The tuning results dict: {"kind": "tuning", "preset", "tuning": {"seeds", "rows", "selected"}}."""
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
    bases = list(dict.fromkeys(spec_of[n].base for n in specs))
    selected = {}
    for base in bases:
        row = select_config(rows, base)
        selected[base] = {
            "config": row["name"],
            "label": row["name"][len(base) + 1 : -1] if "[" in row["name"] else "",
            "score": row["score"],
            "val_loss": row["val_loss"],
        }
    sweep_runs = [
        r for r in runs if r["spec"].base in OWN_RULE_BASES and r["spec"].name == selected[r["spec"].base]["config"]
    ]
    sweeps = run_tasks(stages, [task("sweep", r) for r in sweep_runs], jobs, progress, desc="sweep tau")
    for base in bases:
        if base not in OWN_RULE_BASES:
            continue
        mine = [r for r in sweep_runs if r["spec"].base == base]
        per_seed = [sweeps[f"sweep-{run_id(r)}"]["points"] for r in mine]
        mean_points = [
            {
                "tau": per_seed[0][i]["tau"],
                "accuracy_by_length": np.mean([s[i]["accuracy_by_length"] for s in per_seed], 0).tolist(),
                "kept_by_length": np.mean([s[i]["kept_by_length"] for s in per_seed], 0).tolist(),
            }
            for i in range(len(per_seed[0]))
        ]
        full = next(r for r in rows if r["name"] == selected[base]["config"])["val_passkey_by_length"]
        selected[base]["eviction"] = {
            **select_tau(full, mean_points, p.tau_tolerance),
            "sweep": mean_points,
            "tolerance": p.tau_tolerance,
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
                "config": "highest mean validation passkey accuracy over 1x-"
                f"{max(p.passkey_multiples)}x (seeds averaged); within 0.01 of the best, "
                "lowest validation loss",
                "tau": f"smallest tau whose mean validation accuracy is within {p.tau_tolerance:g} of the full cache's",
            },
        },
    }
