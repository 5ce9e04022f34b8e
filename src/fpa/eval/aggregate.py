"""Stage outputs of ``fpa reproduce`` -> the results dict: per method, means over seeds with
min and max, and every seed's own figures under ``seeds``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fpa.eval.presets import ReproducePreset


def _spread(values) -> dict:
    """{"mean", "min", "max"} of a list of numbers (NaN-free; empty -> NaNs)."""
    v = np.asarray([x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))], float)
    if v.size == 0:
        return {"mean": math.nan, "min": math.nan, "max": math.nan}
    return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}


def _passkey(per_seed: list[dict]) -> dict:
    """Mean full-cache passkey grid over seeds, with min and max per length."""
    first = per_seed[0]
    acc = np.asarray([g["accuracy"] for g in per_seed], float)  # (S, n_len, n_depth)
    by_len = acc.mean(2)  # (S, n_len)
    return {"lengths": first["lengths"], "depths": first["depths"], "trials": first["trials"],
            "n_seeds": len(per_seed), "accuracy": acc.mean(0).tolist(),
            "accuracy_by_length": by_len.mean(0).tolist(), "accuracy_by_length_min": by_len.min(0).tolist(),
            "accuracy_by_length_max": by_len.max(0).tolist()}


def _loss(per_seed: list[dict]) -> dict:
    s = _spread([d["loss"] for d in per_seed])
    mults = per_seed[0]["by_multiple"].keys()
    curve = np.mean([d["curve"] for d in per_seed], 0)
    return {"loss": s["mean"], "loss_min": s["min"], "loss_max": s["max"], "ppl": math.exp(s["mean"]),
            "by_multiple": {m: float(np.mean([d["by_multiple"][m] for d in per_seed])) for m in mults},
            "curve": curve.tolist()}


def _task_curve(per_seed: list[dict]) -> dict:
    """Answer-loss learning curve over seeds: steps and mean/min/max per step."""
    curves = [t.get("task_loss_curve") or [] for t in per_seed]
    steps = sorted(set.intersection(*[{c["step"] for c in cur} for cur in curves])) if all(curves) else []
    vals = np.asarray([[next(c["task_loss"] for c in cur if c["step"] == s) for s in steps] for cur in curves], float)
    if not steps:
        return {"steps": [], "mean": [], "min": [], "max": []}
    return {"steps": steps, "mean": vals.mean(0).tolist(), "min": vals.min(0).tolist(), "max": vals.max(0).tolist()}


def _curve(per_seed: list[list[dict]], seeds: list[int]) -> list[dict]:
    """Points of one policy averaged over seeds (points are matched by their setting)."""
    out = []
    for i, pt in enumerate(per_seed[0]):
        pts = [ps[i] for ps in per_seed]
        if any(p["setting"] != pt["setting"] for p in pts):
            raise ValueError(f"curve points do not match across seeds at index {i}")
        kept = _spread([p["kept_fraction"] for p in pts])
        mults = list(pt["accuracy_by_multiple"])
        acc = {m: _spread([p["accuracy_by_multiple"][m] for p in pts]) for m in mults}
        out.append({"setting": pt["setting"], "kept_fraction": kept["mean"], "kept_fraction_min": kept["min"],
                    "kept_fraction_max": kept["max"],
                    "accuracy_by_multiple": {m: acc[m]["mean"] for m in mults},
                    "accuracy_min_by_multiple": {m: acc[m]["min"] for m in mults},
                    "accuracy_max_by_multiple": {m: acc[m]["max"] for m in mults},
                    "seeds": [{"seed": s, "kept_fraction": p["kept_fraction"],
                               "accuracy_by_multiple": p["accuracy_by_multiple"]} for s, p in zip(seeds, pts)]})
    return out


def aggregate(p: ReproducePreset, runs: list[dict], trained: dict, evaluated: dict,
              run_id: Callable[[dict], str], curve_policies: Callable[[ReproducePreset, dict], list[str]]) -> dict:
    """The results dict of a reproduction (see docs/reproduce.md for its keys)."""
    names = list(dict.fromkeys(r["name"] for r in runs))
    methods = {}
    for name in names:
        rs = [r for r in runs if r["name"] == name]
        seeds = [r["seed"] for r in rs]
        train = [trained[f"train-{run_id(r)}"] for r in rs]
        loss = [evaluated[f"loss-{run_id(r)}"] for r in rs]
        pk = [evaluated[f"passkey-{run_id(r)}"] for r in rs]
        policies = curve_policies(p, rs[0])
        curves = {pol: [evaluated[f"curve-{run_id(r)}-{pol}"]["points"] for r in rs] for pol in policies}
        r0 = rs[0]
        methods[name] = {
            "attention": r0["attention"], "fpa_mode": r0["mode"] if r0["attention"] == "fpa" else None,
            "ablation": r0["ablation"], "overrides": r0["overrides"],
            "evict_tau": r0.get("train_overrides", {}).get("evict_tau"),  # trained (and served) under the rule
            "passkey": _passkey(pk), "loss": _loss(loss),
            "train": {"tokens_per_s": _spread([t.get("tokens_per_s") for t in train]),
                      "val_loss": _spread([t.get("val_loss") for t in train])},
            "task_loss_curve": _task_curve(train),
            "cache_curve": {pol: _curve(c, seeds) for pol, c in curves.items()},
            "seeds": [{"seed": s, "train": {k: t.get(k) for k in ("tokens_per_s", "val_loss", "final_train_loss",
                                                                  "task_loss_curve")},
                       "loss": {k: v for k, v in lo.items() if k != "curve"},
                       "passkey": {k: g[k] for k in ("lengths", "depths", "accuracy", "accuracy_by_length", "correct")},
                       "cache_curve": {pol: c[i] for pol, c in curves.items()}}
                      for i, (s, t, lo, g) in enumerate(zip(seeds, train, loss, pk))],
        }
    kvpress = {}
    for name in names:
        rs = [r for r in runs if r["name"] == name and f"kvpress-{run_id(r)}" in evaluated]
        if rs:
            kvpress[name] = _kvpress([evaluated[f"kvpress-{run_id(r)}"] for r in rs], [r["seed"] for r in rs])
    return {"preset": p.to_dict(), "train_len": p.train_len, "seeds": sorted({r["seed"] for r in runs}),
            "methods": methods, "kvpress": kvpress}


def _kvpress(per_seed: list[dict], seeds: list[int]) -> list[dict]:
    """One row per (press, compression ratio): accuracy by length and kept fraction over seeds."""
    rows = []
    for i, g in enumerate(per_seed[0]["grids"]):
        gs = [d["grids"][i] for d in per_seed]
        acc = np.asarray([x["accuracy_by_length"] for x in gs], float)  # (S, n_len)
        rows.append({"press": g["press"], "compression_ratio": g["compression_ratio"], "lengths": g["lengths"],
                     "kept_fraction": float(np.mean([x["kept_fraction_mean"] for x in gs])),
                     "accuracy_by_length": acc.mean(0).tolist(), "accuracy_by_length_min": acc.min(0).tolist(),
                     "accuracy_by_length_max": acc.max(0).tolist(), "seeds": seeds})
    return rows
