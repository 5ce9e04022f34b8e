"""Training throughput (tokens/s) of the `tiny` preset for each attention type, on this machine.

Two measurements, written to one markdown file:

1. step micro-benchmark: forward + backward + AdamW step on random ids, median over repetitions,
   all attention types interleaved in one process; ratio to softmax-RoPE measured in the same run.
2. end to end through ``fpa.train.train`` (byte-level stdlib corpus, real data loading, LR schedule,
   clipping, metrics): one short run per attention type, one after another; median per-step tokens/s
   with the first step (warm-up) excluded.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from tqdm import tqdm

from fpa.models import FPAConfig, FPAForCausalLM

METHODS = [
    ("softmax_rope", {}), ("softmax_alibi", {}), ("softmax_nope", {}), ("fox", {}),
    ("fpa", {"fpa_mode": "free"}), ("fpa", {"fpa_mode": "walk"}),
]


def label(att: str, kw: dict) -> str:
    return f"fpa-{kw['fpa_mode']}" if att == "fpa" else att


def step_benchmark(batch: int, seq_len: int, reps: int) -> list[str]:
    torch.manual_seed(0)
    models, opts = {}, {}
    for att, kw in METHODS:
        m = FPAForCausalLM(FPAConfig.from_preset("tiny", attention=att, **kw))
        models[label(att, kw)] = m
        opts[label(att, kw)] = torch.optim.AdamW(m.parameters(), lr=1e-3)
    vocab = next(iter(models.values())).config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq_len))
    times: dict[str, list[float]] = {n: [] for n in models}
    for rep in tqdm(range(reps + 1), desc="step benchmark"):
        for name, m in models.items():
            t0 = time.perf_counter()
            m(input_ids=ids, labels=ids).loss.backward()
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            if rep > 0:  # rep 0 is the warm-up
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["softmax_rope"])
    lines = [
        "## 1. Step micro-benchmark",
        "",
        f"batch={batch}, seq_len={seq_len}, vocab 1024, fp32; forward+backward+AdamW step, median of {reps} after 1 "
        "warm-up, types interleaved in one process.",
        "",
        "| attention | params | step ms (median) | tokens/s | time ratio to softmax_rope |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in models.items():
        med = statistics.median(times[name])
        n_params = sum(p.numel() for p in m.parameters())
        lines.append(f"| {name} | {n_params:,} | {med * 1e3:.1f} | {batch * seq_len / med:,.0f} | {med / base:.2f} |")
    return lines


def train_benchmark(batch: int, seq_len: int, steps: int, workdir: str) -> list[str]:
    from fpa.data import prepare_corpus
    from fpa.train import TrainConfig, train
    from fpa.train.metrics import read_metrics

    data = prepare_corpus("stdlib", os.path.join(workdir, "data"), max_bytes=4_000_000)
    lines = [
        "## 2. End to end through `fpa.train.train`",
        "",
        f"byte-level stdlib corpus (vocab 257), batch={batch}, seq_len={seq_len}, {steps} steps per type, fp32, "
        "one run after another; median per-step tokens/s over steps 2..N (step time excludes eval and checkpoints).",
        "",
        "| attention | tokens/s (median step) | final train loss |",
        "|---|---:|---:|",
    ]
    for att, kw in METHODS:
        name = label(att, kw)
        cfg = TrainConfig(out_dir=os.path.join(workdir, name), data_dir=str(data), preset="tiny", attention=att,
                          fpa_mode=kw.get("fpa_mode", "free"), seq_len=seq_len, batch_size=batch, steps=steps,
                          warmup_steps=2, log_every=1, eval_every=steps, ckpt_every=steps, eval_batches=1,
                          progress=False)
        summary = train(cfg)
        rates = [r["tokens_per_s"] for r in read_metrics(cfg.out_dir)][1:]
        lines.append(f"| {name} | {statistics.median(rates):,.0f} | {summary['final_train_loss']:.3f} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--train-steps", type=int, default=12, help="steps per type in part 2 (0 skips it)")
    ap.add_argument("--out", default="benchmarks/results/train-throughput-cpu.md")
    args = ap.parse_args()
    lines = ["# Training throughput, `tiny` preset (CPU)", "",
             f"torch {torch.__version__}, threads={torch.get_num_threads()}. Shared machine: other jobs may run at the "
             "same time, so absolute numbers are noisy; part 1's ratios are more robust (types interleaved).", ""]
    lines += step_benchmark(args.batch, args.seq_len, args.reps)
    if args.train_steps > 0:
        with tempfile.TemporaryDirectory() as work:
            lines += [""] + train_benchmark(args.batch, args.seq_len, args.train_steps, work)
    text = "\n".join(lines) + "\n"
    print(text)
    from fpa.data.atomic import atomic_write_text

    atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
