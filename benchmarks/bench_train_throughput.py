"""Training throughput (tokens/s) of the `tiny` preset for each attention type, on this machine (CPU).

    python benchmarks/bench_train_throughput.py            # writes benchmarks/results/train-throughput-cpu.md

Per shape (default: tiny at batch 4 x 512, and the reproduction preset's shape: tiny with 2 layers,
vocab 257, batch 32 x 128): one training step = forward + backward + AdamW step on random ids,
with the optimizer groups of ``fpa.train.parameter_groups`` (FPA's field heads at their lr multiplier).
Every attention type, eager and compiled, is interleaved inside each repetition in one process,
so background load hits all alike; reported: median step time [min, max], tokens/s, and the
median per-repetition ratio to FoX (eager to eager, compiled to compiled).

Compiled: every decoder block ``block.compile(fullgraph=True, dynamic=False)`` (inductor); the
model's embedding, input-id check and loss stay eager. Compilation happens in the warm-up step
(its time is reported separately); the timed steps run with error_on_recompile, so a
recompilation across steps would stop the benchmark. ``--no-compile`` skips the compiled columns.
``--train-steps N`` adds an end-to-end run through ``fpa.train.train`` per type (real data).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import TypedDict

import torch

from fpa.models import FPAConfig, FPAForCausalLM

METHODS = [
    ("softmax_rope", {}),
    ("softmax_alibi", {}),
    ("softmax_nope", {}),
    ("fox", {}),
    ("fpa", {"fpa_mode": "free"}),
    ("fpa", {"fpa_mode": "walk"}),
]


class Shape(TypedDict):
    """step_benchmark's keyword arguments for one batch shape; overrides: FPAConfig fields."""

    batch: int
    seq_len: int
    overrides: dict[str, int]


SHAPES: dict[str, Shape] = {
    "tiny 4x512": Shape(batch=4, seq_len=512, overrides={}),
    "repro 32x128": Shape(batch=32, seq_len=128, overrides=dict(num_hidden_layers=2, vocab_size=257)),
}
TARGET = 1.15  # FPA walk / free step time <= 1.15x FoX's


def label(att: str, kw: dict) -> str:
    return f"fpa-{kw['fpa_mode']}" if att == "fpa" else att


def make_step(model: torch.nn.Module):
    from fpa.train import parameter_groups

    opt = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-3)
    for g in opt.param_groups:
        g["lr"] = 1e-3 * g["lr_multiplier"]

    def step(ids: torch.Tensor) -> float:
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    return step


