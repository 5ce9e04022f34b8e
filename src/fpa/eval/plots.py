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

    colours = matplotlib.colormaps["tab10"].colors
    out, main, extra = {}, [n for n in names if n not in dashed], [n for n in names if n in dashed]
    for i, n in enumerate(main):
        out[n] = dict(color=colours[i % 10], ls="-", marker=MARKERS[(i // 10) % len(MARKERS)])
    for i, n in enumerate(extra):
        j = i + len(main)
        out[n] = dict(color=colours[j % 10], ls="--", marker=MARKERS[(1 + j // 10) % len(MARKERS)])
    return out


def plot_loss_curves(curves: dict[str, list[float]], train_len: int, path: str | Path,
                     dashed: tuple[str, ...] = ()) -> None:
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


def plot_heatmap(grid: dict, train_len: int, title: str, path: str | Path) -> None:
    """Passkey accuracy (mean over seeds), rows = length multiple, columns = needle depth,
    annotated in percent, with a colour bar."""
    acc = np.asarray(grid["accuracy"])
    fig, ax = _figure(figsize=(2.2 + 0.9 * acc.shape[1], 1.4 + 0.5 * acc.shape[0]))
    im = ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(acc.shape[1]), [f"{100 * d:.0f}%" for d in grid["depths"]])
    ax.set_yticks(range(acc.shape[0]), [f"{n // train_len}x ({n})" for n in grid["lengths"]])
    for (i, j), a in np.ndenumerate(acc):
        ax.text(j, i, f"{100 * a:.0f}", ha="center", va="center", fontsize=8)
    ax.set_xlabel("needle depth")
    ax.set_ylabel("prompt length (tokens)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.05, pad=0.03, label="accuracy")
    _save(fig, path)


_STYLES = {"full": ("black", "s"), "fpa": ("tab:red", "o"), "fox": ("tab:blue", "D"), "window": ("tab:green", "^"),
           "streamingllm": ("tab:olive", "v"), "tova": ("tab:purple", "P"), "h2o": ("tab:brown", "X"),
           "+h2o": ("tab:pink", "*"), "+tova": ("tab:cyan", "p"), "+window": ("tab:orange", "h")}


def _style(policy: str) -> tuple:
    """(colour, marker, line style) of a policy; hybrids (own rule + budget) dashed."""
    if "+" in policy:
        return (*_STYLES["+" + policy.split("+", 1)[1]], "--")
    return (*_STYLES.get(policy, (None, "o")), "-")


def plot_cache_curves(curves: dict[str, dict[str, list[dict]]], multiple: str, path: str | Path, title: str) -> None:
    """Passkey accuracy at ``multiple`` x the training length against achieved kept fraction: one
    panel per method, one line per policy; markers are means over seeds, vertical bars min to max
    over seeds. curves[method][policy] = the policy's points (fpa.eval.aggregate)."""
    n = max(1, len(curves))
    fig, axes = _figure(1, n + 1, figsize=(4.2 * n + 2.6, 3.9), squeeze=False,
                        gridspec_kw={"width_ratios": [1] * n + [0.55]})
    legend = {}
    for ax, (method, by_policy) in zip(axes[0], curves.items()):
        for policy, pts in by_policy.items():
            pts = sorted(pts, key=lambda q: q["kept_fraction"])
            x = [q["kept_fraction"] for q in pts]
            y = np.asarray([q["accuracy_by_multiple"][multiple] for q in pts])
            # the mean of equal values can sit an ulp outside [min, max]; matplotlib refuses negative errors
            lo = np.clip(y - np.asarray([q["accuracy_min_by_multiple"][multiple] for q in pts]), 0.0, None)
            hi = np.clip(np.asarray([q["accuracy_max_by_multiple"][multiple] for q in pts]) - y, 0.0, None)
            color, marker, ls = _style(policy)
            label = {"fpa": "FPA own rule (tau sweep)", "fox": "FoX own rule (tau sweep)",
                     "full": "full cache"}.get(policy, policy)
            ax.errorbar(x, y, yerr=[lo, hi], color=color, marker=marker, ms=5, lw=1.2, capsize=2, label=label,
                        ls="none" if policy == "full" else ls)
        ax.axvline(0.25, color="grey", ls=":", lw=0.8)
        ax.set_title(method, fontsize=10)
        ax.set_xlabel("kept fraction of the KV cache (achieved)")
        ax.set_xlim(0, 1.05)
        ax.set_ylim(-0.05, 1.05)
        for h, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab.replace("fox+", "own rule+").replace("fpa+", "own rule+"), h)
    axes[0][0].set_ylabel(f"passkey accuracy at {multiple}x")
    axes[0][-1].axis("off")
    axes[0][-1].legend(list(legend.values()), list(legend), fontsize=8, loc="center left", frameon=False,
                       title="policy (bars: min-max over seeds)", title_fontsize=8)
    fig.suptitle(title, fontsize=10)
    _save(fig, path)


def _legend(ax, n: int) -> None:
    """In the axes for a few series; beside them, in one column, for many."""
    if n > 6:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=8)


def plot_task_curves(curves: dict[str, dict], path: str | Path, floor: float | None = None,
                     dashed: tuple[str, ...] = ()) -> None:
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


def plot_example(ex: dict, title: str, path: str | Path) -> None:
    """Field and level of one head, its live set over time (query x key), its answer attention."""
    import torch

    from fpa.ops.field import live_keys

    field, level = np.asarray(ex["field"]), np.asarray(ex["level"])
    live = live_keys(torch.tensor(field), torch.tensor(level)).numpy()
    a, b = ex["needle_start"], ex["needle_start"] + ex["needle_len"]
    fig, ax = _figure(1, 3, figsize=(14, 4))
    if np.array_equal(field, level):  # walk mode without a level offset
        ax[0].plot(field, lw=0.8, label="field = level")
    else:
        ax[0].plot(field, lw=0.8, label="field")
        ax[0].plot(level, lw=0.8, label="level")
    ax[1].imshow(live, cmap="Greys", interpolation="nearest", aspect="auto")
    ax[2].plot(ex["attention"], lw=0.8)
    for x in (ax[0], ax[2]):
        x.axvspan(a, b, color="gold", alpha=0.3, label="needle")
        x.set_xlabel("position")
    ax[0].set_title("field and level", fontsize=9)
    ax[0].set_ylabel("value (penalty = beta x dip)")
    ax[0].legend(fontsize=7)
    ax[1].axvspan(a, b, color="gold", alpha=0.3)
    ax[1].set_xlabel("key position")
    ax[1].set_ylabel("query position")
    ax[2].set_ylabel("attention weight")
    ax[1].set_title(f"live keys (black): query (rows) x key; live at the end: {int(live[-1].sum())}/{len(field)}",
                    fontsize=9)
    ax[2].set_title(f"attention of the answer token (needle mass {ex['needle_mass']:.2f})", fontsize=9)
    fig.suptitle(title, fontsize=10)
    _save(fig, path)
