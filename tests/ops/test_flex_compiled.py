"""FPA's FlexAttention score_mod through torch.compile on CPU, against the dense reference op.

1. The flex backend compiled (FlexAttention's fused CPU kernel, forward only: FlexAttention has
   no backward on CPU).
2. The same score_mod evaluated on the whole score grid (fpa.ops.fpa.flex.dense_scores) inside a
   torch.compile'd attention, forward and every gradient (q, k, v, field, level, past_min, beta).

What this proves for CUDA, and what not: the score_mod's math (sparse-table range minimum,
cache form, diagonal, relu) and its gradient through the captured tensors are right and survive
Inductor's tracing; the CUDA FlexAttention kernels (forward and backward) are not run here
(benchmarks/gpu_check.py checks them on a GPU). Compiling takes about 30-60 s each: slow.
"""

from __future__ import annotations

import pytest
import torch

from fpa import first_passage_attention
from fpa.ops.fpa.flex import dense_scores, fpa_flex, fpa_score_mod

NAMES = ("q", "k", "v", "field", "level", "past_min", "beta")


def _inputs(B=1, Hq=4, Hkv=2, Tq=37, Tk=70, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    xs = dict(
        q=r(B, Hq, Tq, D),
        k=r(B, Hkv, Tk, D),
        v=r(B, Hkv, Tk, D),
        field=torch.cumsum(0.5 * r(B, Hq, Tq), -1),
        level=torch.cumsum(0.5 * r(B, Hq, Tk), -1),
        past_min=r(B, Hq, Tk - Tq) - 1.0,
        beta=torch.rand(Hq, generator=g, dtype=torch.float64) + 0.5,
    )
    xs["past_min"][..., -2:] = float("inf")  # empty ranges, as after eviction
    return {n: x.requires_grad_(True) for n, x in xs.items()}


def _reference(xs):
    return first_passage_attention(
        xs["q"],
        xs["k"],
        xs["v"],
        xs["field"],
        xs["level"],
        beta=xs["beta"],
        past_min=xs["past_min"],
        backend="reference",
    )


def _dense_attention(q, k, v, field, level, past_min, beta):
    Hq, Tq, D = q.shape[1], q.shape[2], q.shape[3]
    G, Tk = Hq // k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = dense_scores(fpa_score_mod(field, level, past_min, beta, Tk), (q @ k.transpose(-1, -2)) * D**-0.5)
    causal = torch.arange(Tk)[None, :] <= torch.arange(Tq)[:, None] + (Tk - Tq)
    return torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v


@pytest.mark.slow
def test_compiled_flex_forward_matches_reference():
    """float32 (FlexAttention's CPU kernel takes no float64) against the float64 reference."""
    xs = _inputs()
    ref = _reference(xs)
    x32 = [xs[n].detach().float() for n in NAMES]
    out = fpa_flex(*x32, scale=xs["q"].shape[-1] ** -0.5, compiled=True)
    err = (out.double() - ref).abs().max().item()
    print(f"compiled flex forward, float32: max abs error {err:.2e}")
    assert out.dtype == torch.float32 and err < 1e-5  # measured 5.0e-7: float32 rounding of logits and sums; 20x margin


@pytest.mark.slow
def test_compiled_score_mod_forward_and_gradients_match_reference():
    xs = _inputs(seed=1)
    w = torch.randn(1, 4, 37, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref_out = _reference(xs)
    ref_g = torch.autograd.grad((ref_out * w).sum(), list(xs.values()))
    out = torch.compile(_dense_attention)(*(xs[n] for n in NAMES))
    g = torch.autograd.grad((out * w).sum(), list(xs.values()))
    errs = {"out": (out - ref_out).abs().max().item()}
    errs |= {f"d{n}": (a - b).abs().max().item() for n, a, b in zip(NAMES, g, ref_g)}
    print("compiled score_mod, float64, max abs errors:", {n: f"{e:.1e}" for n, e in errs.items()})
    assert all(e < 1e-9 for e in errs.values()), errs  # measured <= ~1e-14
