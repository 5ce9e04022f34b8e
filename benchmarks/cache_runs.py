"""Grow one KV cache through a list of lengths and time decoding at each: the measurement loop
that benchmarks/bench_cache.py and benchmarks/bench_long_context.py share."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from fpa.cache import FPACache, Policy, prefill
from fpa.compat import CACHE_ARG

MiB = 2**20


@torch.no_grad()
def grow_and_decode(
    model, policy: Policy | None, tokens: torch.Tensor, lengths: list[int], chunk: int, window: int, name: str
) -> list[dict[str, Any]]:
    """Grow one ``FPACache(policy)`` on ``tokens`` (1, N >= max(lengths) + window) through the
    increasing ``lengths``: per length L a chunked prefill (chunks of ``chunk``; the policy runs
    after each) up to L, then ``window`` decode steps of one token each (the next tokens of
    ``tokens``), timed one by one. One row per length, printed as it is measured:

    config (``name``), length, ms_per_token and tokens_per_s (from the median step time: it resists
    the noise of a shared machine), bytes_held, bytes_live and kept_fraction (read after the
    window), peak_bytes (``FPACache.peak_bytes`` over the prefill that reached L), prefill_s.
    """
    cache, seen = FPACache(policy), 0
    rows: list[dict[str, Any]] = []
    for L in lengths:
        cache.peak_bytes = 0
        t0 = time.perf_counter()
        if L > seen:
            prefill(model, tokens[:, seen:L], cache, chunk)
        prefill_s = time.perf_counter() - t0
        peak = cache.peak_bytes
        step_s = []
        for i in range(window):
            tok = tokens[:, L + i : L + i + 1]
            t1 = time.perf_counter()
            model(tok, **{CACHE_ARG: cache}, use_cache=True)
            step_s.append(time.perf_counter() - t1)
        seen = L + window
        ms = 1e3 * statistics.median(step_s)
        rows.append(
            dict(
                config=name,
                length=L,
                ms_per_token=ms,
                tokens_per_s=1e3 / ms,
                bytes_held=cache.bytes_held(),
                bytes_live=cache.bytes_live(),
                peak_bytes=peak,
                kept_fraction=cache.kept_fraction(),
                prefill_s=prefill_s,
            )
        )
        print(
            f"{name:>16} L={L:>6}: {ms:7.2f} ms/token, held {rows[-1]['bytes_held'] / MiB:8.2f} MiB, "
            f"kept {rows[-1]['kept_fraction']:.3f}, prefill {prefill_s:6.1f} s",
            flush=True,
        )
    return rows
