"""results.json -> report.md, README-snippet.md and the PNG figures (all written atomically).

Every figure is a mean over training seeds shown with its min and max; verdicts compare the
paper's claims with those numbers."""

from __future__ import annotations

import math
from pathlib import Path

from fpa.data.atomic import atomic_write_text
from fpa.eval import plots
from fpa.eval.setup_text import how_text, mix_text
from fpa.eval.stages import write_json

NO_COPY_FLOOR = 5 / 6 * math.log(10)  # answer loss of a model that does not copy (byte tokens)


def _pct(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _spread_pct(mean, lo, hi) -> str:
    if any(v is None or math.isnan(v) for v in (mean, lo, hi)):
        return "n/a"
    return _pct(mean) if lo == hi else f"{_pct(mean)} [{100 * lo:.0f}-{100 * hi:.0f}]"


def at_multiple(method: dict, k: int, train_len: int) -> tuple[float, float, float]:
    """(mean, min, max) over seeds of full-cache passkey accuracy at k x the training length."""
    g = method["passkey"]
    if k * train_len not in g["lengths"]:
        return math.nan, math.nan, math.nan
    i = g["lengths"].index(k * train_len)
    return g["accuracy_by_length"][i], g["accuracy_by_length_min"][i], g["accuracy_by_length_max"][i]


def lossless_point(method: dict, policy: str, k: str) -> dict | None:
    """The point of ``policy`` with the smallest mean kept fraction whose accuracy at k x is at
    least the full cache's on every seed (None if no point is lossless). Evicting can also remove
    a distractor, so a point above the full cache on a seed lost nothing there."""
    full = method["cache_curve"].get("full")
    pts = method["cache_curve"].get(policy)
    if not full or not pts:
        return None
    ref = [s["accuracy_by_multiple"][k] for s in full[0]["seeds"]]
    ok = [p for p in pts if all(s["accuracy_by_multiple"][k] >= r - 1e-9 for s, r in zip(p["seeds"], ref))]
    return min(ok, key=lambda p: p["kept_fraction"]) if ok else None


def passkey_table(results: dict) -> str:
    L, ms = results["train_len"], results["methods"]
    mults = results["preset"]["passkey_multiples"]
    rows = ["| method | seeds | held-out loss (ctx <= L) | vs FoX | " + " | ".join(f"passkey {m}x" for m in mults) + " |",
            "|" + "---|" * (4 + len(mults))]
    fox = ms.get("fox")
    for name, m in ms.items():
        lo = m["loss"]
        vs = "-" if fox is None or name == "fox" else f"{100 * (lo['loss'] / fox['loss']['loss'] - 1):+.1f}%"
        rows.append(f"| {name} | {m['passkey']['n_seeds']} | {lo['loss']:.4f} [{lo['loss_min']:.4f}-{lo['loss_max']:.4f}]"
                    f" | {vs} | " + " | ".join(_spread_pct(*at_multiple(m, k, L)) for k in mults) + " |")
    return "\n".join(rows)


def curve_table(results: dict) -> str:
    mults = [str(m) for m in results["preset"]["cache_multiples"]]
    rows = ["| method | policy | setting | kept (mean [min-max]) | " + " | ".join(f"passkey {m}x" for m in mults) + " |",
            "|" + "---|" * (4 + len(mults))]
    for name, m in results["methods"].items():
        for policy, pts in m["cache_curve"].items():
            for p in pts:
                setting = "-" if p["setting"] is None else (f"tau={p['setting']:g}" if policy in ("fpa", "fox")
                                                            else f"f={p['setting']:g}")
                kept = (f"{100 * p['kept_fraction']:.1f}% [{100 * p['kept_fraction_min']:.1f}-"
                        f"{100 * p['kept_fraction_max']:.1f}]")
                rows.append(f"| {name} | {policy} | {setting} | {kept} | " + " | ".join(
                    _spread_pct(p["accuracy_by_multiple"][k], p["accuracy_min_by_multiple"][k],
                                p["accuracy_max_by_multiple"][k]) for k in mults) + " |")
    return "\n".join(rows)


def kvpress_table(results: dict) -> str:
    """kvpress presses on the exported models, beside the same models' full cache."""
    kv = results.get("kvpress") or {}
    if not kv:
        return ("(not run: kvpress was not importable where this report was written; it pins transformers<5.3. "
                "Rerun `fpa reproduce` with the same arguments in an environment with the `kvpress` extra.)")
    L, rows = results["train_len"], []
    for name, presses in kv.items():
        mults = [n // L for n in presses[0]["lengths"]]
        rows += [f"| method | press | compression | kept | " + " | ".join(f"passkey {k}x" for k in mults) + " |",
                 "|" + "---|" * (4 + len(mults))]
        full = results["methods"][name]
        rows.append(f"| {name} | full cache (ours) | 0 | 100% | "
                    + " | ".join(_spread_pct(*at_multiple(full, k, L)) for k in mults) + " |")
        for r in presses:
            rows.append(f"| {name} | {r['press']} | {r['compression_ratio']:g} | {100 * r['kept_fraction']:.1f}% | "
                        + " | ".join(_spread_pct(a, lo, hi) for a, lo, hi in zip(
                            r["accuracy_by_length"], r["accuracy_by_length_min"], r["accuracy_by_length_max"])) + " |")
    return "\n".join(rows)


def _seed_entry(method: dict, seed: int) -> dict | None:
    return next((s for s in method["seeds"] if s["seed"] == seed), None)


def _lossless_one(points: list[dict], full: dict, k: str) -> dict | None:
    """Smallest-kept point of one seed's curve with at least the full cache's accuracy at k x."""
    ok = [p for p in points if p["accuracy_by_multiple"][k] >= full["accuracy_by_multiple"][k] - 1e-9]
    return min(ok, key=lambda p: p["kept_fraction"]) if ok else None


def below_floor_table(results: dict) -> str:
    """The own rule of FPA walk and of each variant that tries to push it below its floor, on the
    variants' seeds: loss against FoX, full-cache accuracy, and the smallest lossless kept fraction."""
    ms, L = results["methods"], results["train_len"]
    variants = [n for n, m in ms.items() if m.get("ablation") and m["attention"] == "fpa" and m["cache_curve"]]
    if "fpa-walk" not in ms or not variants:
        return "(no variant in this run)"
    mults = [str(m) for m in results["preset"]["cache_multiples"]]
    rows = ["| model | seed | held-out loss vs FoX | " + " | ".join(
        f"{k}x full | {k}x own rule: smallest lossless kept (tau)" for k in mults) + " |",
        "|" + "---|" * (3 + 2 * len(mults))]
    for seed in sorted({s["seed"] for v in variants for s in ms[v]["seeds"]}):
        fox = _seed_entry(ms["fox"], seed) if "fox" in ms else None
        for name in ["fpa-walk"] + variants:
            e = _seed_entry(ms[name], seed)
            if e is None or "fpa" not in e["cache_curve"]:
                continue
            vs = "-" if fox is None else f"{100 * (e['loss']['loss'] / fox['loss']['loss'] - 1):+.2f}%"
            cells = []
            for k in mults:
                full = e["cache_curve"]["full"][0]
                best = _lossless_one(e["cache_curve"]["fpa"], full, k)
                acc = full["accuracy_by_multiple"][k]
                cells += [_pct(acc), "none" if best is None else f"{100 * best['kept_fraction']:.1f}% (tau="
                          f"{best['setting']:g})" + (", nothing to lose" if acc == 0 else "")]
            rows.append(f"| {name} | {seed} | {vs} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def served_as_trained_table(results: dict) -> str:
    """Runs trained with the rule in the loop: per seed and threshold, the own rule after each
    prefill chunk (as every other model is served) against inside each chunk too ("-within", as
    the model was trained): kept fraction and accuracy at each cache multiple."""
    mults = [str(m) for m in results["preset"]["cache_multiples"]]
    rows = ["| model | seed | tau | " + " | ".join(f"{k}x after chunks: acc (kept) | {k}x within chunks: acc (kept)"
                                              for k in mults) + " |", "|---|---|---|" + "---|---|" * len(mults)]
    for name, m in results["methods"].items():
        within = [p for p in m["cache_curve"] if p.endswith("-within")]
        for pol in within:
            for e in m["seeds"]:
                plain = {p["setting"]: p for p in e["cache_curve"][pol.removesuffix("-within")]}
                for pt in e["cache_curve"][pol]:
                    q = plain.get(pt["setting"])
                    cells = [f"{_pct(x['accuracy_by_multiple'][k])} ({100 * x['kept_by_multiple'][k]:.1f}%)"
                             if x else "-" for k in mults for x in (q, pt)]
                    rows.append(f"| {name} | {e['seed']} | {pt['setting']:g} | " + " | ".join(cells) + " |")
    return "\n".join(rows) if len(rows) > 2 else "(no run trained with the rule in the loop)"


def hybrid_table(results: dict) -> str:
    """Per model with hybrids: the smallest kept fraction each hybrid reaches without loss on every seed."""
    rows = ["| model | policy | smallest lossless kept (setting) at " + " | at ".join(
        f"{m}x" for m in results["preset"]["cache_multiples"]) + " |",
        "|---|---|" + "---|" * len(results["preset"]["cache_multiples"])]
    for name, m in results["methods"].items():
        for policy in m["cache_curve"]:
            if policy == "full":
                continue
            cells = []
            for k in [str(x) for x in results["preset"]["cache_multiples"]]:
                best = lossless_point(m, policy, k)
                cells.append("none" if best is None else
                             f"{100 * best['kept_fraction']:.1f}% ({best['setting']:g})")
            rows.append(f"| {name} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


ABLATION_SUFFIXES = {"-legacy": ("legacy", "current default"), "-lr1": ("1.0", "0.1 (default then)")}


def ablation_table(results: dict) -> str:
    """Each method against its ablation (``<method>-legacy``: FPA_PARAMETRISATION_LEGACY;
    ``<method>-lr1``, older runs: field lr multiplier 1.0), on the ablation's seeds."""
    L, ms = results["train_len"], results["methods"]
    pairs = [(n[:-len(suf)], n, suf) for n in ms for suf in ABLATION_SUFFIXES
             if n.endswith(suf) and n[:-len(suf)] in ms]
    if not pairs:
        return "(no ablation in this run)"
    mults = results["preset"]["passkey_multiples"]
    ks = [1, 8] if 8 in mults else [mults[0], mults[-1]]
    rows = ["| method | parametrisation | seeds | answer loss at the end | "
            + " | ".join(f"passkey {k}x" for k in ks) + " |", "|---|---|---|---|---|---|"]
    for base, abl, suf in pairs:
        ablated, default = ABLATION_SUFFIXES[suf]
        for name, what in ((base, default), (abl, ablated)):
            m = ms[name]
            seeds = [s["seed"] for s in m["seeds"]]
            if name == base:  # compare on the ablation's seeds only
                keep = {s["seed"] for s in ms[abl]["seeds"]}
                seeds = [s for s in seeds if s in keep]
            sel = [s for s in m["seeds"] if s["seed"] in seeds]
            end = [_end_answer_loss(s) for s in sel if s["train"]["task_loss_curve"]]
            acc = {k: [_accuracy_at(s, k * L) for s in sel] for k in ks}
            rows.append(f"| {name} | {what} | {','.join(map(str, seeds))} | {', '.join(f'{x:.3f}' for x in end)} | "
                        + " | ".join(", ".join(_pct(a) for a in acc[k]) for k in ks) + " |")
    return "\n".join(rows)


CONTROL_BAR = 0.9  # passkey accuracy at 1x a seed needs before its longer lengths mean anything


def _accuracy_at(seed_entry: dict, length: int) -> float:
    g = seed_entry["passkey"]
    return g["accuracy_by_length"][g["lengths"].index(length)] if length in g["lengths"] else math.nan


def _end_answer_loss(seed_entry: dict) -> float:
    curve = seed_entry.get("train", {}).get("task_loss_curve") or []
    return curve[-1]["task_loss"] if curve else math.nan


def control_table(results: dict) -> str:
    """The positive control per method and seed: passkey at 1x (must reach CONTROL_BAR) and the
    answer loss at the end of training (NO_COPY_FLOOR = never learned to copy); then 8x and 16x."""
    L, ms = results["train_len"], results["methods"]
    ks = [k for k in (1, 8, 16) if k in results["preset"]["passkey_multiples"]]
    rows = ["| method | seed | answer loss at the end | " + " | ".join(f"passkey {k}x" for k in ks)
            + " | control |", "|---|---|---|" + "---|" * (len(ks) + 1)]
    for name, m in ms.items():
        for s in m["seeds"]:
            one, end = _accuracy_at(s, L), _end_answer_loss(s)
            ok = one >= CONTROL_BAR
            why = "passed" if ok else ("failed: never learned to copy" if end > 0.5 * NO_COPY_FLOOR
                                       else "failed: low answer loss, but exact matches below the bar")
            rows.append(f"| {name} | {s['seed']} | {end:.3f} | " + " | ".join(_pct(_accuracy_at(s, k * L)) for k in ks)
                        + f" | {why} |")
    return "\n".join(rows)


def control_verdicts(results: dict) -> list[str]:
    """Whether every method passed the 1x control on every seed, and FPA's longer lengths on the
    seeds that passed (a seed that never learned the task says nothing about extrapolation)."""
    L, ms = results["train_len"], results["methods"]
    if L not in next(iter(ms.values()))["passkey"]["lengths"]:
        return []
    main = {n: m for n, m in ms.items() if not m.get("ablation")}
    failed = [f"{n} seed {s['seed']} ({_pct(_accuracy_at(s, L))})" for n, m in main.items() for s in m["seeds"]
              if not _accuracy_at(s, L) >= CONTROL_BAR]
    out = [f"- **Positive control, passkey >= {_pct(CONTROL_BAR)} at 1x on every seed of every method**: "
           + ("met." if not failed else f"missed by {', '.join(failed)} (see the control table).")]
    for name, m in main.items():
        passed = [s for s in m["seeds"] if _accuracy_at(s, L) >= CONTROL_BAR]
        cells = []
        for k in (8, 16):
            accs = [_accuracy_at(s, k * L) for s in passed]
            if accs and not any(math.isnan(a) for a in accs):
                cells.append(f"{k}x {_spread_pct(sum(accs) / len(accs), min(accs), max(accs))}")
        if cells:
            out.append(f"- {name}, on the {len(passed)} of {len(m['seeds'])} seeds that passed the control: "
                       + ", ".join(cells) + ".")
        else:
            out.append(f"- {name}: no seed passed the control.")
    return out


def verdicts(results: dict) -> list[str]:
    """One line per paper claim: reproduced / not reproduced / reproduced only at ..., with numbers."""
    L, ms = results["train_len"], results["methods"]
    out = []
    fox = ms.get("fox")
    main = {n: m for n, m in ms.items() if not m.get("ablation")}
    for name in ("fpa-walk", "fpa-free"):
        if name not in ms or fox is None:
            continue
        diffs = [s["loss"]["loss"] / f["loss"]["loss"] - 1 for s, f in zip(ms[name]["seeds"], fox["seeds"])
                 if s["seed"] == f["seed"]]
        mean = ms[name]["loss"]["loss"] / fox["loss"]["loss"] - 1
        ok = mean <= 0.01
        out.append(f"- **Perplexity on par with FoX** ({name}): held-out loss {100 * mean:+.2f}% vs FoX (per seed "
                   f"{', '.join(f'{100 * d:+.2f}%' for d in diffs)}): {'reproduced' if ok else 'not reproduced'} "
                   f"(bar: within 1%).")
    for name in ("fpa-walk", "fpa-free"):
        if name not in ms:
            continue
        a8, a16 = at_multiple(ms[name], 8, L), at_multiple(ms[name], 16, L)
        if math.isnan(a8[0]):
            out.append(f"- **Perfect passkey at 8x** ({name}): not measured (8x is not in this preset).")
            continue
        v = "reproduced" if a8[1] == 1.0 else ("reproduced on some seeds" if a8[2] == 1.0 else "not reproduced")
        out.append(f"- **Perfect passkey at 8x** ({name}, full cache): {_spread_pct(*a8)} over seeds: {v}; "
                   f"at 16x: {_spread_pct(*a16)}.")
    if not main:  # only ablations were run (--methods): the claims compare the main methods
        return out + ["- The claims compare the main methods; this run has ablations only."]
    if 8 * L not in next(iter(main.values()))["passkey"]["lengths"]:
        return out + ["- Passkey at 8x and the cache claims at 8x: not measured (8x is not in this preset)."]
    hundred = [n for n, m in main.items() if at_multiple(m, 8, L)[0] == 1.0]
    others = ", ".join(f"{n} {_pct(at_multiple(m, 8, L)[0])}" for n, m in main.items())
    out.append(f"- **FPA the only method at 100% at 8x**: mean over seeds at 8x: {others}; at 100% on every seed: "
               f"{', '.join(hundred) if hundred else 'none'}.")
    for name, policy in (("fpa-walk", "fpa"), ("fpa-free", "fpa"), ("fox", "fox")):
        if name not in ms or policy not in ms[name]["cache_curve"]:
            continue
        for k in [str(m) for m in results["preset"]["cache_multiples"]]:
            best = lossless_point(ms[name], policy, k)
            full = ms[name]["cache_curve"]["full"][0]["accuracy_by_multiple"][k]
            if best is None:
                out.append(f"- **Same accuracy with its own rule at about 25% kept** ({name}, {k}x; full cache "
                           f"{_pct(full)}): no threshold tried is lossless on every seed: not reproduced.")
                continue
            kept = best["kept_fraction"]
            v = "reproduced" if kept <= 0.25 + 1e-9 and full == 1.0 else (
                f"reproduced only at {100 * kept:.1f}% kept" if full == 1.0 else
                f"lossless at {100 * kept:.1f}% kept, but the full cache itself is at {_pct(full)}")
            out.append(f"- **Same accuracy with its own rule at about 25% kept** ({name}, {k}x): the smallest "
                       f"lossless threshold tau={best['setting']:g} keeps {100 * kept:.1f}% "
                       f"[{100 * best['kept_fraction_min']:.1f}-{100 * best['kept_fraction_max']:.1f}] at full-cache "
                       f"accuracy {_pct(full)}: {v}.")
    return out


def _figures(results: dict, out: Path) -> dict[str, str]:
    L, ms, figs = results["train_len"], results["methods"], {}
    plots.plot_loss_curves({n: m["loss"]["curve"] for n, m in ms.items()}, L, out / "loss-curves.png",
                           dashed=tuple(n for n, m in ms.items() if m.get("ablation")))
    figs["Per-position held-out loss (mean over seeds)"] = "loss-curves.png"
    plots.plot_task_curves({n: m["task_loss_curve"] for n, m in ms.items()}, out / "answer-loss.png", NO_COPY_FLOOR,
                           dashed=tuple(n for n, m in ms.items() if m.get("ablation")))
    figs["Answer loss during training (the ablations dashed)"] = "answer-loss.png"
    for n, m in ms.items():
        n_seeds = m["passkey"]["n_seeds"]
        how = "full cache" if m.get("evict_tau") is None else "served under its own rule"  # eval_stage: as trained
        plots.plot_heatmap(m["passkey"], L, f"{n}: passkey accuracy, {how} "
                           + (f"(mean of {n_seeds} seeds)" if n_seeds > 1 else "(one seed)"),
                           out / f"passkey-{n}.png")
        figs[f"Passkey heatmap, {n}"] = f"passkey-{n}.png"
    curves = {n: m["cache_curve"] for n, m in ms.items() if m["cache_curve"] and not m.get("ablation")}
    for k in results["preset"]["cache_multiples"]:
        if curves:
            plots.plot_cache_curves(curves, str(k), out / f"kept-{k}x.png",
                                    f"Passkey accuracy at {k}x the training length against kept fraction")
            figs[f"Passkey accuracy vs kept fraction at {k}x"] = f"kept-{k}x.png"
    for n, ex in results.get("examples", {}).items():
        plots.plot_example(ex, f"{n}: layer {ex['layer']} head {ex['head']}, key {ex['key']}, "
                               f"answered {ex['generated']!r}", out / f"example-{n}.png")
        figs[f"One passkey example inside {n}"] = f"example-{n}.png"
    return figs


def command(results: dict, out: Path) -> str:
    seeds = ",".join(map(str, results["seeds"]))
    return f"fpa reproduce --preset {results['preset']['name']} --seeds {seeds} --jobs 2 --out {out}"


def cache_sections(results: dict) -> list[str]:
    return ["## Passkey against kept fraction (mean [min-max] over seeds)", "", curve_table(results), "",
            "## Smallest lossless kept fraction per policy (accuracy at least the full cache's on every seed)", "",
            hybrid_table(results), "",
            "## Below the rule's floor: variants of FPA walk trained to forget more", "", below_floor_table(results), "",
            "## Trained under the rule, served under it: the rule inside each prefill chunk too", "",
            served_as_trained_table(results), "",
            "## kvpress presses (through kvpress itself, on the model exported to LlamaForCausalLM)", "",
            kvpress_table(results), "",
            "## Ablation: FPA's parametrisation", "", ablation_table(results), ""]


def write_report(results: dict, out_dir: str | Path) -> None:
    """Write results.json, the PNGs, report.md and README-snippet.md into ``out_dir``."""
    out = Path(out_dir)
    results = {**results, "verdicts": verdicts(results) + control_verdicts(results)}
    write_json(out / "results.json", results)
    figs = _figures(results, out)
    secs = results.get("seconds", {})
    total = sum(secs.values())
    cmd = command(results, out)
    md = [f"# FPA reproduction: preset `{results['preset']['name']}`", "",
          f"Regenerate: `{cmd}` (resumes if interrupted). Stage times add up to {total / 60:.1f} min of worker time.", "",
          "## Verdicts (the paper's claims at this scale)", "", *results["verdicts"], "",
          "## Loss and passkey, full cache (mean [min-max] over seeds)", "", passkey_table(results), "",
          *(["Runs trained with the eviction rule in the loop (`-evict2*`) are measured as trained: held-out loss "
             "under the rule, passkey served by FPAEviction(tau, within_chunks=True) at the tau it was trained with, "
             "not by the full cache.", ""]
            if any(m.get("evict_tau") is not None for m in results["methods"].values()) else []),
          f"## Positive control: passkey at 1x per seed (bar {_pct(CONTROL_BAR)})", "", control_table(results), "",
          *(cache_sections(results) if results["preset"]["cache_multiples"] else []),
          "## Setup", "", how_text(results), "", "## Figures", ""]
    md += [f"### {cap}\n\n![{cap}]({f})\n" for cap, f in figs.items()]
    md += ["## Stage times (s)", "", "| stage | s |", "|---|---|"] + [f"| {k} | {v:.1f} |" for k, v in secs.items()]
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    p = results["preset"]
    snippet = [f"From a real run of `{cmd}` (full report: `{out / 'report.md'}`): the `{p['model_preset']}` model "
               f"{p['model_overrides'] or ''}, {p['steps']} steps x {p['batch_size']} x {p['train_len']} tokens per method "
               f"and seed, {mix_text(p)}; "
               f"{p['trials']} prompts per (length, depth) cell, exact match; mean [min-max] over seeds {results['seeds']}.",
               "", passkey_table(results), "", *results["verdicts"], ""]
    atomic_write_text(out / "README-snippet.md", "\n".join(snippet))
