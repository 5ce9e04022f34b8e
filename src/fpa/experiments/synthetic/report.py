"""Outputs of the capacity experiment: results.json.gz, a markdown table, PNG heatmaps and learning curves.

Every file is written atomically (temporary file in the same folder, then os.replace).
``results.json.gz`` is compact JSON, gzip level 9; ``read_results`` also reads a plain ``results.json``.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from fpa.data.atomic import atomic_write_bytes, atomic_write_figure

RESULTS_NAME = "results.json.gz"


def results_path(folder: Path) -> Path | None:
    """The results file of a run folder: ``results.json.gz``, else a plain ``results.json``, else None."""
    for name in (RESULTS_NAME, "results.json"):
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def read_results(folder: Path) -> dict:
    """``{"meta": ..., "records": [...]}`` of a run folder (``results.json.gz`` or ``results.json``)."""
    path = results_path(folder)
    if path is None:
        raise FileNotFoundError(f"no {RESULTS_NAME} or results.json in {folder}")
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def write_results(out: Path, meta: dict, records: list[dict]) -> Path:
    """Write ``out/results.json.gz`` (compact JSON, gzip level 9, no timestamp: same input, same bytes)."""
    data = json.dumps({"meta": meta, "records": records}, separators=(",", ":")).encode()
    atomic_write_bytes(Path(out) / RESULTS_NAME, gzip.compress(data, compresslevel=9, mtime=0))
    return Path(out) / RESULTS_NAME


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_figure(fig, title: str, path: Path) -> Path:
    """Title, render to PNG, write atomically, close."""
    fig.suptitle(title, fontsize=10)
    atomic_write_figure(path, fig, bbox_inches="tight")
    return path


def _axes(records: list[dict]) -> tuple[list, list, list, list]:
    uniq = lambda k: sorted({r[k] for r in records}, key=lambda v: (str(type(v)), v))  # noqa: E731
    methods = list(dict.fromkeys(r["method"] for r in records))
    return uniq("task"), methods, uniq("dim"), uniq("m")


def _methods_of(records: list[dict], task: str) -> list[str]:
    """The methods with runs on ``task``, in first-seen order."""
    return list(dict.fromkeys(r["method"] for r in records if r["task"] == task))


def success_grid(
    records: list[dict], task: str, method: str, dims: list, ms: list
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dims x ms) success rate, min and mean target mass over seeds (NaN where no run)."""
    cell = defaultdict(list)
    for r in records:
        if r["task"] == task and r["method"] == method:
            cell[(r["dim"], r["m"])].append(r)
    rate, mass_min, mass_mean = (np.full((len(dims), len(ms)), np.nan) for _ in range(3))
    for i, d in enumerate(dims):
        for j, m in enumerate(ms):
            rs = cell.get((d, m))
            if rs:
                rate[i, j] = np.mean([r["success"] for r in rs])
                mass_min[i, j] = min(r["target_mass"] for r in rs)
                mass_mean[i, j] = np.mean([r["target_mass"] for r in rs])
    return rate, mass_min, mass_mean


def success_at_1x(r: dict) -> bool:
    """Target mass and accuracy >= 0.99 on the training-length held-out set alone."""
    from fpa.experiments.synthetic.capacity import ACC_TARGET, MASS_TARGET

    one = r["per_length"]["1x"]
    return bool(one["target_mass"] >= MASS_TARGET and one["accuracy"] >= ACC_TARGET)


