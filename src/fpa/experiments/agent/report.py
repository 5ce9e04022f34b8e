"""report.md and agent-sessions.png of ``fpa agent``, from its results (fpa.experiments.agent.analysis).

Every table is written from what the results hold: a partial run (stopped after training or the
control, or interrupted) gets the sections it has and says which are missing.
"""

from __future__ import annotations

import math
from pathlib import Path

from fpa.data.atomic import atomic_write_figure, atomic_write_text
from fpa.experiments.agent.analysis import EXPONENT_MAX, HELD, MARGIN
from fpa.experiments.agent.preset import ARM_OF, ARMS, METHODS, AgentPreset
from fpa.tasks.agent_sessions import KINDS, TRAIN_SPEC

PLOT = "agent-sessions.png"
DODGE = 0.015  # sideways shift of each method's points in the plot, a share of the length


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def _len(L: int | str) -> str:
    n = int(L)
    return f"{n / 1000:g}k" if n >= 1000 and n % 100 == 0 else str(n)


def _met(part: dict) -> str:
    return "met" if part["met"] else "missed"


def _ramp(p: AgentPreset) -> str:
    """How the FPA arm's rule switched on, for the report's first paragraph."""
    ramp = (
        ""
        if p.threshold_start is None
        else f", its threshold falling from {p.threshold_start:g} to {p.threshold:g} over {p.ramp_steps} steps"
    )
    return ramp + (", with straight-through gradients" if p.straight_through else "")


def stages_line(p: AgentPreset, r: dict) -> str:
    """How many of the planned training, control and decode stages this run holds."""
    n_seeds = len(p.seeds)
    n_decodes = sum(len(v) for by_seed in r["runs"].values() for v in by_seed.values())
    got = (
        ("training runs", sum(len(v) for v in r.get("training", {}).values()), len(ARMS) * n_seeds),
        ("1x controls", sum(len(v) for v in r["control"].values()), len(ARMS) * n_seeds),
        ("long-session decodes", n_decodes, len(METHODS) * n_seeds * len(p.lengths)),
    )
    done = ", ".join(f"{name} {n} of {planned}" for name, n, planned in got)
    if all(n == planned for _, n, planned in got):
        return f"Stages: {done}."
    return f"Stages: {done}. A partial run: the sections below cover only the stages that ran."


def goal_lines(p: AgentPreset, r: dict) -> list[str]:
    """The goal, its verdict and each part's figures."""
    g = r["goal"]
    top = _len(p.lengths[-1])
    verdict = {True: "**MET**", False: "**MISSED**", None: "**NOT ASSESSED**"}[g["met"]]
    out = [
        "## Goal",
        "",
        f"FPA walk under its own rule answers the open questions at least as well as the same model with the full "
        f"cache at every length, its kept keys grow as L^a with a <= {EXPONENT_MAX} (bounded by depth), and at {top} "
        f"it is >= {100 * MARGIN:.0f} points above the best budget policy on the same model at equal memory (window, "
        f"StreamingLLM, TOVA, H2O). Judged on the seeds where the FPA arm passed the 1x control: "
        f"{r['counted_seeds'] or 'none'}."
        if r["control"]
        else "Judged on the seeds where the FPA arm passes the 1x control.",
        "",
        f"Verdict: {verdict}" + (f" ({g['reason']})" if g["reason"] else ""),
    ]
    parts = g["parts"]
    if parts:
        out.append("")
    if "accuracy_vs_full" in parts:
        a = parts["accuracy_vs_full"]
        gaps = ", ".join(f"{_len(L)} {100 * v:+.0f}" for L, v in a["gaps"].items())
        out.append(f"- open accuracy, FPA's rule minus the full cache (points): {gaps}: {_met(a)}")
    if "exponent" in parts:
        e = parts["exponent"]
        seeds = ", ".join(f"{x:.2f}" for x in e["by_seed"])
        out.append(f"- kept-keys exponent a per counted seed: {seeds} (max {e['max']:.2f}): {_met(e)}")
    if "margin" in parts:
        m = parts["margin"]
        out.append(
            f"- at {top}, FPA's rule minus the best equal-memory baseline ({m['best_baseline']}): "
            f"{100 * m['margin']:+.0f} points: {_met(m)}"
        )
    return out + [""]


