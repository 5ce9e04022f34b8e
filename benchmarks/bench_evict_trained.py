"""Models trained with FPA's eviction rule in the loop, served under the same rule: passkey accuracy
and kept fraction when the prompt is prefilled in chunks (the rule runs after each chunk) against
token by token (the rule runs after every token, exactly as in training) and in chunks under
``FPAEviction(T, within_chunks=True)`` (the rule inside each chunk: the same as token by token).

``fpa train --evict-threshold T`` masks key j out of query i once beta * dip(i - 1, j) > T for every
head of its KV group (fpa.layers.fpa_form.evicting_bias): what FPACache(FPAEviction(T)) does when
decoding token by token. A prefill chunk of C tokens evicts nothing inside the chunk, so its
queries see keys the model never saw in training. This script measures that mismatch on the
models of ``fpa reproduce`` (by default the rule-trained variants of ``--preset cpu-ablations``,
seed 10; ``fpa reproduce`` itself serves such models under the rule within chunks). The "full"
row turns the rule off (``set_training_eviction(None)``) and keeps every key.

    OMP_NUM_THREADS=1 python benchmarks/bench_evict_trained.py --run-dir results/reproduce-cpu-ablations
    # writes benchmarks/results/evict-trained-cpu.{json,md} (the committed file is from an earlier
    # run of models named -evict2, at commit-time names; rerun to regenerate it)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from fpa.cache import FPACache, FPAEviction
from fpa.data.atomic import atomic_write_bytes
from fpa.eval.passkey import passkey_grid
from fpa.experiments.lm.train_eval import load_model
from fpa.train.model_setup import set_training_eviction

DEFAULT_MODELS = "fpa-walk-rule-offsethead1-threshold2-s10,fpa-walk-rule-offsethead1-threshold2-from750-s10"


def evaluate(
    model_dir: Path,
    threshold: float,
    lengths: list[int],
    depths: list[float],
    trials: int,
    chunks: list[tuple[int | None, bool]],
) -> list[dict]:
    """One passkey grid per (prefill chunk size, rule within chunks?) (None: the full cache, no
    eviction, chunks of the largest size given)."""
    model, tok = load_model(model_dir, "cpu")
    set_training_eviction(model, None)  # the full row keeps every key; a cache's own policy decides the others
    rows = []
    for chunk, within in chunks:
        make = None
        if chunk is not None:

            def make(length: int, within=within):
                policy = FPAEviction(threshold, within_chunks=within)
                return FPACache(policy), policy

        t0 = time.perf_counter()
        g = passkey_grid(
            model,
            tok,
            lengths,
            depths,
            trials,
            seed=0,
            make_cache=make,
            chunk_size=chunk or max(c for c, _ in chunks if c),
            desc=f"{model_dir.parent.name} chunk {chunk}",
        )
        cache = "full" if chunk is None else f"FPAEviction({threshold:g}{', within_chunks=True' if within else ''})"
        rows.append(
            dict(
                cache=cache,
                chunk=chunk,
                accuracy_by_length=g["accuracy_by_length"],
                kept_by_length=[float(sum(k) / len(k)) for k in g["kept_fraction"]],
                example=g["examples"][0],
                seconds=round(time.perf_counter() - t0, 1),
            )
        )
        print(
            model_dir.parent.name,
            rows[-1]["cache"],
            "chunk",
            chunk,
            [round(a, 2) for a in rows[-1]["accuracy_by_length"]],
            flush=True,
        )
    return rows


def markdown(data: dict) -> str:
    a = data["args"]
    out = [
        "# Trained under the eviction rule, served under it: chunked against token-by-token prefill (CPU)",
        "",
        f"Models: `{a['run_dir']}/models/<name>/model` (`fpa reproduce`, trained with "
        f"`--evict-threshold {a['threshold']:g}`: the `from750` ones from step 750, the others from step 0). "
        f"Passkey exact match, {a['trials']} prompts x "
        f"{len(a['depths'])} depths per length (seed 0, the prompts of the reproduction's grid). 'chunk 1' "
        "prefills token by token, so the cache applies the rule after every token, as in training; "
        "`within_chunks=True` applies it inside each 128-token chunk as well, which computes the same.",
        "",
        "| model | cache | prefill chunk | " + " | ".join(f"{L}" for L in a["lengths"]) + " | kept (mean) |",
        "|---|---|---|" + "---|" * len(a["lengths"]) + "---|",
    ]
    for name, rows in data["models"].items():
        for r in rows:
            kept = sum(r["kept_by_length"]) / len(r["kept_by_length"])
            out.append(
                f"| {name} | {r['cache']} | {r['chunk'] or '-'} | "
                + " | ".join(f"{100 * x:.0f}%" for x in r["accuracy_by_length"])
                + f" | {100 * kept:.1f}% |"
            )
    out += [
        "",
        "Columns: prompt length in tokens (the training length is 128). Example answers at 128 tokens: "
        + "; ".join(
            f"{n}, {r['cache']}, chunk {r['chunk'] or '-'}: {r['example']['generated']!r} (key {r['example']['key']})"
            for n, rows in data["models"].items()
            for r in rows[:1] + rows[-1:]
        ),
        "",
        f"Wall time: {data['seconds'] / 60:.1f} min.",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", default="results/reproduce-cpu-ablations", help="an fpa reproduce output folder")
    p.add_argument("--models", default=DEFAULT_MODELS, help="comma list of run names (models/<name>/model)")
    p.add_argument("--threshold", type=float, default=2.0, help="the threshold the models were trained under")
    p.add_argument("--lengths", default="128,256,512,1024,2048")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument(
        "--chunks",
        default="0,128,128w,1",
        help="prefill chunk sizes; 0 = the full cache (no eviction), a trailing w = the rule within chunks",
    )
    p.add_argument("--out", default="benchmarks/results/evict-trained-cpu")
    args = p.parse_args(argv)
    if args.threshold < 0 or args.trials < 1:
        raise SystemExit(f"--threshold must be >= 0 and --trials >= 1, got {args.threshold}, {args.trials}")
    lengths = [int(x) for x in args.lengths.split(",")]
    chunks = [(int(x.rstrip("w")) or None, x.endswith("w")) for x in args.chunks.split(",")]
    depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    names = [n for n in args.models.split(",") if n]
    missing = [n for n in names if not (Path(args.run_dir) / "models" / n / "model").is_dir()]
    if missing:
        raise SystemExit(f"--models: no trained model under {args.run_dir}/models for {missing}")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    models = {
        n: evaluate(Path(args.run_dir) / "models" / n / "model", args.threshold, lengths, depths, args.trials, chunks)
        for n in names
    }
    data = dict(args=dict(vars(args), lengths=lengths, depths=depths), models=models, seconds=time.perf_counter() - t0)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out.with_suffix(".json"), json.dumps(data, indent=1).encode())
    md = markdown(data)
    atomic_write_bytes(out.with_suffix(".md"), md.encode())
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
