"""The Triton backend against the dense reference, on CPU in Triton's interpreter (TRITON_INTERPRET=1).

Triton reads TRITON_INTERPRET when it is imported (its own library functions are decorated
then), and another test in the same pytest process may already have imported it compiled. So
in a normal run this module keeps a single test, test_interpreter_suite, which runs this file
again in a fresh python process with TRITON_INTERPRET=1 set from the start; there (or in any run
started with TRITON_INTERPRET=1) the real tests below run. Shapes are tiny and the tile is 16,
so that the interpreter stays fast; they still cover partial tiles, several tiles, GQA, Tq < Tk
with P not a multiple of the tile, and the decoding step.
"""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"

from test_fpa_op import assert_close, compare, make_inputs, run  # noqa: E402

from fpa import first_passage_attention  # noqa: E402
from fpa.ops import past_min_from_field  # noqa: E402
from fpa.ops.fpa.reference import penalty  # noqa: E402
from fpa.ops.softmax import causal_softmax_attention  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


triton = pytest.importorskip("triton")
if IN_INTERPRETER:
    from fpa.ops.fpa import triton as fpa_triton_mod
    from fpa.ops.fpa import triton_kernels


def test_interpreter_suite():
    """Run this file's tests in a fresh process with TRITON_INTERPRET=1 (see the module docstring)."""
    if IN_INTERPRETER:
        pytest.skip("already inside the interpreter run")
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pathlib.Path(__file__).resolve())]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"interpreter run failed:\n{r.stdout[-8000:]}\n{r.stderr[-3000:]}"


def test_interpreter_flag_honoured():
    from triton.runtime.interpreter import InterpretedFunction

    for name in ("_fwd_kernel", "_bwd_dq_kernel", "_bwd_dkdv_kernel"):
        assert isinstance(getattr(triton_kernels, name), InterpretedFunction), (
            f"{name} was compiled, not interpreted: fpa.ops.fpa.triton_kernels was imported before "
            "this test module set TRITON_INTERPRET=1"
        )


SHAPES = [
    dict(B=1, Hq=1, Hkv=1, Tq=1, Tk=1),
    dict(B=2, Hq=4, Hkv=2, Tq=13, Tk=21),  # GQA, Tq < Tk, P = 8 (not a multiple of the tile)
    dict(B=1, Hq=3, Hkv=1, Tq=37, Tk=37),  # GQA 3:1, three query tiles, the last partial
    dict(B=2, Hq=2, Hkv=2, Tq=1, Tk=40),  # a decoding step
    dict(B=1, Hq=2, Hkv=1, Tq=20, Tk=53, D=20, Dv=17),  # head dims above one 16-wide block
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_matches_reference_float64(shape):
    compare(make_inputs(**shape), "triton")


def test_huge_dips_no_nan():
    """Penalties of ~1e4: exp underflows to exactly 0 for most keys; no NaN, still the reference."""
    compare(make_inputs(B=1, Hq=2, Hkv=1, Tq=20, Tk=37, field_scale=1e4), "triton", max_tol=1e-8)


def test_matches_reference_block32(monkeypatch):
    monkeypatch.setattr(fpa_triton_mod, "INTERPRETER_BLOCK", 32)
    compare(make_inputs(B=1, Hq=2, Hkv=1, Tq=40, Tk=75, seed=9), "triton")


def _cache_form_inputs(seed=11, Tq=9, Tk=40, inf_tail=True):
    xs = make_inputs(Tq=Tq, Tk=Tk, seed=seed)
    P = Tk - Tq
    with torch.no_grad():
        pm = torch.randn(2, 4, P, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        if inf_tail:
            pm[..., -3:] = float("inf")  # empty ranges (an evicting cache's newest keys)
    xs["field"] = xs["field"][..., P:].detach().requires_grad_(True)
    xs["past_min"] = pm.requires_grad_(True)
    return xs


def _run_cache_form(xs, backend):
    out = first_passage_attention(
        xs["q"], xs["k"], xs["v"], xs["field"], xs["level"], beta=xs["beta"], past_min=xs["past_min"], backend=backend
    )
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return out, torch.autograd.grad((out * w).sum(), list(xs.values()))


def test_cache_form_past_min_gradients():
    xs = _cache_form_inputs()
    ref_out, ref_g = _run_cache_form(xs, "reference")
    out, g = _run_cache_form(xs, "triton")
    assert_close(out, ref_out, 1e-10, 1e-9, "forward")
    for n, a, b in zip(xs, g, ref_g):
        assert_close(a, b, 1e-10, 1e-8, f"d{n}")


def test_ties_in_field():
    """Tied minima: the field gradient is a subgradient; its per-row totals and all else match."""
    xs = make_inputs(B=1, ties=True, Tq=24, Tk=35, seed=3)
    g, ref_g = compare(xs, "triton", skip_field_grad=True)
    assert_close(g["field"].sum(-1), ref_g["field"].sum(-1), 1e-10, 1e-9, "field grad row sums")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision(dtype):
    """The chunked backend's tolerances (tests/ops/test_fpa_op.py::test_low_precision) or tighter:
    the gradients are held to the forward's relative RMS instead of 4x it, and 10x (not 20x) its max."""
    xs = make_inputs(B=1, Hq=2, Hkv=1, dtype=dtype, Tq=21, Tk=39, seed=5)
    tol = {torch.bfloat16: (2e-2, 5e-2), torch.float16: (3e-3, 1e-2), torch.float32: (1e-5, 1e-4)}[dtype]
    g, _ = compare(xs, "triton", *tol)
    assert all(g[n].dtype == dtype for n in xs)


@settings(max_examples=6, deadline=None)
@given(
    dims=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 40), st.integers(0, 39), st.integers(1, 6)),
    scale=st.sampled_from([0.1, 1.0, 10.0]),
    seed=st.integers(0, 2**16),
)
def test_property_triton_equals_reference(dims, scale, seed):
    """(Hkv, query heads per kv head, Tk, Tk - Tq, D): random shapes across one to three tiles."""
    Hkv, groups, Tk, dq, D = dims
    Tq = max(1, Tk - dq)
    xs = make_inputs(B=1, Hq=Hkv * groups, Hkv=Hkv, Tq=Tq, Tk=Tk, D=D, Dv=D, seed=seed, field_scale=scale)
    compare(xs, "triton", rms_tol=1e-9, max_tol=1e-8)


