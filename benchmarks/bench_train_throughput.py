"""Training-step throughput (tokens/s) of the `tiny` preset for each attention type, on this machine.

Forward + backward + AdamW step, median over repetitions, all attention types interleaved in one
process; reported as a ratio to softmax-RoPE measured in the same run. Writes a markdown table.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/train-throughput-cpu.md")
    args = ap.parse_args()
    torch.manual_seed(0)
    models, opts = {}, {}
    for att, kw in METHODS:
        cfg = FPAConfig.from_preset("tiny", attention=att, **kw)
        m = FPAForCausalLM(cfg)
        models[label(att, kw)] = m
        opts[label(att, kw)] = torch.optim.AdamW(m.parameters(), lr=1e-3)
    vocab = next(iter(models.values())).config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.seq_len))
    times: dict[str, list[float]] = {n: [] for n in models}
    for rep in tqdm(range(args.reps + 1), desc="reps"):
        for name, m in models.items():
            t0 = time.perf_counter()
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            if rep > 0:  # rep 0 is the warm-up
                times[name].append(time.perf_counter() - t0)
    tokens = args.batch * args.seq_len
    base = statistics.median(times["softmax_rope"])
    lines = [
        "# Training-step throughput, `tiny` preset (CPU)",
        "",
        f"batch={args.batch}, seq_len={args.seq_len}, fp32, torch {torch.__version__}, threads={torch.get_num_threads()}; "
        f"forward+backward+AdamW step, median of {args.reps} after 1 warm-up, types interleaved in one process.",
        "",
        "| attention | params | step ms (median) | tokens/s | time ratio to softmax_rope |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in models.items():
        med = statistics.median(times[name])
        n_params = sum(p.numel() for p in m.parameters())
        lines.append(f"| {name} | {n_params:,} | {med * 1e3:.1f} | {tokens / med:,.0f} | {med / base:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(args.out) or ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