def markdown_table(records: list[dict]) -> str:
    """Per task: rows (method, d), columns m; cells 'successes/seeds (mean target mass, mean accuracy)'."""
    tasks, methods, dims, ms = _axes(records)
    lines = ["# Capacity experiment: success = target mass >= 0.99 and accuracy >= 0.99 at 1x and 4x length", ""]
    for task in tasks:
        lines += [
            f"## task `{task}`",
            "",
            "| method | d | " + " | ".join(f"m={m}" for m in ms) + " |",
            "|---|---|" + "---|" * len(ms),
        ]
        for method in methods:
            for d in dims:
                cells = []
                for m in ms:
                    rs = [r for r in records if (r["task"], r["method"], r["dim"], r["m"]) == (task, method, d, m)]
                    if not rs:
                        cells.append("")
                        continue
                    ok = sum(r["success"] for r in rs)
                    mass = np.mean([r["target_mass"] for r in rs])
                    acc = np.mean([r["accuracy"] for r in rs])
                    cells.append(f"{ok}/{len(rs)} ({mass:.2f}, {acc:.2f})")
                if any(cells):
                    lines.append(f"| {method} | {d} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += ["| method | success at 1x | success at 1x and 4x |", "|---|---|---|"]
        for meth in methods:
            rs = [r for r in records if r["task"] == task and r["method"] == meth]
            if rs:
                lines.append(
                    f"| {meth} | {sum(map(success_at_1x, rs))}/{len(rs)} | {sum(r['success'] for r in rs)}/{len(rs)} |"
                )
        lines.append("")
    lines.append(
        "Cells: successful seeds / seeds (mean over seeds of target mass, of accuracy; each the min over "
        "the 1x and 4x held-out sets)."
    )
    return "\n".join(lines) + "\n"


def plot_heatmaps(records: list[dict], out: Path) -> list[Path]:
    """One PNG per task: a d x m success-rate heatmap per method (cell text: success rate over
    seeds, then mean target mass), one shared colour bar."""
    plt = _pyplot()
    tasks, methods, dims, ms = _axes(records)
    paths = []
    for task in tasks:
        methods = _methods_of(records, task)
        fig, axs = plt.subplots(
            1, len(methods), figsize=(2.9 * len(methods) + 1.0, 3.4), squeeze=False, sharey=True, layout="constrained"
        )
        image = None
        for k, (ax, method) in enumerate(zip(axs[0], methods)):
            rate, _, mass = success_grid(records, task, method, dims, ms)
            image = ax.imshow(rate, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
            for i in range(len(dims)):
                for j in range(len(ms)):
                    if not np.isnan(rate[i, j]):
                        ax.text(
                            j,
                            i,
                            f"{rate[i, j]:.1f}\n{mass[i, j]:.2f}",
                            ha="center",
                            va="center",
                            fontsize=6,
                            color="w" if rate[i, j] < 0.5 else "k",
                        )
            ax.set_xticks(range(len(ms)), [str(m) for m in ms])
            ax.set_yticks(range(len(dims)), [str(d) for d in dims])
            ax.set_xlabel("m (target keys / depth)", fontsize=8)
            if k == 0:
                ax.set_ylabel("head dim d", fontsize=8)
            ax.set_title(method, fontsize=9)
        fig.colorbar(image, ax=axs[0].tolist(), shrink=0.9, label="success rate over seeds")
        paths.append(
            _save_figure(
                fig,
                f"{task}: success rate (top number, colour) and mean target mass (bottom) per cell",
                out / f"heatmap_{task}.png",
            )
        )
    return paths


def plot_curves(records: list[dict], out: Path) -> list[Path]:
    """One PNG per task: rows = methods, columns = d; a line per m (mean training loss over seeds)."""
    plt = _pyplot()
    tasks, methods, dims, ms = _axes(records)
    paths = []
    colours = plt.cm.plasma(np.linspace(0, 0.9, len(ms)))
    for task in tasks:
        methods = _methods_of(records, task)
        fig, axs = plt.subplots(
            len(methods),
            len(dims),
            figsize=(2.3 * len(dims) + 1.2, 1.8 * len(methods) + 0.6),
            squeeze=False,
            sharex=True,
            sharey=True,
            layout="constrained",
        )
        for i, method in enumerate(methods):
            for j, d in enumerate(dims):
                ax = axs[i, j]
                for c, m in zip(colours, ms):
                    rs = [
                        r
                        for r in records
                        if (r["task"], r["method"], r["dim"], r["m"]) == (task, method, d, m) and r.get("curve")
                    ]  # records kept as a summary have no curve
                    if rs:
                        y = np.mean([r["curve"] for r in rs], 0)
                        ax.semilogy(
                            np.arange(len(y)) * rs[0]["curve_every"], np.maximum(y, 1e-6), color=c, label=f"m={m}", lw=1
                        )
                if i == 0:
                    ax.set_title(f"d={d}", fontsize=8)
                if j == 0:
                    ax.set_ylabel(f"{method}\nloss", fontsize=8)
                if i == len(methods) - 1:
                    ax.set_xlabel("training step", fontsize=8)
                ax.tick_params(labelsize=7)
        handles, labels = axs[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right center", fontsize=7, title="m", title_fontsize=7)
        paths.append(
            _save_figure(
                fig,
                f"{task}: training loss ((prediction - answer) / tolerance)^2, mean over seeds",
                out / f"curves_{task}.png",
            )
        )
    return paths


def write_all(records: list[dict], out: Path, meta: dict) -> list[Path]:
    """results.json.gz, results.md, heatmap_<task>.png, curves_<task>.png under ``out``."""
    out = Path(out)
    path = write_results(out, meta, records)
    atomic_write_bytes(out / "results.md", markdown_table(records).encode())
    return [path, out / "results.md"] + plot_heatmaps(records, out) + plot_curves(records, out)
