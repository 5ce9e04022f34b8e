"""results.json -> report.md, README-snippet.md and the PNG figures (all written atomically)."""

from __future__ import annotations

import math
from pathlib import Path

from fpa.data.atomic import atomic_write_text
from fpa.eval import plots
from fpa.eval.stages import write_json


def accuracy_at(grid: dict, length: int) -> float:
    """Mean accuracy over depths at ``length`` tokens (NaN if the grid has no such length)."""
    if length not in grid["lengths"]:
        return math.nan
    return grid["accuracy_by_length"][grid["lengths"].index(length)]


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def targets(results: dict) -> dict:
    """The issue's targets, measured: FPA passkey at 8x (full cache, own rule at <= 25% kept),
    FPA loss relative to FoX, and which baselines reach 100% at 8x."""
    L, ms = results["train_len"], results["methods"]
    out = {"fpa_passkey_8x_full": {}, "fpa_passkey_8x_cache25": {}, "fpa_loss_vs_fox": {}, "baselines_100_at_8x": []}
    for name, m in ms.items():
        acc8 = accuracy_at(m["passkey"], 8 * L)
        if m["attention"] == "fpa":
            out["fpa_passkey_8x_full"][name] = acc8
            own = m["cache"].get("0.25", {}).get("fpa")
            if own is not None:
                out["fpa_passkey_8x_cache25"][name] = {"accuracy": accuracy_at(own, 8 * L),
                                                       "kept_fraction": own["kept_fraction_mean"]}
            if "fox" in ms:
                out["fpa_loss_vs_fox"][name] = m["loss"]["loss"] / ms["fox"]["loss"]["loss"] - 1.0
        elif acc8 == 1.0:
            out["baselines_100_at_8x"].append(name)
    return out


def headline_table(results: dict) -> str:
    L = results["train_len"]
    mults = results["preset"]["passkey_multiples"]
    lm = results["preset"]["loss_multiple"]
    head = (f"| method | held-out loss (ctx <= L) | ppl | loss at {max(1, lm // 2)}-{lm}x L | "
            + " | ".join(f"passkey {m}x" for m in mults) + " | 8x, own rule @25% (kept) |")
    rows = [head, "|" + "---|" * (4 + len(mults) + 1)]
    for name, m in results["methods"].items():
        own = m["cache"].get("0.25", {}).get({"fpa": "fpa", "fox": "fox"}.get(m["attention"], ""))
        own_s = "-" if own is None else f"{_pct(accuracy_at(own, 8 * L))} ({own['kept_fraction_mean']:.2f})"
        by = m["loss"]["by_multiple"]
        rows.append(f"| {name} | {m['loss']['loss']:.4f} | {m['loss']['ppl']:.3f} | "
                    f"{by.get(str(lm), math.nan):.4f} | "
                    + " | ".join(_pct(accuracy_at(m["passkey"], k * L)) for k in mults) + f" | {own_s} |")
    return "\n".join(rows)


def cache_table(results: dict) -> str:
    L = results["train_len"]
    mults = results["preset"]["cache_multiples"]
    rows = ["| method | policy | target kept | achieved kept | " + " | ".join(f"passkey {m}x" for m in mults) + " |",
            "|" + "---|" * (4 + len(mults))]
    for name, m in results["methods"].items():
        rows.append(f"| {name} | full cache | 100% | 100% | "
                    + " | ".join(_pct(accuracy_at(m["passkey"], k * L)) for k in mults) + " |")
        for frac, by_policy in m["cache"].items():
            for policy, g in by_policy.items():
                rows.append(f"| {name} | {policy} | {_pct(float(frac))} | {100 * g['kept_fraction_mean']:.1f}% | "
                            + " | ".join(_pct(accuracy_at(g, k * L)) for k in mults) + " |")
    return "\n".join(rows)


def targets_text(results: dict) -> str:
    t = targets(results)
    lines = []
    for name, a in t["fpa_passkey_8x_full"].items():
        verdict = "not measured" if math.isnan(a) else ("met" if a == 1.0 else "MISSED")
        lines.append(f"- {name}: passkey at 8x, full cache: {_pct(a)} (target 100%: {verdict}).")
    for name, c in t["fpa_passkey_8x_cache25"].items():
        ok = c["accuracy"] == 1.0 and c["kept_fraction"] <= 0.25 + 1e-9
        verdict = "not measured" if math.isnan(c["accuracy"]) else ("met" if ok else "MISSED")
        lines.append(f"- {name}: passkey at 8x with its own eviction rule at {100 * c['kept_fraction']:.1f}% kept: "
                     f"{_pct(c['accuracy'])} (target 100% at <= 25%: {verdict}).")
    for name, r in t["fpa_loss_vs_fox"].items():
        lines.append(f"- {name}: held-out loss {100 * r:+.2f}% vs FoX (target: at most 1% above FoX, "
                     f"i.e. on par or better: {'met' if r <= 0.01 else 'MISSED'}).")
    base = t["baselines_100_at_8x"]
    lines.append(f"- Baselines at 100% passkey at 8x (full cache): {', '.join(base) if base else 'none'}.")
    return "\n".join(lines)