def step_benchmark(name: str, batch: int, seq_len: int, overrides: dict, reps: int, compiled: bool) -> list[str]:
    # Every (type, shape) is its own graph of the shared block code: a fresh cache per shape, a limit
    # above the number of types; the timed steps then run with error_on_recompile.
    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = 4 * len(METHODS)
    steps, params, warm = {}, {}, {}
    for att, kw in METHODS:
        for comp in (False, True) if compiled else (False,):
            torch.manual_seed(0)
            m = FPAForCausalLM(FPAConfig.from_preset("tiny", attention=att, **kw, **overrides))
            if comp:
                for block in m.model.layers:
                    block.compile(fullgraph=True, dynamic=False)
            key = (label(att, kw), comp)
            steps[key], params[label(att, kw)] = make_step(m), sum(p.numel() for p in m.parameters())
    vocab = FPAConfig.from_preset("tiny", **overrides).vocab_size
    ids = torch.randint(0, vocab, (batch, seq_len))
    for key, step in steps.items():
        warm[key] = step(ids)  # compiles
    times: dict = {k: [] for k in steps}
    with torch._dynamo.config.patch(error_on_recompile=True):  # no recompilation across steps
        for _ in range(reps):
            for key, step in steps.items():
                times[key].append(step(ids))
    lines = [
        f"## {name}: batch {batch} x {seq_len}" + (f", {overrides}" if overrides else ""),
        "",
        f"Median of {reps} steps after the warm-up step [min, max]; ratio = median of per-repetition ratios to FoX.",
        "",
        "| attention | params | eager step ms | eager tokens/s | eager / FoX | compiled step ms | compiled tokens/s "
        "| compiled / FoX | compiled / eager | warm-up (compile) s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    tok = batch * seq_len

    def cells(key, ref):
        if key not in times:
            return ["—"] * 3
        t = times[key]
        r = [a / b for a, b in zip(t, times[ref])]
        med = statistics.median(t)
        return [
            f"{med * 1e3:.1f} [{min(t) * 1e3:.0f}, {max(t) * 1e3:.0f}]",
            f"{tok / med:,.0f}",
            f"{statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}]",
        ]

    for att, kw in METHODS:
        n = label(att, kw)
        e, c = cells((n, False), ("fox", False)), cells((n, True), ("fox", True))
        ce = "—"
        if (n, True) in times:
            ce = f"{statistics.median([a / b for a, b in zip(times[(n, True)], times[(n, False)])]):.2f}"
        wu = f"{warm[(n, True)]:.1f}" if (n, True) in warm else "—"
        lines.append(f"| {n} | {params[n]:,} | {' | '.join(e)} | {' | '.join(c)} | {ce} | {wu} |")
    lines.append("")
    for n in ("fpa-walk", "fpa-free"):
        for comp in (False, True) if compiled else (False,):
            r = statistics.median([a / b for a, b in zip(times[(n, comp)], times[("fox", comp)])])
            lines.append(
                f"- {n} {'compiled' if comp else 'eager'} step <= {TARGET}x FoX's: "
                f"**{'MET' if r <= TARGET else 'MISSED'}** ({r:.2f}x)"
            )
    return lines + [""]


def train_benchmark(batch: int, seq_len: int, steps: int, workdir: str) -> list[str]:
    from fpa.data import prepare_corpus
    from fpa.train import TrainConfig, train
    from fpa.train.metrics import read_metrics

    data = prepare_corpus("stdlib", os.path.join(workdir, "data"), max_bytes=4_000_000)
    lines = [
        "## End to end through `fpa.train.train`",
        "",
        f"byte-level stdlib corpus (vocab 257), batch={batch}, seq_len={seq_len}, {steps} steps per type, one run "
        "after another (not interleaved); median per-step tokens/s over steps 2..N.",
        "",
        "| attention | tokens/s (median step) | final train loss |",
        "|---|---:|---:|",
    ]
    for att, kw in METHODS:
        name = label(att, kw)
        cfg = TrainConfig(
            out_dir=os.path.join(workdir, name),
            data_dir=str(data),
            preset="tiny",
            attention=att,
            fpa_mode=kw.get("fpa_mode", "free"),
            seq_len=seq_len,
            batch_size=batch,
            steps=steps,
            warmup_steps=2,
            log_every=1,
            eval_every=steps,
            ckpt_every=steps,
            eval_batches=1,
            progress=False,
        )
        summary = train(cfg)
        rates = [r["tokens_per_s"] for r in read_metrics(cfg.out_dir)][1:]
        lines.append(f"| {name} | {statistics.median(rates):,.0f} | {summary['final_train_loss']:.3f} |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--train-steps", type=int, default=0, help="steps per type through fpa.train.train (0 skips)")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "train-throughput-cpu.md")
    )
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: the default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load0 = "/".join(f"{x:.2f}" for x in os.getloadavg())
    body: list[str] = []
    for name in args.shapes:
        body += step_benchmark(name, **SHAPES[name], reps=args.reps, compiled=not args.no_compile)
        print("\n".join(body), flush=True)
    if args.train_steps > 0:
        with tempfile.TemporaryDirectory() as work:
            body += train_benchmark(4, 512, args.train_steps, work)
    load1 = "/".join(f"{x:.2f}" for x in os.getloadavg())
    head = [
        "# Training throughput, `tiny` preset (CPU)",
        "",
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, {os.cpu_count()} CPUs, fp32. Load average "
        f"(1/5/15 min) at the start: {load0}; at the end: {load1}. All types and modes interleaved in one process "
        "(ratios hold under load; absolute numbers do not). Produced by `python "
        "benchmarks/bench_train_throughput.py`.",
        "",
    ]
    text = "\n".join(head + body)
    print(text)
    from fpa.data.atomic import atomic_write_text

    atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
