"""CPU benchmark of First Passage Attention vs FoX vs SDPA (forward+backward time, peak memory).

Script, not a test. Usage:

    python benchmarks/bench_ops.py                                  # full run
    python benchmarks/bench_ops.py --seq-lens 512 1024 --reps 3     # quick check

Timing: all methods run in one process; for each T, one warm-up repetition, then
``--reps`` timed repetitions, with the methods interleaved inside each repetition
(rep loop outside, method loop inside), so background load hits all methods alike.
The median is reported.

Memory: each (T, method) runs fwd+bwd once in a fresh ``python`` subprocess;
reported figure = peak RSS during the run (VmHWM, high-water mark reset through
/proc/self/clear_refs after the inputs were created; ru_maxrss as fallback) minus
the RSS right after the inputs were created, in MiB. Where measuring would exceed ``--mem-cap-gib``
the figure is extrapolated from the largest measured T by T^2 and labelled "estimated".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

B, H, D = 2, 4, 64
DTYPE = torch.float32

METHODS = [
    "fpa_reference",
    "fpa_chunked",
    "fpa_flex",
    "fox_chunked",
    "fox_dense_sdpa",
    "sdpa_causal",
]
LABELS = {
    "fpa_reference": "FPA reference (dense)",
    "fpa_chunked": "FPA chunked",
    "fpa_flex": "FPA flex (fwd only)",
    "fox_chunked": "FoX chunked",
    "fox_dense_sdpa": "FoX dense-mask SDPA",
    "sdpa_causal": "SDPA causal",
}
# Methods whose time is O(T^2)-memory / slow: timing limits per method.
TIME_MAX_T = {"fpa_reference": 4096, "fox_dense_sdpa": 4096, "fpa_flex": 2048}
MEM_MAX_T = {"fpa_flex": 2048}
DENSE = {"fpa_reference", "fox_dense_sdpa"}  # may be estimated at large T


def make_inputs(T: int, seed: int = 0, requires_grad: bool = True) -> dict:
    from fpa.ops import walk

    g = torch.Generator().manual_seed(seed)
    shape = (B, H, T, D)
    q = torch.randn(shape, generator=g, dtype=DTYPE)
    k = torch.randn(shape, generator=g, dtype=DTYPE)
    v = torch.randn(shape, generator=g, dtype=DTYPE)
    field = walk(0.1 * torch.randn((B, H, T), generator=g, dtype=DTYPE))
    level = field.clone()
    log_f = F.logsigmoid(torch.randn((B, H, T), generator=g, dtype=DTYPE))
    grad_out = torch.randn(shape, generator=g, dtype=DTYPE)
    out = dict(q=q, k=k, v=v, field=field, level=level, log_f=log_f)
    for t in out.values():
        t.requires_grad_(requires_grad)
    out["grad_out"] = grad_out
    return out


def fox_dense_bias(log_f: torch.Tensor) -> torch.Tensor:
    c = torch.cumsum(log_f, dim=-1)
    T = c.shape[-1]
    bias = c[..., :, None] - c[..., None, :]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    return bias.masked_fill(causal, float("-inf"))


def forward(method: str, x: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    from fpa import first_passage_attention, forgetting_attention

    q, k, v = x["q"], x["k"], x["v"]
    if method in ("fpa_reference", "fpa_chunked", "fpa_flex"):
        backend = method.split("_", 1)[1]
        out = first_passage_attention(q, k, v, x["field"], x["level"], backend=backend)
        return out, [q, k, v, x["field"], x["level"]]
    if method == "fox_chunked":
        out = forgetting_attention(q, k, v, x["log_f"], backend="chunked")
        return out, [q, k, v, x["log_f"]]
    if method == "fox_dense_sdpa":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=fox_dense_bias(x["log_f"]))
        return out, [q, k, v, x["log_f"]]
    if method == "sdpa_causal":
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out, [q, k, v]
    raise ValueError(method)


def run_once(method: str, x: dict) -> None:
    if method == "fpa_flex":  # CPU flex is forward-only
        with torch.no_grad():
            forward(method, x)
        return
    out, leaves = forward(method, x)
    loss = (out * x["grad_out"]).sum()
    grads = torch.autograd.grad(loss, leaves)
    del grads


def time_once(method: str, x: dict) -> float:
    t0 = time.perf_counter()
    run_once(method, x)
    return (time.perf_counter() - t0) * 1e3


# ----------------------------------------------------------------------------- memory


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _mem_child(T: int, method: str) -> None:
    import gc

    x = make_inputs(T)
    gc.collect()
    base = _status_kib("VmRSS")
    try:  # reset the RSS high-water mark to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    run_once(method, x)
    peak = _status_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mib": max(0, peak - base) / 1024.0}))


def measure_mem(T: int, method: str, timeout: float = 1800.0) -> float | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--_mem-child", str(T), method]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        print(f"[mem] {method} T={T} failed: {r.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_mib"]


# ----------------------------------------------------------------------------- report


def fmt(x: float | None, nd: int = 1) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def build_report(seq_lens, reps, times, mems, mem_note) -> str:
    lines = []
    lines.append("# FPA / FoX / SDPA ops benchmark (CPU)\n")
    lines.append(
        f"B={B}, H={H}, D={D}, fp32, torch {torch.__version__}, threads={torch.get_num_threads()}. "
        f"Time: fwd+bwd (loss=(out*grad_out).sum(), grads w.r.t. q,k,v,field,level / log_fgate), "
        f"median of {reps} runs after 1 warm-up, all methods interleaved per repetition in one process. "
        f"\"FPA flex\" is forward-only on CPU (no backward), so its time and memory are forward only "
        f"and its ratios are not like-for-like. "
        f"Peak MiB: each method's fwd+bwd run once in a fresh subprocess; peak RSS during the run "
        f"(VmHWM, after resetting the high-water mark via /proc/self/clear_refs once the inputs exist) "
        f"minus RSS right after creating the inputs, i.e. extra memory beyond inputs (includes allocator slack). "
        f"Entries marked \"(est.)\" were not measured: extrapolated by T^2 from the largest measured T. "
        f"\"—\" = not run.\n"
    )
    lines.append("| T | method | fwd+bwd ms (median) | ratio to FoX chunked | ratio to SDPA-causal | peak MiB |")
    lines.append("|---:|---|---:|---:|---:|---:|")
    for T in seq_lens:
        fox = times.get((T, "fox_chunked"))
        sd = times.get((T, "sdpa_causal"))
        for m in METHODS:
            t = times.get((T, m))
            mem = mems.get((T, m))
            if t is None and mem is None:
                continue
            r_fox = t / fox if (t is not None and fox) else None
            r_sd = t / sd if (t is not None and sd) else None
            mem_s = fmt(mem, 0)
            if (T, m) in mem_note:
                mem_s += " (est.)"
            lines.append(
                f"| {T} | {LABELS[m]} | {fmt(t)} | {fmt(r_fox, 2)} | {fmt(r_sd, 2)} | {mem_s} |"
            )
    lines.append("")
    lines.append("## Targets\n")
    lines.extend(evaluate_targets(seq_lens, times, mems, mem_note))
    lines.append("")
    return "\n".join(lines)


def evaluate_targets(seq_lens, times, mems, mem_note) -> list[str]:
    out = []

    def verdict(ok):
        return "MET" if ok else "MISSED"

    # (a), (b) at T=2048
    fc = times.get((2048, "fpa_chunked"))
    for tag, other, label, limit in (("a", "fox_chunked", "chunked FoX", 1.3), ("b", "sdpa_causal", "SDPA-causal", 3.0)):
        ref = times.get((2048, other))
        what = f"- ({tag}) chunked FPA fwd+bwd <= {limit:g}x {label} at T=2048"
        if fc is None or ref is None:
            out.append(f"{what}: NOT EVALUATED (T=2048 not run)")
            continue
        r = fc / ref
        out.append(f"{what}: **{verdict(r <= limit)}** ({fc:.1f} ms vs {ref:.1f} ms = {r:.2f}x)")
    # (c)
    pairs = []
    for T in seq_lens:
        if T < 1024:
            continue
        a, b = times.get((T, "fpa_chunked")), times.get((T, "fox_dense_sdpa"))
        if a is not None and b is not None:
            pairs.append((T, a, b))
    if pairs:
        ok = all(a < b for _, a, b in pairs)
        detail = "; ".join(f"T={T}: {a:.1f} vs {b:.1f} ms ({a / b:.2f}x)" for T, a, b in pairs)
        out.append(
            f"- (c) chunked FPA faster than dense-mask FoX for all T >= 1024: **{verdict(ok)}** ({detail})"
        )
    else:
        out.append("- (c) chunked FPA faster than dense-mask FoX from T=1024: NOT EVALUATED")
    # (d)
    mc, mr = mems.get((8192, "fpa_chunked")), mems.get((8192, "fpa_reference"))
    if mc is not None and mr is not None:
        r = mc / mr
        est = " (reference figure is an estimate, see table)" if (8192, "fpa_reference") in mem_note else " (both measured)"
        out.append(
            f"- (d) chunked FPA peak memory at T=8192 <= 1/8 of dense reference: **{verdict(r <= 1 / 8)}** "
            f"({mc:.0f} MiB vs {mr:.0f} MiB = 1/{mr / mc:.1f}){est}"
            if mc > 0
            else f"- (d) **MET** (chunked {mc:.0f} MiB vs reference {mr:.0f} MiB){est}"
        )
    else:
        out.append("- (d) chunked FPA peak memory at T=8192 <= 1/8 of dense reference: NOT EVALUATED (T=8192 not run)")
    return out


def write_atomic(path: str, text: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".md")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (after 1 warm-up)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ops-cpu.md"))
    p.add_argument("--mem-cap-gib", type=float, default=16.0,
                   help="do not measure a dense method whose extrapolated peak exceeds this; estimate instead")
    p.add_argument("--time-max-t", type=int, default=1 << 30,
                   help="skip timing (but keep memory) for T above this")
    p.add_argument("--no-mem", action="store_true", help="skip memory subprocesses")
    p.add_argument("--_mem-child", nargs=2, metavar=("T", "METHOD"), help=argparse.SUPPRESS)
    args = p.parse_args()

    if args._mem_child:
        _mem_child(int(args._mem_child[0]), args._mem_child[1])
        return

    from tqdm import tqdm

    seq_lens = sorted(args.seq_lens)
    times: dict = {}
    mems: dict = {}
    mem_note: set = set()

    # ---- timing
    for T in seq_lens:
        if T > args.time_max_t:
            continue
        methods = [m for m in METHODS if T <= TIME_MAX_T.get(m, 1 << 30)]
        x = make_inputs(T)
        samples = {m: [] for m in methods}
        bar = tqdm(total=(args.reps + 1) * len(methods), desc=f"time T={T}", file=sys.stderr)
        for rep in range(args.reps + 1):
            for m in methods:
                bar.set_postfix_str(m)
                t = time_once(m, x)
                if rep > 0:
                    samples[m].append(t)
                bar.update(1)
        bar.close()
        for m in methods:
            times[(T, m)] = statistics.median(samples[m])
        del x

    # ---- memory
    if not args.no_mem:
        jobs = [(T, m) for T in seq_lens for m in METHODS if T <= MEM_MAX_T.get(m, 1 << 30)]
        cap_mib = args.mem_cap_gib * 1024
        for T, m in tqdm(jobs, desc="memory", file=sys.stderr):
            if m in DENSE:
                prev = [(t2, mems[(t2, m)]) for t2 in seq_lens if t2 < T and (t2, m) in mems and (t2, m) not in mem_note]
                if prev:
                    t2, m2 = prev[-1]
                    est = m2 * (T / t2) ** 2
                    if est > cap_mib:
                        mems[(T, m)] = est
                        mem_note.add((T, m))
                        continue
            mb = measure_mem(T, m)
            if mb is not None:
                mems[(T, m)] = mb

    report = build_report(seq_lens, args.reps, times, mems, mem_note)
    if args.time_max_t < max(seq_lens):
        report = report.replace("\n| T |", f"\nTiming was skipped for T > {args.time_max_t} (run-time budget); memory was still measured.\n\n| T |", 1)
    print(report)
    write_atomic(args.out, report)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
