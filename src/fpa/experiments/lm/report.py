"""results.json -> report.md, README-snippet.md and the PNG figures (all written atomically).

A tuning run's report is its selection table; a reported run's report states, per claim, what the
paired seeds show (intervals, sign tests, misses), the eviction tables per length, the context
methods and the diagnosis of FPA walk's misses at 8x; a run stopped by the gate reports its 1x
controls. Verdict sentences come from the numbers. A report names only what its run computed: no
figure that was not written, no length that was not evaluated, no tuning run that does not exist.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fpa.data.atomic import atomic_write_text
from fpa.experiments.lm import plots
from fpa.experiments.lm.aggregate import LOSSLESS_FULL
from fpa.experiments.lm.methods import CONTROL
from fpa.experiments.lm.tables import (
    NO_COPY_FLOOR,
    diagnosis_text,
    eviction_table,
    method_table,
    pct,
    seed_table,
    verdicts,
)
from fpa.experiments.stages import write_json


def provenance_text(results: dict) -> str:
    """The command, commit and wall time that produced ``results`` (empty without a wall time)."""
    pv = results.get("provenance", {})
    dirty = " (the source tree differed from this commit: not a committed result)" if pv.get("dirty") else ""
    wall = pv.get("wall_s")
    return (
        f"Produced by `{pv.get('command')}` at commit `{pv.get('commit')}`{dirty}; wall time {wall / 60:.1f} min."
        if wall is not None
        else ""
    )


def setup_text(results: dict) -> str:
    """One paragraph on the preset's training recipe and evaluation budget."""
    p = results["preset"]
    return (
        f"Recipe: the `{p['model_preset']}` model with {p['model_overrides']}; {p['steps']} AdamW steps x "
        f"{p['batch_size']} sequences x {p['train_len']} {p['tokenizer']} tokens (lr {p['lr']}, "
        f"{p['warmup_steps']} warm-up steps, cosine), task samples (`{p['mix_task']}`) in a {p['mix_rate']} share "
        f"of the sequences, at the training length only. Passkey: {len(p['depths'])} needle depths x "
        f"{p['trials']} prompts per length, greedy decoding, exact match. Held-out loss: {p['loss_windows']} "
        f"windows of {p['loss_multiple']} x {p['train_len']} tokens from the "
        f"{'tuning' if p.get('tuning') else 'reporting'} half of the held-out split."
    )


