"""Long-context decoding on the paged KV cache: speed and memory from 1k to 128k tokens.

For each configuration one cache grows through the lengths: a chunked prefill (``--chunk``; the
policy runs after every chunk) up to each length L, then ``--window`` decode steps timed one by
one (ms/token = median step time). Read after the window: bytes held (every allocated byte of the
cache), bytes of the kept keys alone, kept fraction; and the cache's high-water mark during the
prefill segment that reached L (``FPACache.peak_bytes``: measured after each forward call, before
the policy runs, so it includes the chunk). The text is Python standard-library source (UTF-8
bytes, the byte tokenizer of the reproduction's models), files in a fixed shuffled order. The
loop is benchmarks/cache_runs.py's, shared with benchmarks/bench_cache.py.

Configurations: ``full`` (no policy), ``fpa(threshold=A)``, ``fpa(threshold=B)`` (FPAEviction), ``window(N)``
and ``h2o(N)`` on the FPA checkpoint (``--model``); ``fox(threshold=C)`` (FoXEviction) on the FoX
checkpoint (``--fox-model``). Checkpoints are not in git: they come from ``fpa reproduce``, e.g.
``runs/reproduce-cpu/models/fpa-walk-s0/model``.

    OMP_NUM_THREADS=1 python benchmarks/bench_long_context.py --model M --fox-model F
    # writes benchmarks/results/long-context-cpu.{md,json,png}; --configs picks a subset and
    # merges into an existing JSON (re-run one configuration without redoing the others)
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from cache_runs import MiB, grow_and_decode

from fpa.cache import H2O, FoXEviction, FPAEviction, Policy, SlidingWindow
from fpa.data.atomic import atomic_write_bytes, atomic_write_figure
from fpa.data.sources import stdlib_files
from fpa.models import FPAForCausalLM


def text_tokens(n: int, seed: int = 0) -> torch.Tensor:
    """(1, n) byte ids of standard-library source files (shuffled with ``seed``), 256 between files."""
    files = stdlib_files()
    random.Random(seed).shuffle(files)
    ids: list[int] = []
    for f in files:
        try:
            ids += list(f.read_bytes()) + [256]
        except OSError:
            continue
        if len(ids) >= n:
            break
    if len(ids) < n:
        raise ValueError(f"the standard library holds fewer than {n} bytes of text")
    return torch.tensor(ids[:n])[None]


def configs(args) -> dict[str, tuple[str, Callable[[], Policy | None]]]:
    """name -> (model key, policy factory)."""
    out: dict[str, tuple[str, Callable[[], Policy | None]]] = {"full": ("fpa", lambda: None)}
    for t in args.thresholds:
        out[f"fpa(threshold={t:g})"] = ("fpa", functools.partial(FPAEviction, t))
    out[f"window(N={args.budget})"] = ("fpa", lambda: SlidingWindow(args.budget))
    out[f"h2o(N={args.budget})"] = ("fpa", lambda: H2O(args.budget))
    if args.fox_model:
        out[f"fox(threshold={args.fox_threshold:g})"] = ("fox", lambda: FoXEviction(args.fox_threshold))
    return out


def growth_exponent(rows: list[dict]) -> float:
    """Slope of log(ms/token) against log(length) over the upper half of the lengths."""
    rs = sorted(rows, key=lambda r: r["length"])[len(rows) // 2 :]
    if len(rs) < 2:
        return float("nan")
    import math

    xs = [math.log(r["length"]) for r in rs]
    ys = [math.log(r["ms_per_token"]) for r in rs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _names(rows: list[dict]) -> list[str]:
    """Configuration names, the full cache first."""
    names = list(dict.fromkeys(r["config"] for r in rows))
    return sorted(names, key=lambda c: c != "full")


def markdown(data: dict) -> str:
    rows = data["rows"]
    names = _names(rows)
    lengths = sorted({r["length"] for r in rows})
    cell = {(r["config"], r["length"]): r for r in rows}
    full_bytes = {r["length"]: r["bytes_held"] for r in rows if r["config"] == "full"}
    out = [
        "# Long-context decoding on the paged KV cache (CPU)",
        "",
        data["header"],
        "",
        "ms = median decode step (one token, batch 1) after a chunked prefill to L; held = every byte the cache "
        "allocated (pool incl. holes, partial and free blocks, block tables); kept = bytes of the kept keys "
        "alone; held/kept is the storage overhead (target <= 1.15 + a fixed allowance); peak = the cache's "
        "high-water mark during the prefill to L (after each chunk, before eviction). MiB.",
        "",
    ]
    for title, key, fmt in (
        ("Decode ms per token", "ms_per_token", "{:.2f}"),
        ("Bytes held, MiB", "bytes_held", "mib"),
        ("Bytes of the kept keys, MiB", "bytes_live", "mib"),
        ("held / kept", None, "ratio"),
        ("Kept fraction (keys held / keys seen)", "kept_fraction", "{:.3f}"),
        ("Peak cache MiB during the prefill", "peak_bytes", "mib"),
    ):
        out += [f"## {title}", "", "| L | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
        for L in lengths:
            cells = []
            for c in names:
                r = cell.get((c, L))
                if r is None:
                    cells.append("-")
                elif fmt == "mib":
                    cells.append(f"{r[key] / MiB:.2f}")
                elif fmt == "ratio":
                    cells.append(f"{r['bytes_held'] / max(r['bytes_live'], 1):.3f}")
                else:
                    cells.append(fmt.format(r[key]))
            out.append(f"| {L} | " + " | ".join(cells) + " |")
        out.append("")
    out += [
        "## Growth of decode time with length",
        "",
        "Exponent k of ms/token ~ L^k, fitted over the upper half of the lengths (1 = linear in the keys "
        "held, 0 = flat):",
        "",
    ]
    for c in names:
        out.append(f"- {c}: k = {growth_exponent([r for r in rows if r['config'] == c]):.2f}")
    if full_bytes:
        out += ["", "Bytes held as a fraction of the full cache at the longest common length:", ""]
        L = max(full_bytes)
        for c in names:
            r = cell.get((c, L))
            if r is not None and c != "full":
                held = r["bytes_held"] / full_bytes[L]
                out.append(
                    f"- {c}: kept {r['kept_fraction']:.3f} of the keys, holds {held:.3f} "
                    f"of the full cache's bytes (L = {L})"
                )
    walls = ", ".join(f"{k} {v / 60:.1f}" for k, v in data.get("wall_by_config", {}).items())
    out += ["", f"Wall time of the runs that produced this table: {data.get('wall_s', 0) / 60:.1f} min ({walls})."]
    return "\n".join(out) + "\n"


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    fig, axs = plt.subplots(1, 3, figsize=(14, 4.2))
    styles = ["o-", "s-", "^-", "v-", "D-", "x-", "P-"]
    for i, c in enumerate(_names(rows)):
        rs = sorted((r for r in rows if r["config"] == c), key=lambda r: r["length"])
        x = [r["length"] for r in rs]
        (line,) = axs[0].plot(x, [r["ms_per_token"] for r in rs], styles[i % len(styles)], label=c, ms=4)
        axs[1].plot(x, [r["bytes_held"] / MiB for r in rs], styles[i % len(styles)], color=line.get_color(), ms=4)
        axs[1].plot(x, [r["bytes_live"] / MiB for r in rs], ":", color=line.get_color())
        axs[2].plot(x, [r["peak_bytes"] / MiB for r in rs], styles[i % len(styles)], color=line.get_color(), ms=4)
    for ax, title in zip(
        axs, ("decode ms per token", "MiB held (dotted: kept keys only)", "peak cache MiB during prefill")
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length (tokens)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axs[0].legend(fontsize=8)
    fig.suptitle(data["header"], fontsize=8)
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=110, bbox_inches="tight")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, type=Path, help="trained FPA checkpoint directory (fpa reproduce)")
    p.add_argument("--fox-model", type=Path, default=None, help="trained FoX checkpoint for FoX's own rule")
    p.add_argument("--lengths", type=int, nargs="+", default=[2**i for i in range(10, 18)])
    p.add_argument("--thresholds", type=float, nargs="+", default=[2.0, 8.0], help="FPAEviction thresholds")
    p.add_argument("--fox-threshold", type=float, default=8.0)
    p.add_argument("--budget", type=int, default=1024, help="keys per KV head for window and H2O")
    p.add_argument("--window", type=int, default=16, help="timed decode steps per length")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk size")
    p.add_argument("--configs", nargs="+", default=None, help="run only these configuration names; merge into --out")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--name", default="long-context-cpu")
    args = p.parse_args(argv)
    if any(L <= 0 for L in args.lengths) or args.lengths != sorted(args.lengths):
        raise ValueError(f"--lengths must be positive and increasing, got {args.lengths}")
    for flag, path in (("--model", args.model), ("--fox-model", args.fox_model)):
        if path is not None and not (path / "config.json").is_file():
            raise ValueError(f"{flag} must be a checkpoint directory with config.json, got {path}")
    todo = configs(args)
    if args.configs:
        unknown = set(args.configs) - set(todo)
        if unknown:
            raise ValueError(f"--configs: unknown {sorted(unknown)}; choose from {sorted(todo)}")
        todo = {k: v for k, v in todo.items() if k in args.configs}
    models = {"fpa": FPAForCausalLM.from_pretrained(args.model).eval()}
    if args.fox_model:
        models["fox"] = FPAForCausalLM.from_pretrained(args.fox_model).eval()
    tokens = text_tokens(max(args.lengths) + args.window)
    path = args.out / f"{args.name}.json"
    data: dict[str, Any] = (
        json.loads(path.read_text()) if (args.configs and path.exists()) else {"rows": [], "wall_s": 0.0}
    )
    data["header"] = (
        f"FPA model `{args.model}`"
        + (f", FoX model `{args.fox_model}`" if args.fox_model else "")
        + f"; chunk {args.chunk}, {args.window} timed decode steps per length, budget {args.budget} "
        f"keys per KV head for window/H2O; torch threads {torch.get_num_threads()}; float32, batch 1."
    )
    for name, (key, make) in todo.items():
        t0 = time.perf_counter()
        rows = grow_and_decode(models[key], make(), tokens, args.lengths, args.chunk, args.window, name)
        data["rows"] = [r for r in data["rows"] if r["config"] != name] + rows
        data.setdefault("wall_by_config", {})[name] = time.perf_counter() - t0
        data["wall_s"] = sum(data["wall_by_config"].values())
        atomic_write_bytes(path, json.dumps(data, indent=1).encode())
        atomic_write_bytes(args.out / f"{args.name}.md", markdown(data).encode())
        plot(data, args.out / f"{args.name}.png")
    print(markdown(data))


if __name__ == "__main__":
    main()