def _figures(results: dict, out: Path) -> dict[str, str]:
    """Write every PNG; returns {caption: file name}."""
    L, figs = results["train_len"], {}
    plots.plot_loss_curves({n: m["loss"]["curve"] for n, m in results["methods"].items()}, L, out / "loss-curves.png")
    figs["Per-position held-out loss"] = "loss-curves.png"
    for n, m in results["methods"].items():
        plots.plot_heatmap(m["passkey"], L, f"{n}: passkey accuracy (full cache)", out / f"passkey-{n}.png")
        figs[f"Passkey heatmap, {n}"] = f"passkey-{n}.png"
    for k in results["preset"]["cache_multiples"]:
        pts = {}
        for n, m in results["methods"].items():
            by = {}
            for frac, by_policy in m["cache"].items():
                for policy, g in by_policy.items():
                    by.setdefault(policy, []).append((g["kept_fraction_mean"], accuracy_at(g, k * L)))
            for policy in by:
                by[policy].append((1.0, accuracy_at(m["passkey"], k * L)))
            pts[n] = by
        plots.plot_kept(pts, out / f"kept-{k}x.png", f"passkey accuracy at {k}x the training length vs kept fraction")
        figs[f"Passkey accuracy vs kept fraction at {k}x"] = f"kept-{k}x.png"
    for n, ex in results.get("examples", {}).items():
        plots.plot_example(ex, f"{n}: layer {ex['layer']} head {ex['head']}, key {ex['key']}, "
                               f"answered {ex['generated']!r}", out / f"example-{n}.png")
        figs[f"One passkey example inside {n}"] = f"example-{n}.png"
    return figs


def command(preset: str, out: Path) -> str:
    return f"fpa reproduce --preset {preset} --out {out}"


def how_text(results: dict) -> str:
    p = results["preset"]
    return (f"Each method is the `{p['model_preset']}` model preset{' with ' + str(p['model_overrides']) if p['model_overrides'] else ''}, "
            f"trained with identical budgets: {p['steps']} steps x {p['batch_size']} sequences x {p['train_len']} tokens "
            f"({p['tokenizer']} tokens; data `{p['data_source']}`, lr {p['lr']}, seed {p['seed']}, the same data order). "
            f"Passkey is learned only from samples mixed into training: each training sequence is, with probability "
            f"{p['mix_rate']}, replaced by a passkey prompt of exactly the training length (needle at a uniform random depth, "
            f"5 random digits) followed by the answer (`fpa.tasks.passkey.passkey_training_sample`); no evaluation length is "
            f"ever trained on. Evaluation: {p['trials']} trials per cell at depths {p['depths']}, greedy decoding, exact match "
            f"of the digits generated (a missing or extra digit is wrong). Cache policies: {p['cache_trials']} trials per cell at "
            f"depths {p['cache_depths']} and {p['cache_multiples']}x the training length, prompts prefilled in chunks of "
            f"{p['chunk_size']} tokens with the policy applied after every chunk and decode step; budget policies keep "
            f"round(f x prompt length) keys per head; the models' own rules (FPA, FoX thresholds) are calibrated per length on "
            f"{p['calib_prompts']} held-out prompts; the kept fraction shown is the one achieved on the evaluated prompts "
            f"(keys held / keys seen at the end, over layers, rows and heads).")


def write_report(results: dict, out_dir: str | Path) -> None:
    """Write results.json, the PNGs, report.md and README-snippet.md into ``out_dir``."""
    out = Path(out_dir)
    results = {**results, "targets": targets(results)}
    write_json(out / "results.json", results)
    figs = _figures(results, out)
    secs = results.get("seconds", {})
    total = sum(secs.values())
    cmd = command(results["preset"]["name"], out)
    md = [f"# FPA reproduction: preset `{results['preset']['name']}`", "",
          f"Regenerate: `{cmd}` (resumes if interrupted). Stage times: {total / 60:.1f} min in all.", "",
          "## Targets (the paper's claims at this scale)", "", targets_text(results), "",
          "## Results", "", headline_table(results), "",
          "## Passkey under KV-cache policies at matched kept fractions", "", cache_table(results), "",
          "## Setup", "", how_text(results), "", "## Figures", ""]
    md += [f"### {cap}\n\n![{cap}]({f})\n" for cap, f in figs.items()]
    md += ["## Stage times (s)", "", "| stage | s |", "|---|---|"] + [f"| {k} | {v:.1f} |" for k, v in secs.items()]
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    p = results["preset"]
    snippet = ["## Results", "", f"From a real run of `{cmd}` ({total / 60:.1f} min on this machine; full report: "
               f"`{out / 'report.md'}`): the `{p['model_preset']}` model, {p['steps']} steps x {p['batch_size']} x "
               f"{p['train_len']} tokens per method, passkey samples mixed into training at rate {p['mix_rate']} at the "
               f"training length only; {p['trials']} passkey trials per (length, depth) cell, exact match.", "",
               headline_table(results), "", targets_text(results), ""]
    atomic_write_text(out / "README-snippet.md", "\n".join(snippet))