def tuning_markdown(results: dict) -> str:
    """The report of a tuning run: per configuration, validation loss and passkey, and the selected thresholds."""
    t, p = results["tuning"], results["preset"]
    mults = p["passkey_multiples"]
    lines = [
        f"# Tuning: `{p['name']}`",
        "",
        provenance_text(results),
        "",
        setup_text(results),
        "",
        f"Tuning seeds {t['seeds']}; validation prompts (prompt seed {p['validation_prompt_seed']}) and the "
        "tuning half of the held-out split. Nothing here is used for reporting.",
        "",
        f"Configuration rule: {t['rule']['config']}. Threshold rule: {t['rule']['threshold']}.",
        "",
        "| configuration | val loss | "
        + " | ".join(f"val passkey {m}x" for m in mults)
        + " | score | 1x control (seeds) | selected |",
        "|" + "---|" * (len(mults) + 5),
    ]
    chosen = {s["config"] for s in t["selected"].values()}
    for r in t["rows"]:
        ok = sum(s[0] >= CONTROL for s in r["val_passkey_by_seed"])
        lines.append(
            f"| {r['name']} | {r['val_loss']:.4f} | "
            + " | ".join(pct(a) for a in r["val_passkey_by_length"])
            + f" | {r['score']:.3f} | {ok}/{len(r['seeds'])} | {'**yes**' if r['name'] in chosen else ''} |"
        )
    lines += [
        "",
        "## Eviction threshold of the selected configurations",
        "",
        "| arm | configuration | threshold | mean val accuracy (rule) | full cache | kept (mean over lengths) "
        "| within tolerance |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, s in t["selected"].items():
        ev = s.get("eviction")
        if ev:
            lines.append(
                f"| {arm} | {s['config']} | {ev['threshold']:g} | {pct(ev['accuracy'])} | "
                f"{pct(ev['full_accuracy'])} | {pct(ev['kept'])} | {'yes' if ev['within'] else 'no (largest)'} |"
            )
        elif s.get("training_threshold") is not None:
            lines.append(
                f"| {arm} | {s['config']} | {s['training_threshold']:g} (trained under it) | (served under it: "
                "the table above) | | | |"
            )
    lines += ["", "![validation passkey per configuration](tuning.png)", ""]
    return "\n".join(lines)


def tuning_reference(results: dict) -> list[str]:
    """Markdown lines naming where the configurations and thresholds came from ([] for a run without
    core arms)."""
    t = results["tuning"]
    if not t["selected"]:
        return []
    if t.get("source"):
        lines = [
            f"Configurations and thresholds were chosen in a separate tuning run (`{t['source']}`, tuning seeds "
            f"{t['seeds']}, validation prompts), never on these seeds or prompts:",
        ]
    else:
        lines = ["Configurations and thresholds frozen in the preset (`fpa.experiments.lm.presets.SELECTED_CPU`):"]
    lines.append("")
    for name, s in t["selected"].items():
        lines.append(
            f"- {name}: model {s['model'] or 'defaults'}, training {s['train'] or 'plain'}, threshold {s['threshold']}"
        )
    if t.get("tuned_selection"):
        agree = all(
            _tuned_threshold(t["tuned_selection"].get(n, {})) == s["threshold"] for n, s in t["selected"].items()
        )
        lines += [
            "",
            f"The tuning run at commit `{t.get('tuning_commit')}` "
            + ("selected the same thresholds" if agree else "**selected other thresholds than this preset's**")
            + (
                ""
                if t.get("recipe_matches", True)
                else "; **it trained another recipe than this run's** (steps or model differ)"
            )
            + "; its table is in its report.",
        ]
    return lines


def _tuned_threshold(sel: dict) -> float | None:
    return (sel.get("eviction") or {}).get("threshold", sel.get("training_threshold"))


def gate_markdown(results: dict) -> str:
    """The report of a run the gate stopped, or stopped after its controls (kind "control"): the 1x
    control of every core seed, and the retry."""
    g, p = results["gate"], results["preset"]
    control_only = results["kind"] == "control"
    if control_only:
        title = "stopped after the 1x controls"
        verdict = f"{'it did' if g['passed'] else 'it did not'}; the run was stopped there (`--stop-after control`)"
    else:
        title, verdict = (
            "stopped by the 1x control gate",
            ("it did not, so nothing else is reported (the evaluations made with the controls were discarded unread)"),
        )
    lines = [
        f"# Reproduction: `{p['name']}`, {title}",
        "",
        provenance_text(results),
        "",
        setup_text(results),
        "",
        f"After training, each core arm had to pass the 1x control (>= {pct(CONTROL)} passkey accuracy at the "
        f"training length, as served) on at least {g['min_pass']} seeds; {verdict}:",
        "",
        "| method | passed | "
        + " | ".join(f"seed {s}" for s in next(iter(g["by_arm"].values()))["accuracy_by_seed"])
        + " |",
        "|" + "---|" * (2 + len(next(iter(g["by_arm"].values()))["accuracy_by_seed"])),
    ]
    for arm, a in g["by_arm"].items():
        lines.append(
            f"| {arm} | {a['passed']}/{a['n']} | " + " | ".join(pct(x) for x in a["accuracy_by_seed"].values()) + " |"
        )
    lines.append("")
    if results.get("retry"):
        r = results["retry"]
        lines.append(f"Retrained at {r['steps']} steps, nothing else changed, in `{r['out']}` (its report).")
    elif control_only:
        lines.append("Nothing else was evaluated: the run stopped after the controls by request.")
    else:
        lines.append("No retry configured for this preset (`retry_steps`): stopped.")
    lines += _retry_of_text(results)
    return "\n".join(lines) + "\n"


def _retry_of_text(results: dict) -> list[str]:
    first = results.get("retry_of")
    if not first:
        return []
    short = ", ".join(f"{a} {g['passed']}/{g['n']}" for a, g in first["gate"]["by_arm"].items())
    return [
        "",
        f"This run retrains, at {results['preset']['steps']} steps, the run in `{first['out']}`, which the gate "
        f"stopped at {first['steps']} steps (1x control passed on {short} seeds); its report is there.",
    ]


def reported_markdown(results: dict, figures: set[str]) -> str:
    """The full report of a reported or ablation run; ``figures``: the PNGs written beside it."""
    ms = results["methods"]
    core = [n for n, m in ms.items() if m["role"] == "core"]
    context = [n for n, m in ms.items() if m["role"] == "context"]

    def fig(name: str, alt: str) -> list[str]:
        return [f"![{alt}]({name})", ""] if name in figures else []

    lines = [f"# Reproduction: `{results['preset']['name']}`", "", provenance_text(results), "", setup_text(results)]
    lines += _retry_of_text(results)
    g = results.get("gate")
    if g:
        short = ", ".join(f"{a} {x['passed']}/{x['n']}" for a, x in g["by_arm"].items())
        lines += ["", f"Gate after training: 1x control passed on {short} seeds ({g['min_pass']} needed per arm)."]
    lines += ["", "## Verdicts (paired seeds)", ""]
    lines += [f"- {v}" for v in verdicts(results)] or ["- (no paired comparison in this run)"]
    lines += ["", "## Methods", "", method_table(results, core + context), ""]
    if context:
        lines += ["Context methods run on fewer seeds and are not part of the paired analysis.", ""]
    lines += fig("passkey.png", "passkey by length") + fig("paired.png", "paired differences")
    if any("eviction" in ms[n] for n in core):
        lines += ["## Eviction by each arm's own rule", "", eviction_table(results), ""]
        lines += [
            f"Lossless is judged only on seeds whose full cache reaches {pct(LOSSLESS_FULL)} at that length.",
            "",
        ]
        lines += fig("eviction.png", "eviction") + fig("growth.png", "kept keys against context")
    diag = diagnosis_text(results)
    if diag:
        lines += ["## Where FPA walk misses at 8x", ""] + diag + [""] + fig("diagnosis.png", "diagnosis")
    ref = tuning_reference(results)
    if ref:
        lines += ["## Tuning", ""] + ref + [""]
    lines += ["## Every seed", ""] + seed_table(results, core + context) + [""]
    lines += fig("loss-curves.png", "held-out loss per position") + fig("answer-loss.png", "answer loss")
    return "\n".join(lines)


def readme_snippet(results: dict) -> str:
    """The method table, verdicts and provenance, for the README."""
    names = [n for n, m in results["methods"].items() if m["role"] in ("core", "context")]
    return (
        method_table(results, names)
        + "\n\n"
        + "\n".join(f"- {v}" for v in verdicts(results))
        + "\n\n"
        + provenance_text(results)
        + "\n"
    )


def _figures(results: dict, out: Path) -> set[str]:
    """Write the figures the results hold data for; returns their file names."""
    ms, L = results["methods"], results["train_len"]
    dashed = tuple(n for n, m in ms.items() if m["role"] == "context")
    written = {"passkey.png", "loss-curves.png", "answer-loss.png"}
    plots.plot_by_multiple(ms, out / "passkey.png", "Passkey accuracy as served (line: mean; dots: seeds)", dashed)
    diffs = {
        f"{key.replace(' vs ', ' - ')}, {k.split('_')[1]} {k.split('_', 2)[2].replace('_', ' ')}": {
            "diffs": (np.asarray(an[k]["diffs"]) * 100).tolist(),
            "mean_diff": 100 * an[k]["mean_diff"],
            "ci95": [100 * x for x in an[k]["ci95"]],
        }
        for key, an in results.get("analysis", {}).items()
        for k in ("passkey_8x_as_served", "passkey_16x_as_served")
        if k in an
    }
    if diffs:
        n = max(len(an["seeds"]) for an in results["analysis"].values())
        plots.plot_paired(diffs, out / "paired.png", f"Paired differences over n = {n} seeds")
        written.add("paired.png")
    ev = {n: m["eviction"] for n, m in ms.items() if m["role"] == "core" and "eviction" in m}
    if ev:
        plots.plot_eviction(ev, out / "eviction.png")
        plots.plot_growth(ev, out / "growth.png")
        written |= {"eviction.png", "growth.png"}
    if results.get("diagnosis"):
        plots.plot_diagnosis(results["diagnosis"], out / "diagnosis.png")
        written.add("diagnosis.png")
    plots.plot_loss_curves({n: m["loss_curve"] for n, m in ms.items()}, L, out / "loss-curves.png", dashed)
    plots.plot_task_curves({n: m["task_curve"] for n, m in ms.items()}, out / "answer-loss.png", NO_COPY_FLOOR, dashed)
    return written


def write_report(results: dict, out_dir: str | Path) -> None:
    """results.json and report.md in ``out_dir``; a reported run also its PNGs and README-snippet.md,
    a tuning run tuning.png and tuning.json (its selection: ``fpa reproduce --selection`` reads it).
    PNGs of an earlier write that this run has no data for are removed, so none is stale."""
    out = Path(out_dir)
    write_json(out / "results.json", results)
    if results["kind"] == "tuning":
        plots.plot_tuning(results["tuning"]["rows"], list(results["preset"]["passkey_multiples"]), out / "tuning.png")
        write_json(
            out / "tuning.json",
            {"preset": results["preset"]["name"], "provenance": results.get("provenance"), "tuning": results["tuning"]},
        )
        atomic_write_text(out / "report.md", tuning_markdown(results))
        return
    if results["kind"] in ("gate-failed", "control"):
        atomic_write_text(out / "report.md", gate_markdown(results))
        return
    figures = _figures(results, out)
    for stale in {"paired.png", "eviction.png", "growth.png", "diagnosis.png"} - figures:
        (out / stale).unlink(missing_ok=True)
    atomic_write_text(out / "report.md", reported_markdown(results, figures))
    atomic_write_text(out / "README-snippet.md", readme_snippet(results))