# ---- tile skipping ----


def _deep_dip_inputs(seed=0, T=80, Tq=61, drop=60.0, qk_scale=1.0):
    """One walk (level = field) that drops by `drop` after position 30: keys before the drop are
    penalised by about that much at every later query, so key tiles before it can be skipped.
    q and k are multiplied by qk_scale (small: content logits near 0, the bound nearly tight)."""
    xs = make_inputs(B=1, Hq=2, Hkv=1, Tq=Tq, Tk=T, seed=seed)
    with torch.no_grad():
        xs["q"].mul_(qk_scale)
        xs["k"].mul_(qk_scale)
    g = torch.Generator().manual_seed(seed)
    inc = 0.3 * torch.randn(1, 2, T, generator=g, dtype=torch.float64)
    inc[..., 30] -= drop
    walk = inc.cumsum(-1)
    xs["field"] = walk.clone().requires_grad_(True)
    xs["level"] = walk.clone().requires_grad_(True)
    return xs


def _skipped_pairs(xs, tol, block):
    """The skip rule, re-derived independently in plain Python from the full-form inputs.

    -> ((B, Hq, Tq, Tk) bool, True where skipped; the number of skipped (query tile, key tile) pairs).
    Key tiles end where the query tile's diagonal tile begins, every block positions backwards.
    """
    q, k, field, level, beta = (xs[n].detach() for n in ("q", "k", "field", "level", "beta"))
    Tq, Tk = q.shape[2], k.shape[2]
    P = Tk - Tq
    scale = q.shape[-1] ** -0.5
    kmax = k.norm(dim=-1).amax(-1).repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, Hq)
    skipped = torch.zeros(q.shape[0], q.shape[1], Tq, Tk, dtype=torch.bool)
    count = 0
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for r0 in range(0, Tq, block):
                rows = slice(r0, min(r0 + block, Tq))
                thr = 2 * scale * q[b, h, rows].norm(dim=-1).max() * kmax[b, h] + math.log(Tk / tol)
                first = P + r0  # the first query's position
                for j0 in range(first - block, -block, -block):  # key tiles strictly before its tile
                    keys = slice(max(j0, 0), j0 + block)
                    # the field strictly between the tiles, among the query positions, and at the first query
                    between = field[b, h, max(j0 + block, P) : first + 1]
                    bound = beta[h] * (level[b, h, keys].min() - between.min())
                    if bound > thr:
                        skipped[b, h, rows, keys] = True
                        count += 1
    return skipped, count


def _masked_reference(xs, skipped):
    """Dense FPA with the skipped (query, key) pairs removed: what the skipping kernel computes."""
    q, k, v, field, level, beta = (xs[n] for n in ("q", "k", "v", "field", "level", "beta"))
    pen = penalty(field, level, q.shape[2], None)
    bias = (-beta[None, :, None, None] * pen).masked_fill(skipped, float("-inf"))
    return causal_softmax_attention(q, k, v, bias, q.shape[-1] ** -0.5)


