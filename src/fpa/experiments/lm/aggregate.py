"""Stage outputs of a reported ``fpa reproduce`` preset -> the results dict: every seed's own
figures, means with min and max, the eviction tables and the paired analysis of the core arms.

"As served": a model trained without a rule with the full cache; a model trained under a
threshold rule under that rule (fpa.experiments.lm.train_eval.served_rule). "Own rule": each core
arm's threshold rule at its frozen threshold (a rule-trained arm's is its training rule).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fpa.experiments.lm.analysis import paired
from fpa.experiments.lm.methods import CONTROL, RULE_ARM
from fpa.experiments.lm.presets import ReproducePreset

LOSSLESS_FULL = 0.9  # "lossless" is only judged where the full cache itself reaches this
# the paired comparisons of the core arms, each (a, b) reported as a - b
PAIRS = ((RULE_ARM, "fox"), ("fpa-walk", "fox"), (RULE_ARM, "fpa-walk"))


def _spread(values) -> dict:
    v = np.asarray([x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))], float)
    if v.size == 0:
        return {"mean": math.nan, "min": math.nan, "max": math.nan}
    return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}


def _by_multiple(values: list[float], p: ReproducePreset) -> dict[str, float]:
    return {str(m): float(v) for m, v in zip(p.passkey_multiples, values)}


def _seed_entry(p: ReproducePreset, r: dict, trained: dict, evaluated: dict, rid: str, commit: str | None) -> dict:
    t, lo, pk = trained[f"train-{rid}"], evaluated[f"loss-{rid}"], evaluated[f"passkey-{rid}"]
    acc = _by_multiple(pk["accuracy_by_length"], p)
    e = {
        "seed": r["seed"],
        "commit": commit,
        "loss": lo["loss"],
        "loss_by_multiple": lo["by_multiple"],
        "passkey_by_multiple": acc,
        "passkey_grid": pk["accuracy"],
        "control_pass": acc["1"] >= CONTROL if "1" in acc else None,
        "train": {k: t.get(k) for k in ("tokens_per_s", "val_loss", "final_train_loss", "task_loss_curve")},
    }
    e["train"]["task_loss_curve"] = [
        {"step": c["step"], "task_loss": c["task_loss"]} for c in e["train"]["task_loss_curve"] or []
    ]
    if f"evict-{rid}" in evaluated:
        ev, gr = evaluated[f"evict-{rid}"], evaluated[f"growth-{rid}"]
        e["eviction"] = {
            "threshold": ev["threshold"],
            "kept_fraction": _by_multiple([np.mean(k) for k in ev["rule"]["kept_fraction"]], p),
            "accuracy": _by_multiple(ev["rule"]["accuracy_by_length"], p),
            "window_accuracy": _by_multiple(ev["window"]["accuracy_by_length"], p),
            "window_kept_fraction": _by_multiple([np.mean(k) for k in ev["window"]["kept_fraction"]], p),
            "growth": gr,
        }
    return e


def _task_curve(curves: list[list[dict]]) -> dict:
    """Answer-loss learning curve over seeds: steps and mean/min/max per step."""
    steps = sorted(set.intersection(*[{c["step"] for c in cur} for cur in curves])) if curves and all(curves) else []
    if not steps:
        return {"steps": [], "mean": [], "min": [], "max": []}
    vals = np.asarray([[next(c["task_loss"] for c in cur if c["step"] == s) for s in steps] for cur in curves], float)
    return {"steps": steps, "mean": vals.mean(0).tolist(), "min": vals.min(0).tolist(), "max": vals.max(0).tolist()}


def _eviction(p: ReproducePreset, seeds: list[dict]) -> dict:
    """Per length: per-seed lists (seed order) of kept fraction, accuracy under the rule, full-cache
    accuracy and the equal-size window's accuracy; "lossless" per seed (None where the full cache is
    below LOSSLESS_FULL); the keys-growth exponent (mean over seeds, and per seed)."""
    by = {}
    for m in map(str, p.passkey_multiples):
        full = [s["passkey_by_multiple"][m] for s in seeds]
        acc = [s["eviction"]["accuracy"][m] for s in seeds]
        by[m] = {
            "kept_fraction": [s["eviction"]["kept_fraction"][m] for s in seeds],
            "accuracy": acc,
            "full_accuracy": full,
            "window_accuracy": [s["eviction"]["window_accuracy"][m] for s in seeds],
            "lossless": [None if f < LOSSLESS_FULL else bool(a >= f - 1e-9) for a, f in zip(acc, full)],
        }
    exps = [s["eviction"]["growth"]["exponent"] for s in seeds]
    growth = {
        "lengths": seeds[0]["eviction"]["growth"]["lengths"],
        "kept_keys": np.mean([s["eviction"]["growth"]["kept_keys"] for s in seeds], 0).tolist(),
    }
    return {
        "threshold": seeds[0]["eviction"]["threshold"],
        "by_multiple": by,
        "keys_growth_exponent": float(np.nanmean(exps)),
        "keys_growth_exponent_by_seed": exps,
        "growth": growth,
    }


def tuning_summary(p: ReproducePreset, ran: set[str] | None = None) -> dict:
    """What this preset froze from its tuning run for the core arms in ``ran`` (default: all), and
    the tuning run's selection table if the folder named by ``tuning_source`` holds one
    ("recipe_matches": whether that run trained this preset's recipe)."""
    out: dict[str, Any] = {
        "seeds": list(p.tuning_seeds),
        "source": p.tuning_source,
        "selected": {
            s.name: {"model": s.model, "train": s.train, "threshold": p.thresholds.get(s.name)}
            for s in p.core
            if ran is None or s.name in ran
        },
    }
    if p.tuning_source:
        path = Path(p.tuning_source)
        path = path / "results.json" if path.is_dir() else path
        if path.is_file():
            tuned = json.loads(path.read_text())
            out["rows"] = tuned["tuning"]["rows"]
            out["tuned_selection"] = tuned["tuning"]["selected"]
            out["tuning_commit"] = tuned.get("provenance", {}).get("commit")
            tp = tuned.get("preset", {})
            out["recipe_matches"] = all(
                json.dumps(tp.get(k), sort_keys=True) == json.dumps(getattr(p, k), sort_keys=True)
                for k in ("steps", "model_overrides", "train_len", "batch_size", "lr", "mix_task", "mix_rate")
            )
    return out


def aggregate(
    p: ReproducePreset,
    runs: list[dict],
    trained: dict,
    evaluated: dict,
    run_id: Callable[[dict], str],
    commit_of: Callable[[str], str | None] = lambda name: None,
) -> dict:
    """The results dict of a reported preset (docs/reproduce.md lists its keys)."""
    names = list(dict.fromkeys(r["spec"].name for r in runs))
    methods = {}
    for name in names:
        rs = [r for r in runs if r["spec"].name == name]
        seeds = [_seed_entry(p, r, trained, evaluated, run_id(r), commit_of(f"train-{run_id(r)}")) for r in rs]
        acc = np.asarray([[s["passkey_by_multiple"][str(m)] for m in p.passkey_multiples] for s in seeds], float)
        spec = rs[0]["spec"]
        methods[name] = {
            "base": spec.base,
            "arm": spec.arm,
            "role": rs[0]["role"],
            "attention": spec.attention,
            "model": spec.model,
            "train_overrides": spec.train,
            "served": evaluated[f"passkey-{run_id(rs[0])}"].get("served"),
            "passkey": {
                "multiples": list(p.passkey_multiples),
                "accuracy_by_multiple": acc.mean(0).tolist(),
                "min": acc.min(0).tolist(),
                "max": acc.max(0).tolist(),
                "n_seeds": len(seeds),
            },
            "loss": _spread([s["loss"] for s in seeds]),
            "control_passed": sum(bool(s["control_pass"]) for s in seeds),
            "loss_curve": np.mean([evaluated[f"loss-{run_id(r)}"]["curve"] for r in rs], 0).tolist(),
            "task_curve": _task_curve([s["train"]["task_loss_curve"] or [] for s in seeds]),
            "seeds": seeds,
        }
        if all("eviction" in s for s in seeds) and seeds:
            methods[name]["eviction"] = _eviction(p, seeds)
    return {
        "kind": "reported",
        "preset": p.to_dict(),
        "train_len": p.train_len,
        "tuning": tuning_summary(p, set(methods)),
        "methods": methods,
        "analysis": analysis(methods),
    }


def analysis(methods: dict) -> dict:
    """Every pair of PAIRS present, on their shared seeds (a - b): passkey at 8x and 16x as served
    ("passkey_<m>x_as_served") and under each arm's own rule ("passkey_<m>x_own_rule"), held-out
    loss ("loss", lower is better), each a fpa.experiments.lm.analysis.paired dict; and, where 8x was
    evaluated, how many seeds each arm has perfect at 8x as served."""
    out: dict[str, Any] = {}
    for a, b in PAIRS:
        if a not in methods or b not in methods:
            continue
        sa = {s["seed"]: s for s in methods[a]["seeds"]}
        sb = {s["seed"]: s for s in methods[b]["seeds"]}
        shared = sorted(set(sa) & set(sb))
        res: dict[str, Any] = {"seeds": shared}
        for m in ("8", "16"):
            if not shared or not all(m in sa[s]["passkey_by_multiple"] for s in shared):
                continue
            res[f"passkey_{m}x_as_served"] = paired(
                [sa[s]["passkey_by_multiple"][m] for s in shared], [sb[s]["passkey_by_multiple"][m] for s in shared]
            )
            if all("eviction" in d[s] for d in (sa, sb) for s in shared):
                res[f"passkey_{m}x_own_rule"] = paired(
                    [sa[s]["eviction"]["accuracy"][m] for s in shared],
                    [sb[s]["eviction"]["accuracy"][m] for s in shared],
                )
        res["loss"] = paired([sa[s]["loss"] for s in shared], [sb[s]["loss"] for s in shared], higher_is_better=False)
        if shared and all("8" in sa[s]["passkey_by_multiple"] for s in shared):
            res["perfect_at_8x"] = {
                n: sum(d[s]["passkey_by_multiple"]["8"] >= 1.0 for s in shared) for n, d in ((a, sa), (b, sb))
            }
        out[f"{a} vs {b}"] = res
    return out
