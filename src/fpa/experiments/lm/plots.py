"""PNG figures of the reproduction report (matplotlib, Agg backend, atomic writes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fpa.data.atomic import atomic_write_figure


def _figure(*args, **kw):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kw)


def _save(fig, path: str | Path) -> None:
    fig.tight_layout()
    atomic_write_figure(path, fig)


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Moving average (valid part) of y (T,) over ``window`` positions -> (T - window + 1,)."""
    window = max(1, min(int(window), len(y)))
    c = np.cumsum(np.concatenate([[0.0], np.asarray(y, dtype=float)]))
    return (c[window:] - c[:-window]) / window


MARKERS = ("o", "s", "^", "v", "D", "x", "P", "*")


def series_styles(names: list[str], dashed: tuple[str, ...] = ()) -> dict[str, dict]:
    """Matplotlib styles that tell every series apart: the main series (not in ``dashed``) solid,
    one tab10 colour each; the ``dashed`` ones dashed, cycling the colours with another marker
    per round of ten."""
    import matplotlib

    tab10 = matplotlib.colormaps["tab10"]
    colours = [tab10(i) for i in range(10)]  # (r, g, b, 1): the ten listed colours
    out, main, extra = {}, [n for n in names if n not in dashed], [n for n in names if n in dashed]
    for i, n in enumerate(main):
        out[n] = dict(color=colours[i % 10], ls="-", marker=MARKERS[(i // 10) % len(MARKERS)])
    for i, n in enumerate(extra):
        j = i + len(main)
        out[n] = dict(color=colours[j % 10], ls="--", marker=MARKERS[(1 + j // 10) % len(MARKERS)])
    return out


def plot_loss_curves(
    curves: dict[str, list[float]], train_len: int, path: str | Path, dashed: tuple[str, ...] = ()
) -> None:
    """Per-position held-out loss (T,) per method, smoothed over train_len / 8 positions; the
    methods named in ``dashed`` (ablations) drawn dashed."""
    fig, ax = _figure(figsize=(7 + (1.8 if len(curves) > 6 else 0), 4))
    w = max(1, train_len // 8)
    styles = series_styles(list(curves), dashed)
    for name, y in curves.items():
        s = smooth(np.asarray(y), w)
        st = styles[name]
        ax.plot(np.arange(len(s)) + w, s, label=name, lw=1.2, color=st["color"], ls=st["ls"])
    ax.axvline(train_len, color="k", ls=":", lw=0.8, label="training length")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(f"loss (nats/token, moving average of {w})")
    _legend(ax, len(curves))
    _save(fig, path)


def _legend(ax, n: int) -> None:
    """In the axes for a few series; beside them, in one column, for many."""
    if n > 6:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=8)


def plot_task_curves(
    curves: dict[str, dict], path: str | Path, floor: float | None = None, dashed: tuple[str, ...] = ()
) -> None:
    """Answer loss on fixed passkey samples against training step, per method: mean over seeds
    (line) and min to max (band); the methods in ``dashed`` (ablations, one seed) dashed.
    curves[method] = {"steps", "mean", "min", "max"}."""
    fig, ax = _figure(figsize=(7.5 + (1.8 if len(curves) > 6 else 0), 4.2))
    styles = series_styles(list(curves), dashed)
    for name, c in curves.items():
        if not c["steps"]:
            continue
        st = styles[name]
        ax.plot(c["steps"], c["mean"], ls=st["ls"], marker=st["marker"], color=st["color"], ms=3, lw=1.3, label=name)
        ax.fill_between(c["steps"], c["min"], c["max"], color=st["color"], alpha=0.15)
    if floor is not None:
        ax.axhline(floor, color="grey", ls=":", lw=0.8, label="no copying: (5/6) ln 10")
    ax.set_xlabel("training step")
    ax.set_ylabel("answer loss (nats/token)")
    ax.set_title("Passkey answer loss during training (band: min to max over seeds)", fontsize=10)
    _legend(ax, len(curves) + (floor is not None))
    _save(fig, path)


def plot_by_multiple(methods: dict[str, dict], path: str | Path, title: str, dashed: tuple[str, ...] = ()) -> None:
    """Full-cache passkey accuracy against length (multiples of the training length), per method:
    mean over seeds (line) and every seed (dots)."""
    fig, ax = _figure(figsize=(7.5, 4.2))
    styles = series_styles(list(methods), dashed)
    for i, (name, m) in enumerate(methods.items()):
        mults = m["passkey"]["multiples"]
        st = styles[name]
        ax.plot(
            mults,
            np.asarray(m["passkey"]["accuracy_by_multiple"]) * 100,
            color=st["color"],
            ls=st["ls"],
            marker=st["marker"],
            lw=1.4,
            label=f"{name} (n = {m['passkey']['n_seeds']})",
        )
        jitter = 1 + 0.04 * (i - len(methods) / 2)
        for s in m["seeds"]:
            ax.scatter(
                [k * jitter for k in mults],
                [100 * s["passkey_by_multiple"][str(k)] for k in mults],
                color=st["color"],
                s=9,
                alpha=0.45,
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(mults, [f"{k}x" for k in mults])
    ax.set_ylim(-3, 103)
    ax.set_xlabel("prompt length (multiple of the training length)")
    ax.set_ylabel("passkey accuracy (%)")
    ax.set_title(title, fontsize=10)
    _legend(ax, len(methods))
    _save(fig, path)


def plot_paired(diffs: dict[str, dict], path: str | Path, title: str) -> None:
    """Per-seed paired differences (dots) with their mean and 95% interval (bar), one column per
    comparison (its label names the pair a vs b). diffs[label] = {"diffs", "mean_diff", "ci95"}
    (already in display units)."""
    fig, ax = _figure(figsize=(6.5, 4))
    for i, d in enumerate(diffs.values()):
        x = np.full(len(d["diffs"]), i) + np.linspace(-0.12, 0.12, max(1, len(d["diffs"])))
        ax.scatter(x, d["diffs"], s=14, color="tab:blue", alpha=0.7, label="one seed" if i == 0 else None)
        lo, hi = d["ci95"]
        ax.errorbar(
            [i + 0.3],
            [d["mean_diff"]],
            yerr=[[d["mean_diff"] - lo], [hi - d["mean_diff"]]],
            fmt="o",
            color="k",
            capsize=4,
            label="mean, 95% bootstrap interval" if i == 0 else None,
        )
    ax.axhline(0, color="grey", lw=0.8, ls=":")
    ax.set_xticks(range(len(diffs)), list(diffs), fontsize=7, rotation=20, ha="right")
    ax.set_ylabel("a - b, per seed (points)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_eviction(evictions: dict[str, dict], path: str | Path) -> None:
    """Per core method, against length: kept fraction under its own rule, its accuracy, the full
    cache's and the equal-size window's (means over seeds)."""
    fig, axes = _figure(1, 2, figsize=(13, 4))
    styles = series_styles(list(evictions))
    for name, ev in evictions.items():
        mults = [int(k) for k in ev["by_multiple"]]
        by = ev["by_multiple"]
        st = styles[name]
        axes[0].plot(
            mults,
            [100 * np.mean(by[str(k)]["kept_fraction"]) for k in mults],
            color=st["color"],
            marker="o",
            label=f"{name} (threshold {ev['threshold']:g})",
        )
        for key, ls, what in (
            ("accuracy", "-", "own rule"),
            ("full_accuracy", ":", "full cache"),
            ("window_accuracy", "--", "window, same size"),
        ):
            axes[1].plot(
                mults,
                [100 * np.mean(by[str(k)][key]) for k in mults],
                color=st["color"],
                ls=ls,
                marker="o",
                ms=3,
                label=f"{name}: {what}",
            )
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(mults, [f"{k}x" for k in mults])
        ax.set_xlabel("prompt length (multiple of the training length)")
    axes[0].set_ylabel("kept fraction of keys (%)")
    axes[0].set_title("KV cache kept by the own rule", fontsize=10)
    axes[1].set_ylabel("passkey accuracy (%)")
    axes[1].set_ylim(-3, 103)
    axes[1].set_title("accuracy: own rule, full cache, equal-size window", fontsize=10)
    axes[0].legend(fontsize=8)
    # nine series: beside the panel, where they cover no curve
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)


def plot_growth(evictions: dict[str, dict], path: str | Path) -> None:
    """Kept keys per head against context length on held-out text (log-log), with the fitted exponent."""
    fig, ax = _figure(figsize=(6.5, 4.2))
    styles = series_styles(list(evictions))
    for name, ev in evictions.items():
        g = ev["growth"]
        ax.plot(
            g["lengths"],
            g["kept_keys"],
            color=styles[name]["color"],
            marker="o",
            label=f"{name}: a = {ev['keys_growth_exponent']:.2f}",
        )
    lens = np.asarray(next(iter(evictions.values()))["growth"]["lengths"], float)
    ax.plot(lens, lens, color="grey", ls=":", lw=0.8, label="full cache (a = 1)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("kept keys per head")
    ax.set_title("Kept keys ~ L^a under the own rule (mean over seeds)", fontsize=10)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_diagnosis(diagnosis: dict[str, dict], path: str | Path) -> None:
    """Needle mass of the retrieval head at 1x against 8x (left) and the needle's penalty at 1x
    against 8x (right), one point per inspected prompt, coloured by its cause."""
    fig, axes = _figure(1, 2, figsize=(10, 4))
    colours = {"forgetting": "tab:red", "dilution": "tab:blue"}
    for cause, c in colours.items():
        rows = [r for d in diagnosis.values() for r in d["prompts"] if r["cause"] == cause]
        axes[0].scatter([r["mass_1x"] for r in rows], [r["mass_8x"] for r in rows], color=c, s=14, label=cause)
        axes[1].scatter([r["penalty_1x"] for r in rows], [r["penalty_8x"] for r in rows], color=c, s=14, label=cause)
    axes[0].plot([0, 1], [0, 1], color="grey", ls=":", lw=0.8)
    axes[0].set_xlabel("needle mass at 1x")
    axes[0].set_ylabel("needle mass at 8x")
    axes[1].set_xlabel("needle penalty beta x dip at 1x")
    axes[1].set_ylabel("needle penalty at 8x")
    lim = max([1.0] + [max(r["penalty_1x"], r["penalty_8x"]) for d in diagnosis.values() for r in d["prompts"]])
    axes[1].plot([0, lim], [0, lim], color="grey", ls=":", lw=0.8)
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle("FPA walk misses at 8x: retrieval head, one point per inspected prompt", fontsize=10)
    _save(fig, path)


def plot_tuning(rows: list[dict], multiples: list[int], path: str | Path) -> None:
    """Validation passkey accuracy against length per configuration, one panel per arm (the name
    before the configuration's brackets: fpa-walk, fox, fpa-walk-rule)."""

    def arm(r: dict) -> str:
        return r["name"].split("[", 1)[0]

    arms = list(dict.fromkeys(arm(r) for r in rows))
    fig, axes = _figure(1, len(arms), figsize=(5.5 * len(arms), 4), squeeze=False)
    for ax, base in zip(axes[0], arms):
        mine = [r for r in rows if arm(r) == base]
        styles = series_styles([r["name"] for r in mine])
        for r in mine:
            st = styles[r["name"]]
            ax.plot(
                multiples,
                np.asarray(r["val_passkey_by_length"]) * 100,
                color=st["color"],
                marker=st["marker"],
                label=f"{r['name'][len(base) :] or base} (loss {r['val_loss']:.3f})",
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(multiples, [f"{k}x" for k in multiples])
        ax.set_ylim(-3, 103)
        ax.set_xlabel("prompt length (multiple of the training length)")
        ax.set_ylabel("validation passkey accuracy (%)")
        ax.set_title(f"{base}: configurations on the tuning seeds", fontsize=10)
        ax.legend(fontsize=7)
    _save(fig, path)
