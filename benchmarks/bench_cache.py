"""Decode speed and KV-cache memory against sequence length: full cache vs FPA eviction.

For each configuration (full cache, FPAEviction at several thresholds) one cache grows through the
lengths: a chunked prefill of random tokens up to each length L, then ``--window`` decode steps
(one random token each) timed one by one -> tokens/s at L (1 / median step time); bytes held and
kept fraction are read after the window. The prefill's time is not reported. The loop is
benchmarks/cache_runs.py's, shared with benchmarks/bench_long_context.py.

The model: ``--model DIR`` loads a trained FPA checkpoint. Without it, the tiny preset
(FPAConfig.from_preset("tiny", attention="fpa", fpa={"mode": "free"})) at random init, beta = ``--beta``,
with every head's field and level rescaled to mean 0 and std ``--field-std`` on a random probe (at the
default init, weights std 0.02, a random model barely forgets, and heads whose level sits below
their field keep everything; the calibration makes every head's field move).
The eviction pattern of such a random field is NOT that of a trained model: the kept fractions
here measure the machinery (speed and memory at a given kept fraction), not what a trained
model would keep. The committed cache-cpu.* results use the paged store with the trained
fpa-walk-s0 of results/reproduce-cpu (legacy parametrisation) on random tokens;
benchmarks/bench_long_context.py measures it on text from 1k to 128k tokens.

    OMP_NUM_THREADS=1 python benchmarks/bench_cache.py            # writes benchmarks/results/cache-cpu.{md,png,json}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from cache_runs import grow_and_decode

from fpa.cache import FPAEviction
from fpa.data.atomic import atomic_write_bytes, atomic_write_figure
from fpa.models import FPAConfig, FPAForCausalLM


@torch.no_grad()
def calibrate_fields(model: FPAForCausalLM, std: float, probe_len: int = 512, seed: int = 0) -> None:
    """Give every head of a random free-mode FPA model a field and a level of mean 0 and std ``std``
    over a probe of random tokens (layer by layer, as later layers see the calibrated earlier ones):
    the projection rows are rescaled and the biases set to cancel the mean."""
    g = torch.Generator().manual_seed(seed)
    probe = torch.randint(0, model.config.vocab_size, (1, probe_len), generator=g)
    for block in model.model.layers:
        attn = block.attn
        seen: list[torch.Tensor] = []
        handle = attn.register_forward_pre_hook(lambda mod, a, seen=seen: seen.append(a[0]))
        model(probe)
        handle.remove()
        for lin in (attn.field_proj, attn.level_proj):
            y = lin(seen[0]).float()[0].T  # (H, T): one output per head
            mean, sd = y.mean(-1), y.std(-1).clamp_min(1e-6)
            lin.weight.mul_((std / sd)[:, None])
            lin.bias.copy_((lin.bias - mean) * std / sd)


def build_model(args) -> tuple[FPAForCausalLM, str]:
    """The model and a one-line description of it for the table header."""
    if args.model:
        m = FPAForCausalLM.from_pretrained(args.model).eval()
        return m, f"checkpoint `{args.model}`"
    torch.manual_seed(args.seed)
    m = FPAForCausalLM(FPAConfig.from_preset("tiny", attention="fpa", fpa={"mode": "free"})).eval()
    with torch.no_grad():
        for block in m.model.layers:
            block.attn.set_beta_(args.beta)
    calibrate_fields(m, args.field_std, seed=args.seed)
    return m, (
        f"tiny preset (attention=fpa, free), RANDOM init (seed {args.seed}) with every head's field and "
        f"level rescaled to mean 0, std {args.field_std} on a 512-token random probe; beta = {args.beta}"
    )


def markdown(rows: list[dict], header: str, args) -> str:
    configs = list(dict.fromkeys(r["config"] for r in rows))
    lengths = sorted({r["length"] for r in rows})
    cell = {(r["config"], r["length"]): r for r in rows}
    out = [
        "# KV cache: decode speed and memory vs length (CPU)",
        "",
        f"Model: {header}.",
        "",
        f"Per length L: chunked prefill (chunk {args.chunk}) up to L, then {args.window} timed decode steps "
        f"(tokens/s = 1 / median step time over the window; bytes held and kept fraction after it). Batch 1, "
        f"float32, "
        f"torch.get_num_threads() = {torch.get_num_threads()}. kept = keys held / keys seen over layers "
        "and KV heads. MiB = bytes the cache has allocated (keys, values, positions, levels, minima, holes, "
        "partial and free blocks, block tables); live = bytes of the kept keys alone.",
        "",
    ]
    out.append("| L | " + " | ".join(f"{c} tok/s | {c} MiB | {c} live MiB | {c} kept" for c in configs) + " |")
    out.append("|---:|" + "---:|---:|---:|---:|" * len(configs))
    for L in lengths:
        cells = []
        for c in configs:
            r = cell[(c, L)]
            cells.append(
                f"{r['tokens_per_s']:.1f} | {r['bytes_held'] / 2**20:.2f} | {r['bytes_live'] / 2**20:.2f} "
                f"| {r['kept_fraction']:.3f}"
            )
        out.append(f"| {L} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: Path, header: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 3, figsize=(13, 3.8))
    for c in dict.fromkeys(r["config"] for r in rows):
        rs = [r for r in rows if r["config"] == c]
        x = [r["length"] for r in rs]
        axs[0].plot(x, [r["tokens_per_s"] for r in rs], "o-", label=c)
        (line,) = axs[1].plot(x, [r["bytes_held"] / 2**20 for r in rs], "o-", label=c)
        axs[1].plot(x, [r["bytes_live"] / 2**20 for r in rs], ":", color=line.get_color())
        axs[2].plot(x, [r["kept_fraction"] for r in rs], "o-", label=c)
    for ax, title in zip(axs, ("decode tokens/s", "cache MiB allocated (dotted: kept keys only)", "kept fraction")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_title(title, fontsize=10)
    axs[1].set_yscale("log")
    axs[0].legend(fontsize=8)
    fig.suptitle(header, fontsize=8)
    atomic_write_figure(path, fig, dpi=110, bbox_inches="tight")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="trained FPA checkpoint directory (default: random tiny model)")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--thresholds", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    p.add_argument("--window", type=int, default=16, help="timed decode steps per length")
    p.add_argument("--chunk", type=int, default=1024, help="prefill chunk size")
    p.add_argument("--field-std", type=float, default=2.0, help="per-head std of the random model's field and level")
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--name", default="cache-cpu")
    args = p.parse_args(argv)
    if any(L <= 0 for L in args.lengths) or args.lengths != sorted(args.lengths):
        raise ValueError(f"--lengths must be positive and increasing, got {args.lengths}")
    model, header = build_model(args)
    policies = [None] + [FPAEviction(t) for t in args.thresholds]
    g = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, model.config.vocab_size, (1, args.lengths[-1] + args.window), generator=g)
    rows: list[dict] = []
    for policy in policies:  # results rewritten after each configuration, so a cut run keeps its part
        name = policy.name if policy else "full"
        rows += grow_and_decode(model, policy, tokens, args.lengths, args.chunk, args.window, name)
        write(rows, header, args)
    print(markdown(rows, header, args))


def write(rows: list[dict], header: str, args) -> None:
    atomic_write_bytes(args.out / f"{args.name}.json", json.dumps(dict(header=header, rows=rows), indent=1).encode())
    atomic_write_bytes(args.out / f"{args.name}.md", markdown(rows, header, args).encode())
    plot(rows, args.out / f"{args.name}.png", header)


if __name__ == "__main__":
    main()
