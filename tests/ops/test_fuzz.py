"""Fuzz: random shapes, dtypes and values (non-finite and extreme ones too) through the public ops
and the model's forward. The contract: a correct result or a clear error (ValueError / TypeError
naming the argument), never another exception, and never a NaN/inf from finite input.

"Correct" means: equal to the float64 reference on the same (rounded) inputs, where the inputs are
moderate (|x| <= 8); extreme but finite inputs must give finite outputs or a clear error.
The default run is brief (a few seconds); ``-m slow`` runs the long version.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fpa import first_passage_attention, forgetting_attention

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
# forward tolerance vs the float64 reference, in units of eps(dtype) * max|v|: the inputs are
# rounded to the dtype first, so the only error is the float32 (float64) math and the output
# rounding. Measured worst over 3000 examples (every backend): float64 0.91, float32 0.81,
# bfloat16 0.32, float16 0.32. Bounds: 10x the measured figure, rounded down.
FWD_EPS = {torch.float64: 9.0, torch.float32: 8.0, torch.bfloat16: 3.2, torch.float16: 3.2}
# float64 gradients vs the reference, max |err| / max(max|ref|, 1): measured worst over 3000
# examples 8.9e-16; bound 10x.
GRAD_F64 = 9e-15
SPECIAL = ("normal", "normal", "normal", "ties", "tiny", "huge", "edge", "nan", "inf", "-inf")
ARG_NAMES = ("q", "k", "v", "field", "level", "past_min", "beta", "log_fgate", "scale", "chunk_size")


def _tensor(shape, kind: str, dtype, gen: torch.Generator, lo_zero=False) -> torch.Tensor:
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    if kind == "ties":
        x = torch.round(x)
    elif kind == "tiny":
        x = x * 1e-30
    elif kind == "huge":
        x = x * (3e4 if dtype == torch.float16 else 1e30)
    elif kind == "edge":  # +-0.9 x the largest finite value of the dtype
        x = torch.sign(x) * 0.9 * torch.finfo(dtype).max
    if kind in ("nan", "inf", "-inf") and x.numel():
        x.view(-1)[int(torch.randint(x.numel(), (1,), generator=gen))] = float(kind)
    if lo_zero:
        x = -x.abs()
    return x.to(dtype)


@st.composite
def fpa_case(draw):
    Hkv, G = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    Tk = draw(st.integers(0, 9))
    shape = dict(
        B=draw(st.integers(0, 2)),
        Hq=Hkv * G,
        Hkv=Hkv,
        Tk=Tk,
        Tq=draw(st.integers(0, Tk)),
        D=draw(st.integers(0, 4)),
        Dv=draw(st.integers(0, 3)),
    )
    kinds = {n: draw(st.sampled_from(SPECIAL)) for n in ("q", "k", "v", "field", "level")}
    # (no st.floats: hypothesis's float drawing asserts on a process with flush-to-zero set)
    beta = draw(
        st.one_of(
            st.integers(-100, 400).map(lambda i: i / 100),
            st.sampled_from([0.0, float("nan"), float("inf")]),
            st.just("tensor"),
            st.just("bad-tensor"),
        )
    )
    return dict(
        shape=shape,
        kinds=kinds,
        beta=beta,
        dtype=draw(st.sampled_from(DTYPES)),
        backend=draw(st.sampled_from(("reference", "chunked", "auto", "flex"))),
        chunk=draw(st.sampled_from([None, 1, 3])),
        cache=draw(st.booleans()),
        grad=draw(st.booleans()),
        seed=draw(st.integers(0, 2**20)),
    )


def _clear(e: Exception) -> bool:
    return isinstance(e, (ValueError, TypeError)) and any(n in str(e) for n in ARG_NAMES + ("backend",))


def check_fpa_case(c: dict) -> None:
    s, dt = c["shape"], c["dtype"]
    g = torch.Generator().manual_seed(c["seed"])
    B, Hq, Hkv, Tk, Tq, D, Dv = (s[n] for n in ("B", "Hq", "Hkv", "Tk", "Tq", "D", "Dv"))
    x = {
        "q": _tensor((B, Hq, Tq, D), c["kinds"]["q"], dt, g),
        "k": _tensor((B, Hkv, Tk, D), c["kinds"]["k"], dt, g),
        "v": _tensor((B, Hkv, Tk, Dv), c["kinds"]["v"], dt, g),
        "field": _tensor((B, Hq, Tk), c["kinds"]["field"], dt, g),
        "level": _tensor((B, Hq, Tk), c["kinds"]["level"], dt, g),
    }
    beta = c["beta"]
    if beta == "tensor":
        beta = torch.rand(Hq, generator=g, dtype=torch.float64).to(dt if dt != torch.float16 else torch.float32)
    elif beta == "bad-tensor":
        beta = torch.tensor([-1.0] * Hq)
    kw = dict(beta=beta, backend=c["backend"], chunk_size=c["chunk"])
    field = x["field"]
    if c["cache"] and Tk > Tq:  # the cache form: past_min from the field before the queries
        from fpa.ops import past_min_from_field

        kw["past_min"] = past_min_from_field(field[..., : Tk - Tq])
        field = field[..., Tk - Tq :]
    leaves = [x["q"], x["k"], x["v"], field, x["level"]]
    want_grad = c["grad"] and c["backend"] != "flex"
    if want_grad:
        leaves = [t.detach().requires_grad_(True) for t in leaves]
    try:
        with torch.set_grad_enabled(want_grad):
            out = first_passage_attention(*leaves, **kw)
    except Exception as e:  # noqa: BLE001 - the point is to classify every exception
        assert _clear(e), f"unclear error {type(e).__name__}: {e}"
        return
    assert out.shape == (B, Hq, Tq, Dv) and out.dtype == dt
    finite_in = all(torch.isfinite(t).all() for t in leaves) and (
        not isinstance(beta, torch.Tensor) or torch.isfinite(beta).all()
    )
    assert finite_in, "non-finite input was accepted"  # check_inputs=True must refuse it
    assert torch.isfinite(out).all(), "NaN/inf from finite input"
    moderate = all(c["kinds"][n] in ("normal", "ties", "tiny") for n in ("q", "k", "v", "field", "level"))
    if moderate and out.numel():
        ref = first_passage_attention(
            *(t.detach().double() for t in leaves),
            **{
                **kw,
                "backend": "reference",
                "chunk_size": None,
                "beta": beta.double() if isinstance(beta, torch.Tensor) else beta,
                **({"past_min": kw["past_min"].double()} if "past_min" in kw else {}),
            },
        )
        err = (out.double() - ref).abs().max().item()
        bound = FWD_EPS[dt] * torch.finfo(dt).eps * max(x["v"].double().abs().max().item(), 1e-30)
        assert err <= bound, f"{c['backend']} {dt}: max |err| {err:.3e} > {bound:.3e}"
    if want_grad and out.numel():
        grads = torch.autograd.grad(out.float().sum(), leaves, allow_unused=True)
        for name, gr in zip(("q", "k", "v", "field", "level"), grads):
            assert gr is None or torch.isfinite(gr).all() or not moderate, f"NaN/inf gradient of {name}"
        ties = any(c["kinds"][n] == "ties" for n in ("field", "level"))  # field gradient: a per-backend rule
        if dt == torch.float64 and moderate and not ties:
            ref_leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
            ref = first_passage_attention(*ref_leaves, **{**kw, "backend": "reference", "chunk_size": None})
            ref_grads = torch.autograd.grad(ref.sum(), ref_leaves, allow_unused=True)
            for name, gr, rg in zip(("q", "k", "v", "field", "level"), grads, ref_grads):
                if gr is not None and rg is not None and gr.numel():
                    err = (gr - rg).abs().max().item() / max(rg.abs().max().item(), 1.0)
                    assert err <= GRAD_F64, f"{c['backend']} d{name}: error {err:.3e} > {GRAD_F64}"


@st.composite
def fox_case(draw):
    Hkv, G, Tk = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(0, 9))
    return dict(
        B=draw(st.integers(0, 2)),
        Hq=Hkv * G,
        Hkv=Hkv,
        Tk=Tk,
        Tq=draw(st.integers(0, Tk)),
        D=draw(st.integers(1, 4)),
        kind=draw(st.sampled_from(SPECIAL)),
        qkind=draw(st.sampled_from(SPECIAL)),
        positive=draw(st.booleans()),
        dtype=draw(st.sampled_from(DTYPES)),
        backend=draw(st.sampled_from(("reference", "chunked", "auto"))),
        seed=draw(st.integers(0, 2**20)),
    )


def check_fox_case(c: dict) -> None:
    g = torch.Generator().manual_seed(c["seed"])
    dt = c["dtype"]
    q = _tensor((c["B"], c["Hq"], c["Tq"], c["D"]), c["qkind"], dt, g)
    k, v = (_tensor((c["B"], c["Hkv"], c["Tk"], c["D"]), "normal", dt, g) for _ in range(2))
    lf = _tensor((c["B"], c["Hq"], c["Tk"]), c["kind"], dt, g, lo_zero=not c["positive"])
    try:
        out = forgetting_attention(q, k, v, lf, backend=c["backend"])
    except Exception as e:  # noqa: BLE001
        assert _clear(e), f"unclear error {type(e).__name__}: {e}"
        return
    assert out.shape == (c["B"], c["Hq"], c["Tq"], c["D"]) and torch.isfinite(out).all()
    assert torch.isfinite(q).all() and torch.isfinite(lf).all() and (lf <= 0).all()


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
SLOW = settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(fpa_case())
def test_fuzz_fpa(c):
    check_fpa_case(c)


@FAST
@given(fox_case())
def test_fuzz_fox(c):
    check_fox_case(c)


@pytest.mark.slow
@SLOW
@given(fpa_case())
def test_fuzz_fpa_long(c):
    check_fpa_case(c)


@pytest.mark.slow
@SLOW
@given(fox_case())
def test_fuzz_fox_long(c):
    check_fox_case(c)