def control_lines(p: AgentPreset, r: dict, length: int) -> list[str]:
    """The 1x control per arm and seed."""
    if not r["control"]:
        return ["## 1x control", "", "Not run.", ""]
    out = [
        "## 1x control",
        "",
        f"{p.control_sessions} held-out sessions of {length} bytes (the session length of the training samples; "
        f"session seeds {p.control_seed}-{p.control_seed + p.control_sessions - 1}), one question of each kind, "
        "decoded as served (FPA: its rule within chunks; FoX: the full cache). A seed passes with >= "
        f"{100 * p.control_min:.0f}% on the open kinds pooled.",
        "",
        "| arm | seed | open | " + " | ".join(KINDS) + " | passed |",
        "|---|---|---:|" + "---:|" * len(KINDS) + "---|",
    ]
    for arm in ARMS:
        for seed, c in r["control"].get(arm, {}).items():
            acc = c["accuracy"]
            cells = " | ".join(_pct(acc[k]) for k in KINDS)
            out.append(f"| {arm} | {seed} | {_pct(acc['open'])} | {cells} | {'yes' if c['passed'] else '**no**'} |")
    return out + [""]


def run_lines(p: AgentPreset, r: dict) -> list[str]:
    """Per method and seed: accuracy, kept keys, the exponent, bytes and time per token."""
    if not r["runs"]:
        return ["## Long sessions, per method and seed", "", "Not run.", ""]
    Ls = [str(L) for L in p.lengths]
    head = " / ".join(_len(L) for L in Ls)
    out = [
        "## Long sessions, per method and seed",
        "",
        f"Sessions of {head} bytes (seeds {p.session_seed}+, {' / '.join(map(str, p.sessions))} per length, the "
        f"same for every model), depth <= {p.depth}, prefilled in chunks of {p.chunk_size} tokens, then each "
        "question answered greedily. Open: the four open kinds pooled; closed: `closed_ret`, the control that the "
        "memory of closed calls is really gone (a depth-bounded memory should miss it) or really kept. Kept keys: "
        "per (layer, KV head), after the session. The budget methods run on the FPA model and hold the keys its rule "
        "held at the same seed and length. "
        "A seed marked * failed its arm's 1x control.",
        "",
        f"| method | seed | open {head} | closed {head} | kept keys {head} | exponent a | KiB held at "
        f"{_len(Ls[-1])} | prefill us/token | decode ms/token |",
        "|---|---|---|---|---|---:|---:|---:|---:|",
    ]
    for m in METHODS:
        for seed, by_len in r["runs"].get(m, {}).items():
            passed = r["control"].get(ARM_OF[m], {}).get(seed, {}).get("passed")
            row = [by_len.get(L) for L in Ls]
            acc = " / ".join(_pct(x["accuracy"]["open"]) if x else "-" for x in row)
            closed = " / ".join(_pct(x["accuracy"]["closed"]) if x else "-" for x in row)
            kept = " / ".join(_num(x["kept_keys"], ".0f") if x else "-" for x in row)
            a = r["growth"].get(m, {}).get(seed, {}).get("kept_exponent")
            last = row[-1]
            kib = _num(last["bytes_held"] / 1024 if last else None)
            pre = _num(sum(x["prefill_us_per_token"] for x in row if x) / max(1, sum(1 for x in row if x)), ".0f")
            dec = _num(last["decode_ms_per_token"] if last else None)
            flag = "*" if passed is False else ""
            out.append(f"| {m} | {seed}{flag} | {acc} | {closed} | {kept} | {_num(a, '.2f')} | {kib} | {pre} | {dec} |")
    return out + [""]


