"""Memory bounded by nesting depth: bytes held and accuracy along a >= 100k-token agent trace.

One trace of the ``calls`` task (fpa.experiments.agent.trace.make_trace: calls open and return at
random with the depth capped, observations in between; answers read every 64 tokens) is decoded by
one-head models under three caches: the full cache, a sliding window of ``--window`` keys and
FPA's own rule (FPAEviction(``--threshold``)). Heads:

- ``trained walk``: the library's fpa-walk layer (level = field), one head, trained on short
  calls sequences (fpa.experiments.agent.trace.train_walk_head);
- ``trained walk+offset``: the same with a per-token level offset (TokenOffsetWalk in
  fpa.experiments.agent.trace: the library walk with level_offset="token", linear increments, softplus beta);
- ``constructed walk+offset``: TokenOffsetWalk with hand-set weights (no training): what the
  mechanism gives when the head is exactly right.

    OMP_NUM_THREADS=1 python benchmarks/bench_agent_trace.py   # writes benchmarks/results/agent-trace-cpu.*
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fpa.cache import FPAEviction, SlidingWindow
from fpa.data.atomic import atomic_write_bytes, atomic_write_figure
from fpa.experiments.agent.trace import (
    OneHotHead,
    constructed_offset_head,
    decode_trace,
    make_trace,
    summarise,
    train_walk_head,
)
from fpa.models.packed import PackedModels


def markdown(data: dict) -> str:
    a = data["args"]
    tr = data["trace"]
    out = [
        "# Agent trace: memory bounded by nesting depth (CPU)",
        "",
        f"Trace: {a['tokens']} tokens of the calls task, depth <= {a['max_depth']} (mean {tr['mean_depth']:.2f}), "
        f"p(call) = p(return) = {a['p']}, otherwise observations, answers read every 64 tokens "
        f"({tr['queries']} read-outs with an open call). Oldest open call at a read-out: median "
        f"{tr['median_oldest']} "
        f"tokens, max {tr['max_oldest']}; {100 * tr['frac_older']:.1f}% of the read-outs have an open call older "
        f"than the window ({a['window']} keys). Decoded in chunks of {a['chunk']} tokens (the policy runs after "
        f"each). Accuracy = answers within the task's tolerance (0.5 / depth) at the read-outs.",
        "",
        "| head | cache | accuracy | acc. (oldest call > window) | acc. (within window) | keys held at end "
        "| KiB held at 10k / 50k / end | max KiB | decode s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["runs"]:
        s = r["samples"]
        at = {x["tokens"]: x for x in s}

        def kib(n, at=at):
            near = min(at, key=lambda t: abs(t - n))
            return f"{at[near]['bytes_held'] / 1024:.1f}"

        out.append(
            f"| {r['head']} | {r['config']} | {r['accuracy']:.3f} | {r['accuracy_call_older_than_window']:.3f} "
            f"| {r['accuracy_call_within_window']:.3f} | {s[-1]['keys_held']} | {kib(10_000)} / {kib(50_000)} / "
            f"{kib(s[-1]['tokens'])} | {max(x['bytes_held'] for x in s) / 1024:.1f} | {r['seconds']:.0f} |"
        )
    out += [
        "",
        "Training (loss in tolerance units, last logged): "
        + ", ".join(f"{k}: {v['final_loss']:.3f} ({v['seconds']:.0f} s)" for k, v in data["training"].items()),
        "",
        f"Wall time: {data['wall_s'] / 60:.1f} min.",
    ]
    return "\n".join(out) + "\n"


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = list(dict.fromkeys(r["head"] for r in data["runs"]))
    fig, axs = plt.subplots(2, len(heads), figsize=(5 * len(heads), 7.5), squeeze=False)
    colors = {"full": "tab:gray", "window": "tab:orange", "fpa": "tab:blue"}
    style: dict[str, dict[str, Any]] = {
        "full": dict(ls="--", lw=2.5, alpha=0.7),
        "window": dict(lw=1.5),
        "fpa": dict(lw=1.5),
    }
    for j, h in enumerate(heads):
        for r in (r for r in data["runs"] if r["head"] == h):
            kind = r["config"].split("(")[0]
            s = r["samples"]
            axs[0, j].plot(
                [x["tokens"] / 1e3 for x in s],
                [x["bytes_held"] / 1024 for x in s],
                color=colors[kind],
                label=r["config"],
                **style[kind],
            )
            seg = np.linspace(0, data["args"]["tokens"] / 1e3, len(r["accuracy_along"]) + 1)
            axs[1, j].step(
                seg[1:], r["accuracy_along"], where="pre", color=colors[kind], label=r["config"], **style[kind]
            )
        axs[0, j].set_yscale("log")
        axs[0, j].set_title(f"{h}: KiB held", fontsize=10)
        axs[1, j].set_title(f"{h}: accuracy per 1/20 of the trace", fontsize=10)
        axs[1, j].set_ylim(0, 1.05)
        for ax in axs[:, j]:
            ax.set_xlabel("tokens (thousands)")
            ax.grid(alpha=0.3)
        axs[0, j].legend(fontsize=8)
        axs[1, j].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=100, bbox_inches="tight")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--max-depth", type=int, default=6)
    p.add_argument("--p", type=float, default=0.03, help="probability of a call (and of a return) per token")
    p.add_argument("--window", type=int, default=256, help="sliding-window budget (keys)")
    p.add_argument("--threshold", type=float, default=1.0, help="FPAEviction threshold")
    p.add_argument("--chunk", type=int, default=16, help="tokens per decoding call")
    p.add_argument("--steps", type=int, default=1000, help="training steps of the trained heads")
    p.add_argument("--heads", nargs="+", default=["constructed walk+offset", "trained walk", "trained walk+offset"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--name", default="agent-trace-cpu")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    trace = make_trace(args.tokens, args.max_depth, args.p, args.p, seed=args.seed + 1)
    q = trace.query & trace.valid
    data: dict[str, Any] = dict(
        args=vars(args) | {"out": str(args.out)},
        runs=[],
        training={},
        trace=dict(
            mean_depth=float(trace.depth.mean()),
            queries=int(q.sum()),
            median_oldest=int(np.median(trace.oldest[q])),
            max_oldest=int(trace.oldest.max()),
            frac_older=float((trace.oldest[q] >= args.window).mean()),
        ),
    )
    for head in args.heads:
        model: PackedModels | OneHotHead
        if head == "constructed walk+offset":
            model = constructed_offset_head()
        else:
            t0 = time.perf_counter()
            variant = "walk+offset" if head.endswith("offset") else "walk"
            model, losses = train_walk_head(steps=args.steps, seed=args.seed, variant=variant)
            data["training"][head] = dict(final_loss=losses[-1], seconds=time.perf_counter() - t0, losses=losses)
        for policy in (None, SlidingWindow(args.window), FPAEviction(args.threshold)):
            name = "full" if policy is None else policy.name
            run = decode_trace(model, trace, policy, chunk=args.chunk)
            s = summarise(name, run, trace, args.window)
            s["head"] = head
            data["runs"].append(s)
            print(
                f"{head:>24} {name:>14}: accuracy {s['accuracy']:.3f} (older than window "
                f"{s['accuracy_call_older_than_window']:.3f}), keys held at end {s['samples'][-1]['keys_held']}, "
                f"{s['seconds']:.0f} s",
                flush=True,
            )
        data["wall_s"] = time.perf_counter() - t_start
        atomic_write_bytes(args.out / f"{args.name}.json", json.dumps(data, indent=1).encode())
        atomic_write_bytes(args.out / f"{args.name}.md", markdown(data).encode())
        plot(data, args.out / f"{args.name}.png")
    print(markdown(data))


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
