"""FPA op: every backend against the dense reference (forward and every gradient), properties P1-P3."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fpa import first_passage_attention, forgetting_attention
from fpa.ops import dip, fox_as_fpa, live_keys, past_min_from_field, walk


def make_inputs(B=2, Hq=4, Hkv=2, Tq=13, Tk=21, D=8, Dv=5, dtype=torch.float64, seed=0, field_scale=1.0, ties=False):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    field = r(B, Hq, Tk) * field_scale
    level = r(B, Hq, Tk) * field_scale
    if ties:  # a field on a coarse grid: many equal values, and levels equal to field values
        field = torch.round(field * 2) / 2
        level = torch.round(level * 2) / 2
    xs = dict(
        q=r(B, Hq, Tq, D),
        k=r(B, Hkv, Tk, D),
        v=r(B, Hkv, Tk, Dv),
        field=field,
        level=level,
        beta=torch.rand(Hq, generator=g, dtype=torch.float64) + 0.25,
    )
    return {n: x.to(dtype).requires_grad_(True) for n, x in xs.items()}


def run(xs, backend, **kw):
    out = first_passage_attention(
        xs["q"], xs["k"], xs["v"], xs["field"], xs["level"], beta=xs["beta"], backend=backend, **kw
    )
    g = torch.Generator().manual_seed(123)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    grads = torch.autograd.grad((out.float() * w.float()).sum(), list(xs.values()), allow_unused=True)
    return out, dict(zip(xs, grads))


def assert_close(a, b, rms_tol, max_tol, what):
    a, b = a.double(), b.double()
    err = a - b
    # relative to the reference's RMS, floored at 1e-3 so that an all-zero true gradient is judged absolutely
    rms = err.pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp(min=1e-3)
    assert rms <= rms_tol, f"{what}: relative RMS error {rms:.3e} > {rms_tol}"
    assert err.abs().max() <= max_tol, f"{what}: max abs error {err.abs().max():.3e} > {max_tol}"


# float64 chunked/flex vs reference, measured over these tests and 300 draws of the property
# test's space: forward max |err| 1.8e-15, gradient max |err| 8.4e-15, relative RMS (floored at
# 1e-3) 5.2e-16 forward, 2.0e-13 gradients. Bounds: <= 10x the measured figure.
F64 = dict(rms_tol=2e-12, max_tol=1.5e-14, grad_max_tol=8e-14)


def compare(xs, backend, rms_tol=1e-10, max_tol=1e-9, grads=True, skip_field_grad=False, grad_max_tol=None, **kw):
    ref_out, ref_g = run(xs, "reference")
    if grads:
        out, g = run(xs, backend, **kw)
    else:
        with torch.no_grad():
            out = first_passage_attention(
                *(xs[n].detach() for n in ("q", "k", "v", "field", "level")),
                beta=xs["beta"].detach(),
                backend=backend,
                **kw,
            )
    assert out.dtype == xs["q"].dtype and out.shape == ref_out.shape
    assert_close(out, ref_out, rms_tol, max_tol, f"{backend} forward")
    if not grads:
        return
    for name in xs:
        if skip_field_grad and name == "field":
            continue
        assert_close(
            g[name], ref_g[name], rms_tol, max_tol * 10 if grad_max_tol is None else grad_max_tol, f"{backend} d{name}"
        )
    return g, ref_g


SHAPES = [
    dict(B=1, Hq=1, Hkv=1, Tq=1, Tk=1),
    dict(B=2, Hq=4, Hkv=2, Tq=13, Tk=21),  # GQA, Tq < Tk, odd sizes
    dict(B=1, Hq=3, Hkv=1, Tq=37, Tk=37),  # GQA 3:1, T not a power of two
    dict(B=2, Hq=2, Hkv=2, Tq=1, Tk=40),  # a decoding step
    dict(B=1, Hq=2, Hkv=2, Tq=64, Tk=64),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("chunk", [None, 1, 5])
def test_chunked_matches_reference(shape, chunk):
    compare(make_inputs(**shape), "chunked", chunk_size=chunk, **F64)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_flex_forward_matches_reference(shape):
    compare(make_inputs(**shape), "flex", grads=False, **F64)


def test_huge_dips_no_nan():
    xs = make_inputs(field_scale=1e4)
    for backend in ("chunked", "reference"):
        out, g = run(xs, backend)
        assert torch.isfinite(out).all() and all(torch.isfinite(t).all() for t in g.values())
    compare(xs, "chunked", **F64)
    compare(xs, "flex", grads=False, **F64)


def test_ties_in_field():
    """With ties the field gradient is a subgradient, so only its total per tied group is unique.

    Everything else (output, q, k, v, level, beta gradients) must match exactly, and the field
    gradient summed over each (batch, head) row (the derivative along a uniform shift) too.
    """
    xs = make_inputs(ties=True, Tq=30, Tk=30, seed=3)
    g, ref_g = compare(xs, "chunked", skip_field_grad=True, chunk_size=7, **F64)
    assert_close(g["field"].sum(-1), ref_g["field"].sum(-1), F64["rms_tol"], F64["max_tol"], "field grad row sums")
    # per position, the tie rule itself: tests/ops/test_oracle.py


# chunked (and flex forward) vs the reference, both computing in float32 from the same rounded
# inputs (seed 5, Tq=33, Tk=40). Measured (relative RMS, max |err|), forward / worst gradient:
#   bfloat16 (0, 0) / (3.1e-5, 2.4e-4)   float16 (3.6e-5, 4.9e-4) / (1.7e-4, 9.8e-4)
#   float32 (1.1e-7, 3.6e-7) / (2.5e-7, 1.4e-6)
# Bounds: 10x the measured figure; where it measured 0, one unit of the dtype's rounding
# (eps * max|ref|, eps * 1 for the relative RMS).
LOW = {
    torch.bfloat16: ((0.0, 0.0), (3.1e-5, 2.4e-4)),
    torch.float16: ((3.6e-5, 4.9e-4), (1.7e-4, 9.8e-4)),
    torch.float32: ((1.1e-7, 3.6e-7), (2.5e-7, 1.4e-6)),
}


def _bound(measured: tuple[float, float], ref: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    eps = torch.finfo(dtype).eps
    rms, mx = measured
    return (10 * rms if rms else eps, 10 * mx if mx else eps * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision(dtype):
    xs = make_inputs(dtype=dtype, Tq=33, Tk=40, seed=5)
    fwd, grad = LOW[dtype]
    out, g = run(xs, "chunked")
    ref_out, ref_g = run(xs, "reference")
    assert out.dtype == dtype
    assert_close(out, ref_out, *_bound(fwd, ref_out, dtype), "forward")
    for n in xs:
        assert g[n].dtype == dtype
        assert_close(g[n], ref_g[n], *_bound(grad, ref_g[n], dtype), f"d{n}")
    with torch.no_grad():
        f = first_passage_attention(
            *(xs[n].detach() for n in ("q", "k", "v", "field", "level")), beta=xs["beta"].detach(), backend="flex"
        )
    assert_close(f, ref_out, *_bound(fwd, ref_out, dtype), "flex forward")


def test_gradcheck_reference_and_chunked():
    xs = make_inputs(B=1, Hq=2, Hkv=1, Tq=5, Tk=7, D=3, Dv=2, seed=7)
    names = list(xs)
    for backend, kw in (("reference", {}), ("chunked", {"chunk_size": 2})):

        def f(*args, backend=backend, kw=kw):
            d = dict(zip(names, args))
            return first_passage_attention(
                d["q"], d["k"], d["v"], d["field"], d["level"], beta=d["beta"], backend=backend, **kw
            )

        assert torch.autograd.gradcheck(f, tuple(xs.values()), eps=1e-6, atol=1e-6)


def test_past_min_cache_form_equals_full_form():
    xs = make_inputs(Tq=9, Tk=25, seed=11)
    P = 25 - 9
    full, _ = run(xs, "reference")
    pm = past_min_from_field(xs["field"][..., :P])
    for backend in ("reference", "chunked", "flex"):
        with torch.no_grad():
            out = first_passage_attention(
                xs["q"],
                xs["k"],
                xs["v"],
                xs["field"][..., P:],
                xs["level"],
                beta=xs["beta"],
                backend=backend,
                past_min=pm,
            )
        assert_close(out, full, 1e-10, 1e-10, f"{backend} past_min form")


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2),
    Hkv=st.integers(1, 2),
    groups=st.integers(1, 3),
    Tk=st.integers(1, 24),
    dq=st.integers(0, 23),
    D=st.integers(1, 6),
    chunk=st.integers(1, 9),
    scale=st.sampled_from([0.1, 1.0, 10.0]),
    seed=st.integers(0, 2**16),
)
def test_property_chunked_equals_reference(B, Hkv, groups, Tk, dq, D, chunk, scale, seed):
    Tq = max(1, Tk - dq)
    xs = make_inputs(B=B, Hq=Hkv * groups, Hkv=Hkv, Tq=Tq, Tk=Tk, D=D, Dv=D, seed=seed, field_scale=scale)
    compare(xs, "chunked", chunk_size=chunk, **F64)


# ---- properties of the penalty (docs/fpa.md, "Properties") ----


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_p1_dip_monotone_in_query(T, seed):
    g = torch.Generator().manual_seed(seed)
    field, level = torch.randn(2, T, generator=g, dtype=torch.float64)
    d = dip(field, level)  # (T, T): rows queries
    assert (d[1:] >= d[:-1]).all(), "dip(i, j) must never decrease as i grows"
    assert (d.triu() == 0).all(), "dip(i, j) = 0 for j >= i"


def test_p2_fox_is_a_special_case():
    xs = make_inputs(Tq=17, Tk=23, seed=2)
    log_f = torch.nn.functional.logsigmoid(torch.randn(2, 4, 23, dtype=torch.float64) + 2)
    field, level = fox_as_fpa(log_f)
    q, k, v = xs["q"].detach(), xs["k"].detach(), xs["v"].detach()
    # an independent formula: explicit sums of log f over (j, i], one entry at a time
    Tq, Tk = 17, 23
    bias = torch.full((2, 4, Tq, Tk), float("-inf"), dtype=torch.float64)
    for r in range(Tq):
        i = Tk - Tq + r
        for j in range(i + 1):
            bias[:, :, r, j] = log_f[:, :, j + 1 : i + 1].sum(-1)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    direct = torch.softmax(q @ kk.transpose(-1, -2) / math.sqrt(8) + bias, -1) @ vv
    for backend in ("reference", "chunked"):
        fox = forgetting_attention(q, k, v, log_f, backend=backend)
        via_fpa = first_passage_attention(q, k, v, field, level, beta=1.0, backend=backend)
        assert (fox - direct).abs().max() < 1e-10, backend
        assert (via_fpa - direct).abs().max() < 1e-10, backend
    assert (first_passage_attention(q, k, v, field, level, backend="flex") - direct).abs().max() < 1e-10


def test_fox_chunked_gradients_match_reference():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 11, 6, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 19, 6, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 19, 3, generator=g, dtype=torch.float64, requires_grad=True)
    log_f = torch.nn.functional.logsigmoid(torch.randn(2, 4, 19, generator=g, dtype=torch.float64)).requires_grad_(True)
    w = torch.randn(2, 4, 11, 3, generator=g, dtype=torch.float64)
    res = {}
    for backend in ("reference", "chunked"):
        out = forgetting_attention(
            q, k, v, log_f, backend=backend, **({"chunk_size": 4} if backend == "chunked" else {})
        )
        res[backend] = (out, torch.autograd.grad((out * w).sum(), (q, k, v, log_f)))
    assert (res["reference"][0] - res["chunked"][0]).abs().max() < 1e-12
    for a, b in zip(res["reference"][1], res["chunked"][1]):
        assert (a - b).abs().max() < 1e-11


def stack_simulation(field: torch.Tensor) -> torch.Tensor:
    """P3 by push/pop: at each token t, pop every live key with level > field[t], then push t."""
    T = field.shape[0]
    live = torch.zeros(T, T, dtype=torch.bool)
    stack: list[int] = []
    for t in range(T):
        while stack and field[stack[-1]] > field[t]:
            stack.pop()
        stack.append(t)
        live[t, stack] = True
    return live


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 50), seed=st.integers(0, 2**16), discrete=st.booleans())
def test_p3_one_walk_gives_a_stack(T, seed, discrete):
    g = torch.Generator().manual_seed(seed)
    inc = torch.randn(T, generator=g, dtype=torch.float64)
    if discrete:  # bracket-like +-1 steps: exercises ties (a return to the same level keeps the key)
        inc = torch.sign(inc)
    phi = walk(inc)
    assert torch.equal(live_keys(phi, phi), stack_simulation(phi))
    # and the live set at each query is exactly a stack: the live levels are non-decreasing in j
    for i in range(T):
        lv = phi[: i + 1][live_keys(phi, phi)[i, : i + 1]]
        assert (lv[1:] >= lv[:-1]).all()


# ---- bad input ----


def good():
    xs = make_inputs(dtype=torch.float32)
    return {n: x.detach() for n, x in xs.items()}


def call(**over):
    xs = good()
    xs.update(over)
    beta = xs.pop("beta")
    return first_passage_attention(
        xs.pop("q"), xs.pop("k"), xs.pop("v"), xs.pop("field"), xs.pop("level"), beta=beta, **xs
    )


@pytest.mark.parametrize(
    "over, exc, words",
    [
        (dict(q=torch.randn(2, 4, 13)), ValueError, "q must have shape"),
        (dict(k=torch.randn(2, 3, 21, 8), v=torch.randn(2, 3, 21, 5)), ValueError, "multiple"),
        (dict(q=torch.randn(2, 4, 30, 8)), ValueError, "Tq=30"),
        (dict(field=torch.randn(2, 4, 20)), ValueError, "field must have shape"),
        (dict(level=torch.randn(2, 4, 21, 1)), ValueError, "level must have shape"),
        (dict(beta=-1.0), ValueError, "beta"),
        (dict(beta=torch.tensor([1.0, -0.5, 1.0, 1.0])), ValueError, "beta"),
        (dict(beta=torch.ones(3)), ValueError, "broadcastable"),
        (dict(q=torch.ones(2, 4, 13, 8, dtype=torch.int64)), TypeError, "q must be a floating"),
        (dict(field=torch.full((2, 4, 21), float("nan"))), ValueError, "field contains NaN"),
        (dict(level=torch.full((2, 4, 21), float("nan"))), ValueError, "level contains NaN"),
        (dict(k=torch.randn(2, 2, 21, 7)), ValueError, "head dim"),
        (dict(q=torch.randn(2, 4, 13, 8, dtype=torch.float64)), TypeError, "share a dtype"),
        (dict(backend="nope"), ValueError, "backend must be one of"),
        (dict(scale="x"), TypeError, "scale"),
        (dict(chunk_size=0), ValueError, "chunk_size"),
    ],
)
def test_bad_input_errors(over, exc, words):
    with pytest.raises(exc, match=words):
        call(**over)


def test_meta_device_mismatch_is_named():
    with pytest.raises(ValueError, match="device"):
        call(field=torch.randn(2, 4, 21, device="meta"))


def test_flex_backward_on_cpu_is_refused_clearly():
    xs = make_inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match="no backward on CPU"):
        first_passage_attention(xs["q"], xs["k"], xs["v"], xs["field"], xs["level"], backend="flex")


def test_empty_and_single_position():
    q = torch.randn(1, 2, 0, 4, requires_grad=True)
    out = first_passage_attention(
        q, torch.randn(1, 2, 0, 4), torch.randn(1, 2, 0, 3), torch.randn(1, 2, 0), torch.randn(1, 2, 0)
    )
    assert out.shape == (1, 2, 0, 3)
    q1, k1, v1 = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 3)
    for backend in ("reference", "chunked", "flex"):
        o = first_passage_attention(q1, k1, v1, torch.randn(1, 2, 1), torch.randn(1, 2, 1), backend=backend)
        assert torch.allclose(o, v1), "a single key gets all the weight"
