"""Every CPU-runnable backend against the independent loop oracle (fpa_oracle.py), float64.

Forward and every gradient (q, k, v, field, level, beta), free and walk mode, with and without
ties, compared PER POSITION: under ties the field gradient is checked against the oracle run
with the backend's stated tie rule (see first_passage_attention's docstring).

Tolerances: the measured worst errors against the oracle (float64, every case here, every
backend) are 1.1e-15 (forward) and 4.4e-15 (gradients); the bounds below are 4.5x and 6.8x that.
Mutations seen to fail this file: the range (j, i] widened to [j, i] in field.range_min (free
modes fail), the chunked local mask triu(1) -> triu(0), and chunked's tie break A < Pc -> A <= Pc
(only the per-position tie checks fail).
"""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from fpa_oracle import chunked_rule, fox_oracle, fpa_oracle, latest

from fpa import first_passage_attention, forgetting_attention
from fpa.ops import fox_as_fpa

FWD_TOL = 5e-15  # measured max |err| 1.1e-15
GRAD_TOL = 3e-14  # measured max |err| 4.4e-15
NAMES = ("q", "k", "v", "field", "level", "beta")


def make(mode: str, B=2, Hq=4, Hkv=2, Tq=7, Tk=10, D=3, Dv=2, seed=0) -> dict[str, torch.Tensor]:
    """float64 leaves. mode: free | walk | free-ties | walk-ties (ties: values on an integer grid)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    if mode == "free":
        field, level = r(B, Hq, Tk), r(B, Hq, Tk)
    elif mode == "free-ties":
        field, level = torch.round(r(B, Hq, Tk) * 1.5), torch.round(r(B, Hq, Tk) * 1.5)
    elif mode == "walk":
        field = torch.cumsum(r(B, Hq, Tk), -1)
        level = field.clone()
    elif mode == "walk-ties":  # bracket-like +-1 steps: returns to the same height tie, dips are exactly 0
        field = torch.cumsum(torch.sign(r(B, Hq, Tk)), -1)
        level = field.clone()
    else:
        raise AssertionError(mode)
    xs = dict(
        q=r(B, Hq, Tq, D),
        k=r(B, Hkv, Tk, D),
        v=r(B, Hkv, Tk, Dv),
        field=field,
        level=level,
        beta=torch.rand(Hq, generator=g, dtype=torch.float64) + 0.25,
    )
    return {n: x.detach().requires_grad_(True) for n, x in xs.items()}


def upstream(xs: dict[str, torch.Tensor]) -> torch.Tensor:
    B, Hq, Tq, _ = xs["q"].shape
    return torch.randn(B, Hq, Tq, xs["v"].shape[-1], generator=torch.Generator().manual_seed(9), dtype=torch.float64)


def op(xs, backend: str, w: torch.Tensor | None, **kw) -> dict[str, torch.Tensor]:
    out = first_passage_attention(*(xs[n] for n in NAMES[:5]), beta=xs["beta"], backend=backend, **kw)
    res = {"out": out.detach()}
    if w is not None:
        res.update(zip(NAMES, torch.autograd.grad((out * w).sum(), [xs[n] for n in NAMES])))
    return res


def check(got: dict, want: dict, what: str) -> None:
    for n, x in got.items():
        tol = FWD_TOL if n == "out" else GRAD_TOL
        err = (x - want[n]).abs().max().item() if x.numel() else 0.0
        assert err <= tol, f"{what} {n}: max |err| {err:.3e} > {tol:.0e}, per position:\n{(x - want[n]).abs()}"


MODES = ["free", "walk", "free-ties", "walk-ties"]
SHAPES = [dict(Tq=7, Tk=10), dict(Tq=9, Tk=9, B=1, Hq=3, Hkv=1), dict(Tq=1, Tk=8, B=1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"Tq{s['Tq']}-Tk{s['Tk']}")
@pytest.mark.parametrize("mode", MODES)
def test_backends_match_oracle(mode, shape):
    xs = make(mode, seed=len(mode) + shape["Tq"], **shape)
    w = upstream(xs)
    P, Tq = shape["Tk"] - shape["Tq"], shape["Tq"]
    scale = xs["q"].shape[-1] ** -0.5
    args = [xs[n] for n in NAMES]
    check(op(xs, "reference", w), fpa_oracle(*args, scale, w, tie=latest), f"reference {mode}")
    for chunk in (1, 3, None):
        rule = chunked_rule(P, chunk or 256)
        check(op(xs, "chunked", w, chunk_size=chunk), fpa_oracle(*args, scale, w, tie=rule), f"chunked({chunk}) {mode}")
    with torch.no_grad():  # flex has no backward on CPU
        check(op(xs, "flex", None), fpa_oracle(*args, scale), f"flex {mode}")
    assert Tq >= 1


def test_tie_rules_really_differ():
    """The per-position tie check has teeth: on this input the two conventions disagree."""
    xs = make("walk-ties", Tq=7, Tk=10, seed=11)
    w = upstream(xs)
    args, scale = [xs[n] for n in NAMES], 3**-0.5
    a = fpa_oracle(*args, scale, w, tie=latest)["field"]
    b = fpa_oracle(*args, scale, w, tie=lambda i, j, am: min(am))["field"]
    assert (a - b).abs().max() > 1e-3
    assert (a.sum(-1) - b.sum(-1)).abs().max() < 1e-12  # while the per-row sums agree


def relu_at_zero_holds(backend: str) -> None:
    """dip exactly 0 (level_j equal to the field's minimum over (j, i]) sends no gradient to
    field, level or beta, like torch.relu; a key just above its threshold does."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 2, 2, generator=g, dtype=torch.float64) for _ in range(3))
    for eps, zero in ((0.0, True), (1e-3, False)):
        field = torch.tensor([[[0.0, 0.0]]], dtype=torch.float64, requires_grad=True)
        level = torch.tensor([[[eps, 5.0]]], dtype=torch.float64, requires_grad=True)
        beta = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
        out = first_passage_attention(q, k, v, field, level, beta=beta, backend=backend)
        gf, gl, gb = torch.autograd.grad(out[..., 1, :].sum(), (field, level, beta))
        nz = [gf[0, 0, 1] != 0, gl[0, 0, 0] != 0, gb[0] != 0]
        assert (not any(nz)) if zero else all(nz), f"{backend} eps={eps}: {gf}, {gl}, {gb}"


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_relu_at_zero_gradient_is_zero(backend):
    relu_at_zero_holds(backend)


def test_cache_form_matches_oracle():
    """past_min built by an explicit loop; no ties, so every gradient is unique."""
    xs = make("walk", B=1, Hq=2, Hkv=1, Tq=5, Tk=11, seed=3)
    w = upstream(xs)
    P = 6
    F = xs["field"].detach()
    pm = torch.full((1, 2, P), math.inf, dtype=torch.float64)
    for h in range(2):
        for j in range(P):
            for t in range(j + 1, P):
                pm[0, h, j] = min(pm[0, h, j].item(), F[0, h, t].item())
    want = fpa_oracle(*(xs[n] for n in NAMES), 3**-0.5, w)
    for backend in ("reference", "chunked"):
        fq = xs["field"].detach()[..., P:].requires_grad_(True)
        p = pm.clone().requires_grad_(True)
        out = first_passage_attention(
            xs["q"], xs["k"], xs["v"], fq, xs["level"], beta=xs["beta"], past_min=p, backend=backend
        )
        g = dict(
            zip(
                ("q", "k", "v", "field", "level", "beta", "past_min"),
                torch.autograd.grad((out * w).sum(), [xs["q"], xs["k"], xs["v"], fq, xs["level"], xs["beta"], p]),
            )
        )
        check(
            {"out": out.detach(), **{n: g[n] for n in ("q", "k", "v", "level", "beta")}}, want, f"{backend} cache form"
        )
        check({"field": g["field"]}, {"field": want["field"][..., P:]}, f"{backend} cache form")
        # the past keys' field gradient arrives through past_min: totals per row agree
        assert (g["past_min"].sum(-1) - want["field"][..., :P].sum(-1)).abs().max() < GRAD_TOL


@pytest.mark.parametrize("Tq, Tk", [(6, 6), (3, 9)])
def test_fox_matches_oracle(Tq, Tk):
    g = torch.Generator().manual_seed(Tk)
    q = torch.randn(2, 2, Tq, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, Tk, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 1, Tk, 2, generator=g, dtype=torch.float64, requires_grad=True)
    lf = torch.nn.functional.logsigmoid(torch.randn(2, 2, Tk, generator=g, dtype=torch.float64)).requires_grad_(True)
    w = torch.randn(2, 2, Tq, 2, generator=g, dtype=torch.float64)
    want = fox_oracle(q, k, v, lf, 3**-0.5, w)
    for backend, kw in (("reference", {}), ("chunked", {"chunk_size": 2}), ("chunked", {})):
        out = forgetting_attention(q, k, v, lf, backend=backend, **kw)
        got = dict(zip(("q", "k", "v", "log_fgate"), torch.autograd.grad((out * w).sum(), (q, k, v, lf))))
        check({"out": out.detach(), **got}, want, f"fox {backend} {kw}")
    # P2: FPA on fox_as_fpa equals FoX in value (log f < 0 strictly here, so gradients agree too)
    field, level = fox_as_fpa(lf)
    out = first_passage_attention(q, k, v, field, level, beta=1.0)
    (glf,) = torch.autograd.grad((out * w).sum(), lf)
    check({"out": out.detach(), "log_fgate": glf}, want, "P2")


def test_fox_as_fpa_gradient_where_gate_is_one():
    """Where log f == 0 exactly, dips are exactly 0 and FPA's relu-at-0 convention gives the
    oracle's FPA gradient, which differs from FoX's (documented in first_passage_attention)."""
    g = torch.Generator().manual_seed(5)
    q, k, v, w = (torch.randn(1, 1, 4, 2, generator=g, dtype=torch.float64) for _ in range(4))
    lf = torch.tensor([[[-0.5, 0.0, 0.0, -1.0]]], dtype=torch.float64, requires_grad=True)
    field, level = fox_as_fpa(lf)
    out = first_passage_attention(q, k, v, field, level, beta=1.0)
    (via_fpa,) = torch.autograd.grad((out * w).sum(), lf)
    f = torch.cumsum(lf.detach(), -1)
    o = fpa_oracle(q, k, v, f, f, torch.ones(1, dtype=torch.float64), 2**-0.5, w)
    expect = (o["field"] + o["level"]).flip(-1).cumsum(-1).flip(-1)  # chain rule through cumsum
    assert (via_fpa - expect).abs().max() < GRAD_TOL
    fox = fox_oracle(q, k, v, lf, 2**-0.5, w)["log_fgate"]
    assert (via_fpa - fox).abs().max() > 1e-6  # the documented difference is real


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1" or __import__("importlib").util.find_spec("triton") is None,
    reason="needs triton, and runs the interpreter in its own process",
)
def test_triton_interpreter_matches_oracle():
    """triton under TRITON_INTERPRET=1 (a fresh process: triton reads the flag at import): no ties
    (its tie rule is tile-wise, tested per row in test_triton.py), and the relu-at-0 convention."""
    code = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from test_oracle import make, upstream, op, check, NAMES, relu_at_zero_holds
from fpa_oracle import fpa_oracle
relu_at_zero_holds("triton")
for mode, shape in (("free", dict(Tq=7, Tk=10)), ("walk", dict(Tq=9, Tk=9, B=1, Hq=3, Hkv=1))):
    xs = make(mode, **shape)
    w = upstream(xs)
    check(op(xs, "triton", w), fpa_oracle(*(xs[n] for n in NAMES), 3 ** -0.5, w), "triton " + mode)
print("ok")
"""
    here = str(pathlib.Path(__file__).resolve().parent)
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code, here], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]