def pooled_lines(p: AgentPreset, r: dict) -> list[str]:
    """Per method and length, over the counted seeds: accuracy per kind and kept keys."""
    if not r["pooled"]:
        return []
    out = [
        f"## Per question kind, pooled over the counted seeds {r['counted_seeds']}",
        "",
        "| method | length | open | " + " | ".join(KINDS) + " | kept keys | open calls held |",
        "|---|---|---:|" + "---:|" * len(KINDS) + "---:|---:|",
    ]
    for m, by_len in r["pooled"].items():
        for L, x in by_len.items():
            held = [r["runs"][m][str(s)][L]["open_calls_held"] for s in r["counted_seeds"]]
            cells = " | ".join(_pct(x["accuracy"][k]) for k in KINDS)
            out.append(
                f"| {m} | {_len(L)} | {_pct(x['accuracy']['open'])} | {cells} | {_num(x['kept_keys'], '.0f')} "
                f"| {_pct(sum(held) / len(held))} |"
            )
    note = (
        f"Open calls held: the share of open calls whose argument bytes some layer's best KV head holds >= {HELD:.0%}."
    )
    return out + ["", note, ""]


def diagnosis_lines(p: AgentPreset, r: dict) -> list[str]:
    """FPA's missed open questions: lost calls (evicted) against held but misread, and why."""
    if not r["diagnosis"]:
        return []
    out = [
        "## Diagnosis of FPA's misses",
        "",
        "A missed open question is *lost* when a call it needs is no longer held (no layer's best KV head holds "
        f">= {HELD:.0%} of its bytes), else *held*: the keys were there and the model misread them (dilution by the "
        f"other kept keys, or the task not learned). For a lost call, per layer, the part of the penalty of the head "
        f"that kept it longest that passed the threshold {p.threshold:g} alone: the walk's dip below the call's level "
        "(`dip`), the level offset (`offset`), `both`, or only their sum (`sum`).",
        "",
        "| length | open missed | lost | held | lost calls: depth 1 / 2 / 3 / 4 | causes (layer: cause x count) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for L, d in r["diagnosis"].items():
        depths = [sum(c["depth"] == k for c in d["lost_calls"]) for k in range(1, p.depth + 1)]
        causes: dict[str, int] = {}
        for c in d["lost_calls"]:
            for i, why in enumerate(c["cause"]):
                causes[f"L{i}: {why}"] = causes.get(f"L{i}: {why}", 0) + 1
        why = ", ".join(f"{k} x{v}" for k, v in sorted(causes.items())) or "-"
        out.append(
            f"| {_len(L)} | {d['open_missed']} | {d['lost']} | {d['held']} | {' / '.join(map(str, depths))} | {why} |"
        )
    return out + [""]


def training_lines(r: dict) -> list[str]:
    """Per arm and seed: steps, final training loss, the last answer loss, throughput."""
    if not any(r.get("training", {}).values()):
        return ["## Training", "", "Not run.", ""]
    out = [
        "## Training",
        "",
        "| arm | seed | steps | final loss | answer loss | tokens/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for arm, by_seed in r.get("training", {}).items():
        for seed, t in by_seed.items():
            curve = t.get("task_loss_curve") or []
            ans = curve[-1]["task_loss"] if curve else None
            out.append(
                f"| {arm} | {seed} | {t['steps']} | {_num(t['final_train_loss'], '.3f')} | {_num(ans, '.3f')} "
                f"| {_num(t['tokens_per_s'], ',.0f')} |"
            )
    return out + [""]


def markdown(r: dict) -> str:
    """The whole report."""
    from fpa.experiments.agent.workers import control_length

    p = AgentPreset.from_dict(r["preset"])
    prov = r.get("provenance", {})
    out = [
        f"# Long agent sessions: memory bounded by nesting depth (preset `{p.name}`)",
        "",
        f"Byte-level language models (`{p.model_preset}` with {p.model_overrides}) trained {p.steps} steps of "
        f"{p.batch_size} agent sessions of {p.seq_len} bytes (fpa.tasks.agent_sessions, depth <= "
        f"{TRAIN_SPEC.depth}, a question and its answer at the end) on seeds {list(p.seeds)}: `fpa-walk-rule`, "
        f"an FPA walk with {p.fpa_options} trained (from step {p.evict_from_step} on{_ramp(p)}) and served under "
        f"its own rule FPAEviction({p.threshold:g}, within chunks), and served as well with the full cache "
        f"(`fpa-full`) and, at its rule's memory, with a window, StreamingLLM (4 sinks), TOVA and H2O; `fox`, FoX with "
        f"{p.fox_overrides}, served with its own rule FoXEviction({p.fox_threshold:g}) (and with the full cache "
        "in its 1x control).",
        "",
        stages_line(p, r),
        "",
    ]
    if r["runs"]:
        out += [f"![memory and accuracy against session length]({PLOT})", ""]
    out += goal_lines(p, r) + control_lines(p, r, control_length(p)) + run_lines(p, r)
    out += pooled_lines(p, r) + diagnosis_lines(p, r) + training_lines(r)
    out += [
        "## Provenance",
        "",
        f"Command: `{prov.get('command', '-')}`; commit {prov.get('commit')}"
        + (" (uncommitted changes)" if prov.get("dirty") else "")
        + f"; wall time {prov.get('wall_s', 0) / 60:.1f} min.",
        "",
    ]
    return "\n".join(out)


def plot(r: dict, path: str | Path) -> None:
    """Kept keys per head (log-log) and open-question accuracy (log x) against session length,
    one line per method, the mean over the seeds that have it. Each method's points are shifted
    sideways by a few percent of the length (DODGE) so that methods with equal values stay visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fig, (ax_k, ax_a) = plt.subplots(1, 2, figsize=(11, 4.6))
    styles = dict(zip(METHODS, ["o-", "s--", "^:", "v-.", "D-", "P--", "X:"]))
    lengths: set[int] = set()
    for i, m in enumerate(METHODS):
        by_seed = r["runs"].get(m, {})
        Ls = sorted({int(L) for x in by_seed.values() for L in x})
        if not Ls:
            continue
        lengths.update(Ls)
        kept = [[x[str(L)]["kept_keys"] for x in by_seed.values() if str(L) in x] for L in Ls]
        acc = [[x[str(L)]["accuracy"]["open"] for x in by_seed.values() if str(L) in x] for L in Ls]
        xs = [L * (1 + DODGE * (i - (len(METHODS) - 1) / 2)) for L in Ls]
        ax_k.plot(xs, [sum(k) / len(k) for k in kept], styles[m], label=m, ms=5)
        ax_a.plot(xs, [sum(a) / len(a) for a in acc], styles[m], ms=5)
    ax_k.set(xscale="log", yscale="log", ylabel="kept keys per (layer, KV head)")
    ax_a.set(xscale="log", ylabel="accuracy, open questions", ylim=(-0.03, 1.03))
    ticks = sorted(lengths)
    for ax, title in ((ax_k, "memory after the session"), (ax_a, "answers that need the open calls")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("session length (bytes)")
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([_len(L) for L in ticks])
        ax.grid(alpha=0.3, which="both")
    fig.legend(loc="lower center", ncol=len(METHODS), fontsize=8, frameon=False)
    fig.suptitle("Long agent sessions (mean over seeds)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    atomic_write_figure(path, fig)


def write_report(r: dict, out_dir: str | Path) -> None:
    """Write ``report.md`` and the plot into ``out_dir``."""
    out = Path(out_dir)
    if r["runs"]:
        plot(r, out / PLOT)
    else:
        (out / PLOT).unlink(missing_ok=True)  # no decodes: no plot, and none left from an earlier report
    atomic_write_text(out / "report.md", markdown(r))