@pytest.mark.parametrize("tol, drop, qk_scale", [(1e-3, 60.0, 1.0), (1e-8, 60.0, 1.0), (1e-2, 14.0, 1e-3)])
def test_skipping_error_bound_and_exact_masked_gradients(tol, drop, qk_scale):
    xs = _deep_dip_inputs(drop=drop, qk_scale=qk_scale)
    skipped, _ = _skipped_pairs(xs, tol, fpa_triton_mod.INTERPRETER_BLOCK)
    assert skipped.any(), "the test inputs must make some tiles skippable"
    ref_out, _ = run(xs, "reference")
    out, g = run(xs, "triton", skip_tolerance=tol)
    # the documented error: each output entry within 2 * tol * max|v| of the exact attention
    bound = 2 * tol * xs["v"].detach().abs().max()
    err = (out - ref_out).abs().max()
    print(f"skipped pairs {int(skipped.sum())}, max error {err:.3e}, bound {bound:.3e}")
    assert err <= bound
    # and exactly (forward and every gradient) the attention without the skipped pairs
    masked = _masked_reference(xs, skipped)
    w = torch.randn(masked.shape, generator=torch.Generator().manual_seed(123), dtype=torch.float64)
    mg = torch.autograd.grad((masked.float() * w.float()).sum(), list(xs.values()))  # the loss of run()
    assert_close(out, masked, 1e-10, 1e-9, "skipping forward vs masked reference")
    for n, ref in zip(xs, mg):
        assert_close(g[n], ref, 1e-10, 1e-8, f"skipping d{n} vs masked reference")


def test_skipping_counts_tiles_and_off_by_default():
    xs = {n: x.detach() for n, x in _deep_dip_inputs().items()}
    P = xs["k"].shape[2] - xs["q"].shape[2]
    args = (
        xs["q"],
        xs["k"],
        xs["v"],
        xs["field"][..., P:],
        xs["level"],
        past_min_from_field(xs["field"][..., :P]),
        xs["beta"],
        8**-0.5,
    )
    out_on, n_on = fpa_triton_mod.skipped_tiles(*args, skip_tolerance=1e-3)
    out_off, n_off = fpa_triton_mod.skipped_tiles(*args, skip_tolerance=None)
    _, expected = _skipped_pairs(xs, 1e-3, 16)
    assert int(n_off.sum()) == 0
    assert int(n_on.sum()) == expected > 0
    with torch.no_grad():
        exact = first_passage_attention(
            xs["q"], xs["k"], xs["v"], xs["field"], xs["level"], beta=xs["beta"], backend="triton"
        )
    assert torch.equal(out_off, exact)
    assert (out_on - out_off).abs().max() <= 2 * 1e-3 * xs["v"].abs().max()


# ---- arguments, availability, the GPU benchmark ----


@pytest.mark.parametrize("bad", [0.0, 1.0, -1e-3, float("nan"), "x", True])
def test_bad_skip_tolerance(bad):
    xs = {n: x.detach() for n, x in make_inputs(dtype=torch.float32).items()}
    with pytest.raises(ValueError, match="skip_tolerance"):
        first_passage_attention(xs["q"], xs["k"], xs["v"], xs["field"], xs["level"], skip_tolerance=bad)


def test_other_backends_ignore_skip_tolerance():
    xs = {n: x.detach() for n, x in make_inputs().items()}
    args = (xs["q"], xs["k"], xs["v"], xs["field"], xs["level"])
    a = first_passage_attention(*args, beta=xs["beta"], backend="chunked", skip_tolerance=1e-3)
    b = first_passage_attention(*args, beta=xs["beta"], backend="chunked")
    assert torch.equal(a, b)


def test_bad_block():
    xs = {n: x.detach() for n, x in _cache_form_inputs().items()}
    with pytest.raises(ValueError, match="block"):
        fpa_triton_mod.fpa_triton(
            xs["q"], xs["k"], xs["v"], xs["field"], xs["level"], xs["past_min"], xs["beta"], 1.0, block=24
        )


def test_cpu_refused_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    xs = {n: x.detach() for n, x in make_inputs(dtype=torch.float32).items()}
    assert "CUDA" in fpa_triton_mod.unavailable_reason(xs["q"], needs_grad=False)
    with pytest.raises(ValueError, match="backend='triton' cannot run here"):
        first_passage_attention(xs["q"], xs["k"], xs["v"], xs["field"], xs["level"], backend="triton")


if not IN_INTERPRETER:  # only the subprocess runner is collected here (compiling: test_triton_aot.py)
    _keep = ("test_interpreter_suite",)
    for _name in [n for n in globals() if n.startswith("test_") and n not in _keep]:
        del globals()[_name]
