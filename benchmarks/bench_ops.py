"""CPU benchmark of First Passage Attention vs FoX vs SDPA (forward+backward time, peak memory).

Script, not a test. Usage:

    python benchmarks/bench_ops.py                                  # full run (~5 min on 2 cores)
    python benchmarks/bench_ops.py --seq-lens 512 1024 --reps 3     # quick check

Inputs: B=2, H=4, D=64, fp32; field = level = a walk; every input requires grad (q, k, v, field,
level; FoX's log-gates). Time: forward + backward of loss = (out * grad_out).sum().

Timing: all methods in one process; for each T one warm-up repetition, then ``--reps`` timed
repetitions with the methods interleaved inside each repetition, so background load hits all
methods alike. Reported: the median and the [min, max] spread of each method, and each ratio as
the median of the per-repetition ratios (paired, so it holds under load) with its spread.

Rows: "FPA chunked" / "FoX chunked" are the default CPU backends (fused C++ rows,
fpa.ops.cpu_kernels); "... torch ops" the same backends with FPA_CPU_KERNEL=0 (the bias built
with tensor ops, as before the fused rows); the dense reference and FoX as a dense SDPA mask
where they are cheap enough. Memory: each (T, method) once in a fresh subprocess, peak RSS
(VmHWM after /proc/self/clear_refs) minus the RSS once the inputs exist, MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

B, H, D = 2, 4, 64
DTYPE = torch.float32
METHODS = [
    "fpa_chunked",
    "fox_chunked",
    "sdpa_causal",
    "fpa_chunked_torchops",
    "fox_chunked_torchops",
    "fpa_reference",
    "fox_dense_sdpa",
]
LABELS = {
    "fpa_chunked": "FPA chunked",
    "fox_chunked": "FoX chunked",
    "sdpa_causal": "SDPA causal",
    "fpa_chunked_torchops": "FPA chunked, torch ops",
    "fox_chunked_torchops": "FoX chunked, torch ops",
    "fpa_reference": "FPA reference (dense)",
    "fox_dense_sdpa": "FoX dense-mask SDPA",
}
MAX_T = {"fpa_chunked_torchops": 1024, "fox_chunked_torchops": 1024, "fpa_reference": 1024, "fox_dense_sdpa": 2048}
TARGETS = [
    (2048, "fox_chunked", 1.1),
    (4096, "fox_chunked", 1.1),
    (2048, "sdpa_causal", 2.0),
    (4096, "sdpa_causal", 2.0),
]


def make_inputs(T: int, seed: int = 0, requires_grad: bool = True) -> dict:
    from fpa.ops import walk

    g = torch.Generator().manual_seed(seed)
    shape = (B, H, T, D)
    q, k, v = (torch.randn(shape, generator=g, dtype=DTYPE) for _ in range(3))
    field = walk(0.1 * torch.randn((B, H, T), generator=g, dtype=DTYPE))
    out = dict(
        q=q,
        k=k,
        v=v,
        field=field,
        level=field.clone(),
        log_f=F.logsigmoid(torch.randn((B, H, T), generator=g, dtype=DTYPE)),
    )
    for t in out.values():
        t.requires_grad_(requires_grad)
    out["grad_out"] = torch.randn(shape, generator=g, dtype=DTYPE)
    return out


def fox_dense_bias(log_f: torch.Tensor) -> torch.Tensor:
    c = torch.cumsum(log_f, dim=-1)
    T = c.shape[-1]
    return (c[..., :, None] - c[..., None, :]).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))


def forward(method: str, x: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    from fpa import first_passage_attention, forgetting_attention

    q, k, v = x["q"], x["k"], x["v"]
    os.environ["FPA_CPU_KERNEL"] = "0" if method.endswith("_torchops") else "1"  # read on every call
    if method.startswith("fpa_"):
        backend = "reference" if method == "fpa_reference" else "chunked"
        out = first_passage_attention(q, k, v, x["field"], x["level"], backend=backend, check_inputs=False)
        return out, [q, k, v, x["field"], x["level"]]
    if method.startswith("fox_chunked"):
        return forgetting_attention(q, k, v, x["log_f"], backend="chunked", check_inputs=False), [q, k, v, x["log_f"]]
    if method == "fox_dense_sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=fox_dense_bias(x["log_f"])), [q, k, v, x["log_f"]]
    if method == "sdpa_causal":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v]
    raise ValueError(method)


def run_once(method: str, x: dict) -> None:
    out, leaves = forward(method, x)
    torch.autograd.grad((out * x["grad_out"]).sum(), leaves)


def time_once(method: str, x: dict) -> float:
    t0 = time.perf_counter()
    run_once(method, x)
    return (time.perf_counter() - t0) * 1e3


def _status_kib(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise RuntimeError(name)


def _mem_child(T: int, method: str) -> None:
    run_once(method, make_inputs(16))  # load libraries and kernels before the baseline
    x = make_inputs(T)
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset the high-water mark (Linux >= 4.0)
        f.write("5")
    run_once(method, x)
    print(json.dumps({"peak_mib": max(0, _status_kib("VmHWM") - base) / 1024.0}))


def measure_mem(T: int, method: str) -> float | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--_mem-child", str(T), method]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(f"[mem] {method} T={T} failed: {r.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_mib"]


def spread(xs: list[float], nd: int) -> str:
    return f"{statistics.median(xs):.{nd}f} [{min(xs):.{nd}f}, {max(xs):.{nd}f}]"


def ratios(samples: dict, m: str, ref: str) -> list[float] | None:
    if m not in samples or ref not in samples:
        return None
    return [a / b for a, b in zip(samples[m], samples[ref])]


def report(seq_lens: list[int], reps: int, samples: dict, mems: dict, load: tuple[str, str]) -> str:
    lines = [
        "# FPA / FoX / SDPA ops benchmark (CPU)",
        "",
        f"B={B}, H={H}, D={D}, fp32, torch {torch.__version__}, threads={torch.get_num_threads()}, "
        f"{os.cpu_count()} CPUs. Load average (1/5/15 min) at the start: {load[0]}; at the end: {load[1]}. "
        "Forward + backward, every input requiring grad (q, k, v, field, level; FoX's log-gates). "
        f"Medians of {reps} repetitions after 1 warm-up, methods interleaved in one process; "
        "[min, max] in brackets; ratios are medians of the per-repetition ratios [min, max]. "
        'Peak MiB: extra resident memory of one fwd+bwd in a fresh process. "torch ops": FPA_CPU_KERNEL=0 '
        "(the bias built with tensor ops). Produced by `python benchmarks/bench_ops.py`.",
        "",
        "| T | method | fwd+bwd ms | ratio to FoX chunked | ratio to SDPA causal | peak MiB |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for T in seq_lens:
        s = samples.get(T, {})
        for m in METHODS:
            if m not in s and (T, m) not in mems:
                continue
            rf, rs = ratios(s, m, "fox_chunked"), ratios(s, m, "sdpa_causal")
            mem = mems.get((T, m))
            lines.append(
                f"| {T} | {LABELS[m]} | {spread(s[m], 1) if m in s else '—'} | "
                f"{spread(rf, 2) if rf else '—'} | {spread(rs, 2) if rs else '—'} | "
                f"{'—' if mem is None else f'{mem:.0f}'} |"
            )
    lines += ["", "## Targets (the project's)", ""]
    for T, ref, limit in TARGETS:
        r = ratios(samples.get(T, {}), "fpa_chunked", ref)
        what = f"- chunked FPA fwd+bwd <= {limit:g}x {LABELS[ref]} at T={T}"
        if not r:
            lines.append(f"{what}: NOT RUN")
            continue
        med = statistics.median(r)
        lines.append(
            f"{what}: **{'MET' if med <= limit else 'MISSED'}** ({med:.2f}x, per-repetition "
            f"[{min(r):.2f}, {max(r):.2f}]; {statistics.median(samples[T]['fpa_chunked']):.1f} ms vs "
            f"{statistics.median(samples[T][ref]):.1f} ms)"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--reps", type=int, default=7, help="timed repetitions (after 1 warm-up)")
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ops-cpu.md"))
    p.add_argument("--no-mem", action="store_true", help="skip the memory subprocesses")
    p.add_argument("--_mem-child", nargs=2, metavar=("T", "METHOD"), help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: the default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args._mem_child:
        _mem_child(int(args._mem_child[0]), args._mem_child[1])
        return
    from fpa.data.atomic import atomic_write_text

    load0 = "/".join(f"{x:.2f}" for x in os.getloadavg())
    seq_lens = sorted(args.seq_lens)
    samples: dict = {}
    mems: dict = {}
    for T in seq_lens:
        methods = [m for m in args.methods if T <= MAX_T.get(m, 1 << 30)]
        x = make_inputs(T)
        s: dict[str, list[float]] = {m: [] for m in methods}
        for rep in range(args.reps + 1):
            for m in methods:
                t = time_once(m, x)
                if rep > 0:
                    s[m].append(t)
        samples[T] = s
        print(
            f"T={T}: " + ", ".join(f"{m} {statistics.median(v):.1f} ms" for m, v in s.items()),
            file=sys.stderr,
            flush=True,
        )
        if not args.no_mem:
            for m in methods:
                if m in ("fpa_chunked", "fox_chunked", "sdpa_causal", "fpa_reference"):
                    mems[(T, m)] = measure_mem(T, m)
    load1 = "/".join(f"{x:.2f}" for x in os.getloadavg())
    text = report(seq_lens, args.reps, samples, mems, (load0, load1))
    print(text)
    atomic_write_text(args.out, text)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
