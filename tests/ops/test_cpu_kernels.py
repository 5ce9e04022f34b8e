"""The three CPU paths of the chunked backends agree with the reference, forward and every gradient:
the whole-op C++ kernel, the per-chunk C++ rows between torch GEMMs, and plain torch ops
(FPA_CPU_KERNEL=0, also the fallback when the kernels cannot be built)."""

from __future__ import annotations

import pytest
import torch

from fpa import first_passage_attention, forgetting_attention
from fpa.ops import cpu_kernels, past_min_from_field

PATHS = ["whole", "rows", "torch"]


@pytest.fixture
def path(request, monkeypatch):
    name = request.param
    if name == "torch":
        monkeypatch.setenv("FPA_CPU_KERNEL", "0")
    else:
        if cpu_kernels.library() is None:
            pytest.skip(f"kernels unavailable: {cpu_kernels.reason()}")
        if name == "whole" and not cpu_kernels._whole_ok:
            pytest.skip("whole-op kernel unavailable (no MKL GEMM in this torch)")
        monkeypatch.setattr(cpu_kernels, "whole_usable", lambda n: name == "whole")
    return name


def _inputs(dtype, B=2, Hq=4, Hkv=2, Tq=11, Tk=19, D=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    xs = dict(q=r(B, Hq, Tq, D), k=r(B, Hkv, Tk, D), v=r(B, Hkv, Tk, 5), field=r(B, Hq, Tk).cumsum(-1),
              level=r(B, Hq, Tk).cumsum(-1), beta=torch.rand(Hq, generator=g, dtype=torch.float64) + 0.25)
    return {n: x.to(dtype).requires_grad_(True) for n, x in xs.items()}


def _fpa(xs, backend, past=False, **kw):
    f, lv = xs["field"], xs["level"]
    if past:  # the cache form: field at the query positions and past_min for the earlier keys
        P = lv.shape[-1] - xs["q"].shape[2]
        kw["past_min"], f = past_min_from_field(f[..., :P]), f[..., P:]
    out = first_passage_attention(xs["q"], xs["k"], xs["v"], f, lv, beta=xs["beta"], backend=backend, **kw)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return [out, *torch.autograd.grad((out * w).sum(), list(xs.values()))]


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-11), (torch.float32, 2e-5)])
@pytest.mark.parametrize("past", [False, True])
def test_fpa_paths_match_reference(path, dtype, tol, past):
    xs = _inputs(dtype)
    want, got = _fpa(xs, "reference", past), _fpa(xs, "chunked", past, chunk_size=5)
    for name, a, b in zip(["out", *xs], got, want):
        err = (a - b).abs().max().item()
        assert err <= tol * max(1.0, b.abs().max().item()), f"{path} {dtype} d{name}: {err:.2e}"


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_fox_paths_match_reference(path):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 9, 6, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 16, 6, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    log_f = torch.nn.functional.logsigmoid(torch.randn(2, 4, 16, generator=g, dtype=torch.float64)).requires_grad_(True)
    w = torch.randn(2, 4, 9, 6, generator=g, dtype=torch.float64)
    res = []
    for backend, kw in (("reference", {}), ("chunked", {"chunk_size": 4})):
        out = forgetting_attention(q, k, v, log_f, backend=backend, **kw)
        res.append([out, *torch.autograd.grad((out * w).sum(), (q, k, v, log_f))])
    for name, a, b in zip(["out", "q", "k", "v", "log_f"], res[1], res[0]):
        assert (a - b).abs().max() < 1e-11, f"{path} d{name}"


def test_failed_build_falls_back_to_torch_ops(monkeypatch):
    """A missing compiler: one warning, then the torch-op path, same results."""
    xs = _inputs(torch.float64)
    want = _fpa(xs, "reference")
    monkeypatch.setattr(cpu_kernels, "_lib", False)
    monkeypatch.setattr(cpu_kernels, "_reason", None)
    monkeypatch.setattr(cpu_kernels, "_build", lambda: (_ for _ in ()).throw(RuntimeError("no compiler")))
    with pytest.warns(UserWarning, match="fused CPU kernels unavailable"):
        got = _fpa(xs, "chunked", chunk_size=4)
    assert cpu_kernels.library() is None and "no compiler" in cpu_kernels.reason()
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-11
