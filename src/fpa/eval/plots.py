"""PNG figures of the reproduction report (matplotlib, Agg backend, atomic writes)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from fpa.data.atomic import atomic_write


def _figure(*args, **kw):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kw)


def _save(fig, path: str | Path) -> None:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, lambda f: f.write(buf.getvalue()))


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Moving average (valid part) of y (T,) over ``window`` positions -> (T - window + 1,)."""
    window = max(1, min(int(window), len(y)))
    c = np.cumsum(np.concatenate([[0.0], np.asarray(y, dtype=float)]))
    return (c[window:] - c[:-window]) / window


def plot_loss_curves(curves: dict[str, list[float]], train_len: int, path: str | Path) -> None:
    """Per-position held-out loss (T,) per method, smoothed over train_len / 8 positions."""
    fig, ax = _figure(figsize=(7, 4))
    w = max(1, train_len // 8)
    for name, y in curves.items():
        s = smooth(np.asarray(y), w)
        ax.plot(np.arange(len(s)) + w, s, label=name, lw=1.2)
    ax.axvline(train_len, color="k", ls="--", lw=0.8, label="training length")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(f"loss (nats/token, moving average of {w})")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_heatmap(grid: dict, train_len: int, title: str, path: str | Path) -> None:
    """Passkey accuracy, rows = length multiple, columns = needle depth, annotated."""
    acc = np.asarray(grid["accuracy"])
    fig, ax = _figure(figsize=(1.0 + 0.8 * acc.shape[1], 1.2 + 0.5 * acc.shape[0]))
    ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(acc.shape[1]), [f"{100 * d:.0f}%" for d in grid["depths"]])
    ax.set_yticks(range(acc.shape[0]), [f"{n // train_len}x ({n})" for n in grid["lengths"]])
    for (i, j), a in np.ndenumerate(acc):
        ax.text(j, i, f"{100 * a:.0f}", ha="center", va="center", fontsize=8)
    ax.set_xlabel("needle depth")
    ax.set_ylabel("prompt length")
    ax.set_title(title, fontsize=9)
    _save(fig, path)


def plot_kept(points: dict[str, dict[str, list[tuple[float, float]]]], path: str | Path, title: str) -> None:
    """Passkey accuracy against achieved kept fraction: one panel per method, one line per policy.
    points[method][policy] = [(kept fraction, accuracy), ...]."""
    n = max(1, len(points))
    fig, axes = _figure(1, n, figsize=(3.2 * n, 3.2), squeeze=False)
    for ax, (method, by_policy) in zip(axes[0], points.items()):
        for policy, pts in by_policy.items():
            pts = sorted(pts)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        ax.set_title(method, fontsize=9)
        ax.set_xlabel("kept fraction (achieved)")
        ax.set_xlim(0, 1.05)
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("passkey accuracy")
    fig.suptitle(title, fontsize=9)
    _save(fig, path)


def plot_example(ex: dict, title: str, path: str | Path) -> None:
    """Field and level of one head, its live set over time (query x key), its answer attention."""
    import torch

    from fpa.ops.field import live_keys

    field, level = np.asarray(ex["field"]), np.asarray(ex["level"])
    live = live_keys(torch.tensor(field), torch.tensor(level)).numpy()
    a, b = ex["needle_start"], ex["needle_start"] + ex["needle_len"]
    fig, ax = _figure(1, 3, figsize=(14, 4))
    ax[0].plot(field, lw=0.8, label="field")
    ax[0].plot(level, lw=0.8, label="level")
    ax[1].imshow(live, cmap="Greys", interpolation="nearest", aspect="auto")
    ax[2].plot(ex["attention"], lw=0.8)
    for x in (ax[0], ax[2]):
        x.axvspan(a, b, color="gold", alpha=0.3, label="needle")
        x.set_xlabel("position")
    ax[0].set_title("field and level", fontsize=9)
    ax[0].legend(fontsize=7)
    ax[1].axvspan(a, b, color="gold", alpha=0.3)
    ax[1].set_title(f"live keys (black): query (rows) x key; live at the end: {int(live[-1].sum())}/{len(field)}",
                    fontsize=9)
    ax[2].set_title(f"attention of the answer token (needle mass {ex['needle_mass']:.2f})", fontsize=9)
    fig.suptitle(title, fontsize=10)
    _save(fig, path)
