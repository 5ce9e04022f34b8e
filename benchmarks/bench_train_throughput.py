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

First sections: FPA walk trained under its own eviction rule (``set_training_eviction``, what
``fpa train --evict-threshold`` does) against the plain walk and FoX, at the reproduction's shape
and at ``fpa agent``'s (per-token level offset, 16 x 512), the fast path and the dense reference
interleaved with them (``rule_benchmark``; target: <= 1.5x the plain step). ``--rule-only`` runs
those sections alone and replaces them in an existing table file, keeping the rest; ``--no-rule``
skips them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import TypedDict

import torch

from fpa.layers.options import walk_bias_matching_fox
from fpa.models import FPAConfig, FPAForCausalLM

METHODS = [
    ("softmax_rope", {}),
    ("softmax_alibi", {}),
    ("softmax_nope", {}),
    ("fox", {}),
    ("fpa", {"fpa": {"mode": "free"}}),
    ("fpa", {"fpa": {"mode": "walk"}}),
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
RULE_TARGET = 1.5  # FPA walk trained under its eviction rule: step time <= 1.5x the plain walk's
RULE_THRESHOLD = 2.0


def label(att: str, kw: dict) -> str:
    return f"fpa-{kw['fpa']['mode']}" if att == "fpa" else att


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


class RuleShape(Shape):
    """rule_benchmark's recipe: a Shape, and fpa: the walk's options; fox: FoX's config overrides
    (FoX is timed beside the walk, for the recipes' FoX arm)."""

    fpa: dict
    fox: dict


RULE_SHAPES: dict[str, RuleShape] = {
    # the reproduction's shape, the walk at its default start
    "repro 32x128": RuleShape(**SHAPES["repro 32x128"], fpa={}, fox={}),
    # fpa agent's recipe: a per-token level offset, 512-byte sessions
    "agent 16x512": RuleShape(
        batch=16,
        seq_len=512,
        overrides=SHAPES["repro 32x128"]["overrides"],
        fpa={"level_offset": "token", "walk_bias_init": walk_bias_matching_fox(2.0)},
        fox={"fox_fgate_bias_init": 2.0},
    ),
}
RULE_TITLE = "## FPA walk trained under its eviction rule"


def rule_benchmark(name: str, reps: int) -> list[str]:
    """FPA walk trained under FPAEviction(RULE_THRESHOLD) within chunks (set_training_eviction)
    against the plain walk and FoX at the recipe ``RULE_SHAPES[name]``, eager: the fast path
    (fpa.ops.fpa.evicting, the chunked op with evicted keys hidden) and the dense reference it
    replaced (fpa_form.evicting_bias + softmax), all interleaved."""
    import fpa.layers.first_passage as first_passage
    from fpa.layers.fpa_form import evicting_attention
    from fpa.train.model_setup import set_training_eviction

    shape = RULE_SHAPES[name]
    batch, seq_len, overrides = shape["batch"], shape["seq_len"], shape["overrides"]

    def dense(q, k, v, field, level, beta, threshold, scale, need_weights=False):
        out, w = evicting_attention(q, k, v, field, level, beta, threshold, scale, need_weights=True)
        return out, (w if need_weights else None)

    steps = {}
    for row in ("plain", "rule (fast path)", "rule (dense reference)", "FoX"):
        torch.manual_seed(0)
        if row == "FoX":
            cfg = FPAConfig.from_preset("tiny", attention="fox", **overrides, **shape["fox"])
        else:
            cfg = FPAConfig.from_preset("tiny", attention="fpa", fpa={"mode": "walk", **shape["fpa"]}, **overrides)
        m = FPAForCausalLM(cfg)
        if row.startswith("rule"):
            set_training_eviction(m, RULE_THRESHOLD)
        steps[row] = make_step(m)
    ids = torch.randint(0, overrides["vocab_size"], (batch, seq_len))
    real = first_passage.evicting_attention
    load0 = "/".join(f"{x:.2f}" for x in os.getloadavg())
    times: dict[str, list[float]] = {k: [] for k in steps}
    try:
        for rep in range(reps + 1):  # the first repetition warms up and is dropped
            for row, step in steps.items():
                first_passage.evicting_attention = dense if row == "rule (dense reference)" else real  # type: ignore[assignment]
                t = step(ids)
                if rep:
                    times[row].append(t)
    finally:
        first_passage.evicting_attention = real  # type: ignore[assignment]
    lines = [
        f"{RULE_TITLE}: {name}, batch {batch} x {seq_len}, {overrides}, eager",
        "",
        f"`set_training_eviction({RULE_THRESHOLD:g})` (FPAEviction({RULE_THRESHOLD:g}, within_chunks=True) in "
        f"the training loop) against the plain walk (options {shape['fpa'] or 'none beyond walk mode'}) and FoX "
        f"({shape['fox'] or 'defaults'}); median of {reps} steps after a warm-up step [min, max]; ratios = medians "
        f"of per-repetition ratios. torch threads={torch.get_num_threads()}; load average (1/5/15 min) at the "
        f"start: {load0}. `python benchmarks/bench_train_throughput.py --rule-only` reruns the rule sections alone.",
        "",
        "| model | step ms | tokens/s | / plain walk | / FoX |",
        "|---|---:|---:|---:|---:|",
    ]

    def ratio(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(times[a], times[b])]

    for row, t in times.items():
        med = statistics.median(t)
        rs = (ratio(row, "plain"), ratio(row, "FoX"))
        cells = [f"{statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}]" for r in rs]
        lines.append(
            f"| {row} | {med * 1e3:.1f} [{min(t) * 1e3:.0f}, {max(t) * 1e3:.0f}] | {batch * seq_len / med:,.0f} | "
            + " | ".join(cells)
            + " |"
        )
    r = statistics.median(ratio("rule (fast path)", "plain"))
    lines += [
        "",
        f"- FPA walk under its rule, step <= {RULE_TARGET}x the plain walk's: "
        f"**{'MET' if r <= RULE_TARGET else 'MISSED'}** ({r:.2f}x)",
        "",
    ]
    return lines


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
            fpa_mode=kw["fpa"]["mode"] if att == "fpa" else "walk",
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
    ap.add_argument("--no-rule", action="store_true", help="skip the training-under-the-eviction-rule section")
    ap.add_argument(
        "--rule-only",
        action="store_true",
        help="only the training-under-the-eviction-rule section, spliced into an existing --out file",
    )
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
    if not args.no_rule:
        for name in RULE_SHAPES:
            body += rule_benchmark(name, max(args.reps, 9))
            print("\n".join(body), flush=True)
    for name in [] if args.rule_only else args.shapes:
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
    if args.rule_only and os.path.isfile(args.out):
        text = splice_section("\n".join(body), open(args.out).read())
    print(text)
    from fpa.data.atomic import atomic_write_text

    atomic_write_text(args.out, text)


def splice_section(section: str, text: str) -> str:
    """``text`` (an earlier table file) with its training-under-the-rule sections replaced by
    ``section`` (put where the first of them was, else before the first section): ``--rule-only``
    keeps the rest."""
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")] + [len(lines)]
    kept: list[str] = lines[: starts[0]]
    at = None
    for a, b in zip(starts, starts[1:]):
        if lines[a].startswith(RULE_TITLE):
            at = len(kept) if at is None else at
        else:
            kept += lines[a:b]
    at = len(lines[: starts[0]]) if at is None else at
    kept[at:at] = section.rstrip("\n").split("\n") + [""]
    return "\n".join(kept)


if __name__ == "__main__":
    main()
