"""Bad input to the public ops: a clear error before any work, or a documented result.

Covers first_passage_attention and forgetting_attention: non-finite q/k/v, magnitudes that would
overflow, float beta precision, empty batches and sequences, and check_inputs=False.
"""

from __future__ import annotations

import pytest
import torch

from fpa import first_passage_attention, forgetting_attention
from fpa.ops import checks

BACKENDS = ("reference", "chunked", "flex", "auto")


def fpa_args(B=2, Hq=2, Hkv=1, Tq=5, Tk=6, D=4, Dv=3, dtype=torch.float32, seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return dict(q=r(B, Hq, Tq, D), k=r(B, Hkv, Tk, D), v=r(B, Hkv, Tk, Dv), field=r(B, Hq, Tk), level=r(B, Hq, Tk))


def fpa(a: dict, **kw) -> torch.Tensor:
    return first_passage_attention(a["q"], a["k"], a["v"], a["field"], a["level"], **kw)


def fox_args(**kw) -> dict:
    a = fpa_args(**kw)
    return dict(q=a["q"], k=a["k"], v=a["v"], log_fgate=-a["field"].abs())


def fox(a: dict, **kw) -> torch.Tensor:
    return forgetting_attention(a["q"], a["k"], a["v"], a["log_fgate"], **kw)


def poke(x: torch.Tensor, value: float) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[x.numel() // 2] = value
    return x


@pytest.mark.parametrize("name", ["q", "k", "v", "field", "level"])
@pytest.mark.parametrize(
    "value, words",
    [(float("nan"), "contains NaN"), (float("inf"), "must be finite"), (-float("inf"), "must be finite")],
)
def test_fpa_non_finite_named(name, value, words):
    a = fpa_args()
    a[name] = poke(a[name], value)
    with pytest.raises(ValueError, match=f"{name} {words}"):
        fpa(a)


@pytest.mark.parametrize("name", ["q", "k", "v", "log_fgate"])
@pytest.mark.parametrize("value, words", [(float("nan"), "contains NaN"), (-float("inf"), "must be finite")])
def test_fox_non_finite_named(name, value, words):
    a = fox_args()
    a[name] = poke(a[name], value)
    with pytest.raises(ValueError, match=f"{name} {words}"):
        fox(a)


@pytest.mark.parametrize(
    "over, exc, words",
    [
        (dict(log_fgate=torch.full((2, 2, 6), 0.5)), ValueError, "log_fgate must be <= 0"),
        (dict(log_fgate=torch.zeros(2, 2, 5)), ValueError, "log_fgate must have shape"),
        (dict(log_fgate=torch.zeros(2, 2, 6, dtype=torch.int64)), TypeError, "log_fgate must be a floating"),
        (dict(q=torch.randn(2, 2, 5)), ValueError, "q must have shape"),
        (dict(k=torch.randn(2, 1, 6, 3)), ValueError, "head dim"),
        (dict(backend="flex"), ValueError, "backend must be one of"),
        (dict(chunk_size=-1), ValueError, "chunk_size"),
        (dict(scale=float("nan")), ValueError, "scale must be finite"),
        (dict(check_inputs="yes"), TypeError, "check_inputs must be a bool"),
        (dict(log_fgate=torch.full((2, 2, 6), -1e38)), ValueError, "log_fgate is too negative"),
    ],
)
def test_fox_bad_input_errors(over, exc, words):
    a = fox_args()
    kw = {n: over.pop(n) for n in list(over) if n not in a}
    a.update(over)
    with pytest.raises(exc, match=words):
        fox(a, **kw)


def test_overflowing_field_range_is_an_error_not_nan():
    """A finite float32 field of +-3e38 with beta = 0 used to give NaN (0 * inf)."""
    a = fpa_args()
    a["field"] = torch.tensor([3e38, -3e38, 0.0, 1.0, 2.0, 3.0]).expand(2, 2, 6).contiguous()
    a["level"] = a["field"].clone()
    with pytest.raises(ValueError, match="field and level are too far apart for torch.float32"):
        fpa(a, beta=0.0)
    a64 = {n: x.double() for n, x in a.items()}  # the same values fit in float64: a correct result
    out = fpa(a64, beta=0.0)
    assert torch.isfinite(out).all()


def test_overflowing_logits_and_values_are_errors():
    a = fpa_args()
    a["q"] = a["q"] * 1e19
    a["k"] = a["k"] * 1e19
    with pytest.raises(ValueError, match="q and k are too large"):
        fpa(a)
    a = fpa_args()
    a["v"] = poke(a["v"], 3e38)
    with pytest.raises(ValueError, match="v is too large"):
        fpa(a)


def test_python_float_beta_is_not_rounded_to_float32():
    a = {n: x.double() for n, x in fpa_args().items()}
    b = 0.1  # not representable in float32: rounding it would be an error of 1.5e-9 in beta
    as_float = fpa(a, beta=b, backend="reference")
    as_tensor = fpa(a, beta=torch.tensor(b, dtype=torch.float64), backend="reference")
    assert torch.equal(as_float, as_tensor)
    rounded = fpa(a, beta=torch.tensor(b, dtype=torch.float32).double(), backend="reference")
    assert not torch.equal(as_float, rounded)
    assert checks.beta_per_head(b, 2, torch.device("cpu"), torch.float64).dtype == torch.float64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("B, Tq, Tk", [(0, 5, 6), (2, 0, 6), (2, 0, 0), (0, 0, 0)])
def test_empty_batch_or_sequence_gives_empty_output_and_zero_grads(backend, B, Tq, Tk):
    a = {n: x.requires_grad_(True) for n, x in fpa_args(B=B, Tq=Tq, Tk=Tk).items()}
    beta = torch.ones(2, requires_grad=True)
    out = fpa(a, beta=beta, backend=backend)
    assert out.shape == (B, 2, Tq, 3)
    grads = torch.autograd.grad(out.sum(), [*a.values(), beta])
    for x, gx in zip([*a.values(), beta], grads):
        assert gx.shape == x.shape and not gx.any()


@pytest.mark.parametrize("backend", ["reference", "chunked", "auto"])
def test_fox_empty_batch_or_sequence(backend):
    for B, Tq in ((0, 5), (2, 0)):
        a = {n: x.requires_grad_(True) for n, x in fox_args(B=B, Tq=Tq).items()}
        out = fox(a, backend=backend)
        assert out.shape == (B, 2, Tq, 3)
        grads = torch.autograd.grad(out.sum(), list(a.values()))
        assert all(gx.shape == x.shape and not gx.any() for x, gx in zip(a.values(), grads))


def test_check_inputs_false_skips_value_checks(monkeypatch):
    """check_inputs=False never reaches the value checks (no reduction, no host sync): bad values
    then give NaN instead of an error, and the shape checks still run."""
    calls = []
    real = checks.check_values
    monkeypatch.setattr(checks, "check_values", lambda *x, **k: calls.append(1) or real(*x, **k))
    a = fpa_args()
    a["q"] = poke(a["q"], float("nan"))
    assert torch.isnan(fpa(a, check_inputs=False)).any() and not calls
    f = fox_args()
    f["q"] = poke(f["q"], float("nan"))
    assert torch.isnan(fox(f, check_inputs=False)).any() and not calls
    with pytest.raises(ValueError, match="q contains NaN"):
        fpa(a)
    assert calls
    with pytest.raises(ValueError, match="field must have shape"):
        fpa({**a, "field": torch.randn(2, 2, 3)}, check_inputs=False)
    with pytest.raises(ValueError, match="beta must be finite"):
        fpa(fpa_args(), beta=-1.0, check_inputs=False)  # a Python float costs nothing to check


def test_value_checks_cost_one_host_sync(monkeypatch):
    """All value checks together read back ONE tensor (a single device-to-host sync)."""
    n = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: n.append(1) or real(self))
    fpa(fpa_args(), beta=torch.ones(2))
    assert len(n) == 1


def test_op_leaves_the_floating_point_environment_alone():
    """After any backend ran, subnormal numbers still exist in the process (no FTZ/DAZ left set)."""
    import subprocess
    import sys

    code = (
        "import torch\nfrom fpa import first_passage_attention as f\nx = torch.randn(1, 1, 8, 4)\n"
        "for b in ('reference', 'chunked', 'auto'):\n    f(x, x, x, torch.randn(1, 1, 8), torch.randn(1, 1, 8), "
        "backend=b)\n"
        "tiny = 5e-324\nassert tiny * 1.0 > 0, 'python floats flushed to zero'\n"
        "assert (torch.tensor([1e-40]) * 1.0).item() > 0, 'torch subnormals flushed to zero'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
