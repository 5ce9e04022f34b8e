"""The three CPU paths of the chunked backends agree with the reference, forward and every gradient:
the whole-op C++ kernel, the per-chunk C++ rows between torch GEMMs, and plain torch ops
(FPA_CPU_KERNEL=0, also the fallback when the kernels cannot be built). And the builder: flags per
architecture, the cache folder, the build lock, the argument checks.

A kernel that does not build FAILS these tests (it would otherwise fall back silently to the slower
torch ops); set FPA_CPU_KERNEL=0 to run without the kernels (their tests are then skipped)."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import pytest
import torch

from fpa import first_passage_attention, forgetting_attention
from fpa.ops import past_min_from_field
from fpa.ops.cpu_kernels import builder, calls, loader

PATHS = ["whole", "rows", "torch"]
DISABLED = os.environ.get("FPA_CPU_KERNEL", "1") == "0"


def _require_kernels() -> None:
    """Skip under FPA_CPU_KERNEL=0; otherwise a build failure is a test failure."""
    if DISABLED:
        pytest.skip("CPU kernels disabled by FPA_CPU_KERNEL=0")
    if loader.library() is None:
        pytest.fail(f"the CPU kernels did not build: {loader.reason()}")


@pytest.fixture
def path(request, monkeypatch):
    name = request.param
    if name == "torch":
        monkeypatch.setenv("FPA_CPU_KERNEL", "0")
    else:
        _require_kernels()
        if name == "whole" and not loader.info()["whole_op"]:
            if torch.backends.mkl.is_available():  # torch runs MKL, so its sgemm_ must have been found
                pytest.fail(f"whole-op kernel off although torch has MKL: {loader.info()}")
            pytest.skip("whole-op kernel unavailable (no usable BLAS sgemm_ found in this process)")
        monkeypatch.setattr(loader, "whole_usable", lambda n: name == "whole")
    return name


def _inputs(dtype, B=2, Hq=4, Hkv=2, Tq=11, Tk=19, D=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    xs = dict(
        q=r(B, Hq, Tq, D),
        k=r(B, Hkv, Tk, D),
        v=r(B, Hkv, Tk, 5),
        field=r(B, Hq, Tk).cumsum(-1),
        level=r(B, Hq, Tk).cumsum(-1),
        beta=torch.rand(Hq, generator=g, dtype=torch.float64) + 0.25,
    )
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
    monkeypatch.delenv("FPA_CPU_KERNEL", raising=False)
    xs = _inputs(torch.float64)
    want = _fpa(xs, "reference")
    monkeypatch.setattr(loader, "_tried", False)
    monkeypatch.setattr(loader, "_lib", None)
    monkeypatch.setattr(loader, "_reason", None)
    monkeypatch.setattr(loader, "_build", lambda: (_ for _ in ()).throw(RuntimeError("no compiler")))
    with pytest.warns(UserWarning, match="fused CPU kernels unavailable"):
        got = _fpa(xs, "chunked", chunk_size=4)
    assert loader.library() is None and "no compiler" in (loader.reason() or "")
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-11


# ---- builder ----


@pytest.mark.parametrize("machine", ["x86_64", "AMD64", "aarch64", "arm64", "riscv64", "ppc64le"])
def test_flags_per_architecture(machine):
    base = builder.compile_flags(machine)
    x86 = machine.lower() in ("x86_64", "amd64")
    for flags in [base] + ([builder.compile_flags(machine, "avx2")] if x86 else []):
        assert "-O3" in flags and "-ffp-contract=off" in flags
        assert not any(f in ("-ffast-math", "-Ofast", "-march=native", "-mtune=native", "-mfma") for f in flags), flags
    if x86:
        assert not any(f.startswith("-m") for f in base)  # the baseline: SSE2, every x86-64 CPU
        assert builder.compile_flags(machine, "avx2") == [*base, "-mavx2"]
    else:  # nothing x86 on ARM or elsewhere
        assert not any(f.startswith(("-m", "-march")) for f in base), base
        with pytest.raises(ValueError, match="x86-64"):
            builder.compile_flags(machine, "avx2")
    with pytest.raises(ValueError, match="isa"):
        builder.compile_flags(machine, "avx512")


def test_sources_ship_as_files():
    for name in (*builder.HEADERS, *builder.SOURCES):
        assert (builder.CSRC / name).is_file(), name


def test_cache_folder_honours_xdg_and_falls_back(monkeypatch, tmp_path):
    monkeypatch.delenv("FPA_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert builder.cache_dir() == tmp_path / "xdg" / "fpa" / "kernels"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # ignored, as the XDG spec says
    assert builder.cache_dir() == Path.home() / ".cache" / "fpa" / "kernels"
    monkeypatch.setenv("FPA_KERNEL_CACHE", str(tmp_path / "explicit"))
    assert builder.cache_dir() == tmp_path / "explicit"
    # not writable (a path below a plain file cannot be created, even by root): a private temp folder
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FPA_KERNEL_CACHE", str(tmp_path / "file" / "kernels"))
    monkeypatch.setattr(builder.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    got = builder.cache_dir()
    assert got.parent == tmp_path / "tmp" and got.name.startswith("fpa-kernels-")
    assert not stat.S_IMODE(got.stat().st_mode) & 0o077


def test_concurrent_builds_compile_once(tmp_path):
    """Two builders of one library: the second waits on the lock and takes the first's file."""
    log = tmp_path / "log"
    cxx = tmp_path / "fake-cxx"
    # a compiler that logs each call, is slow, and writes its -o file
    cxx.write_text(
        f"#!{sys.executable}\n"
        "import sys, time\n"
        "if '--version' in sys.argv: print('fake 1.0'); sys.exit(0)\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "time.sleep(0.5)\n"
        "open(sys.argv[sys.argv.index('-o') + 1], 'w').write('x')\n"
    )
    cxx.chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir()
    got, errors = [], []

    def run():
        try:
            got.append(builder.build(cxx=str(cxx), flags=["-O3"], cache=cache))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(got)) == 1 and got[0].read_text() == "x"
    calls = log.read_text().splitlines()
    assert len(calls) == len(builder.SOURCES) + 1, calls  # each source compiled once, one link
    assert sorted(p.name for p in cache.iterdir()) == sorted([got[0].name, got[0].stem + ".lock"])


def test_failed_compile_names_the_command(tmp_path):
    cxx = tmp_path / "bad-cxx"
    cxx.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo bad 1; exit 0; }\necho 'error: boom' >&2\nexit 1\n")
    cxx.chmod(0o755)
    with pytest.raises(RuntimeError, match="boom"):
        builder.build(cxx=str(cxx), flags=["-O3"], cache=tmp_path)


# ---- calls ----


def _rows_args(dtype=torch.float32, BH=4, Hq=2, Tq=6, P=3, r0=0, r1=3):
    g = torch.Generator().manual_seed(0)
    c, K = r1 - r0, P + r1
    S = torch.randn(BH, c, K, generator=g, dtype=dtype)
    field = torch.randn(BH, Tq, generator=g, dtype=dtype)
    return dict(
        S=S,
        dP=None,
        lse=torch.zeros(BH, Tq, dtype=dtype),
        delta=None,
        field=field,
        past_min=torch.zeros(BH, P, dtype=dtype),
        level=torch.zeros(BH, P + Tq, dtype=dtype),
        beta=torch.ones(Hq, dtype=dtype),
        Hq=Hq,
        r0=r0,
        r1=r1,
        scale=0.5,
        lib=loader.require(),
    )


def test_bad_arrays_raise_naming_the_argument():
    _require_kernels()
    calls.fpa_rows(**_rows_args())  # the good call runs
    bad = _rows_args()
    bad["S"] = bad["S"].transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(ValueError, match="S must be contiguous"):
        calls.fpa_rows(**bad)
    bad = _rows_args()
    bad["level"] = bad["level"].double()
    with pytest.raises(TypeError, match="level must be torch.float32"):
        calls.fpa_rows(**bad)
    bad = _rows_args()
    bad["lse"] = bad["lse"][:, :2].contiguous()
    with pytest.raises(ValueError, match="lse has 8 elements"):
        calls.fpa_rows(**bad)
    with pytest.raises(TypeError, match="S must be float32 or float64"):
        calls.fpa_rows(**{**_rows_args(), "S": _rows_args()["S"].half()})
    with pytest.raises(ValueError, match="query chunk"):
        calls.fpa_rows(**{**_rows_args(), "r1": 7})
    with pytest.raises(ValueError, match="delta is required"):
        calls.fpa_rows(**{**_rows_args(), "dP": torch.zeros(4, 3, 6)})
    cum = torch.zeros(4, 9)
    with pytest.raises(ValueError, match="cum must be"):
        calls.fox_rows(torch.zeros(4, 3, 12), None, torch.zeros(4, 10), None, cum, 10, 0, 3, 0.5, lib=loader.require())


def test_avx2_and_baseline_builds_give_the_same_bits():
    """The design claim of docs/design.md ("CPU kernels"): no -ffast-math, no FMA, sums in a fixed lane
    order, so the vector width changes no rounding. Same source, same inputs, same libm; two builds."""
    _require_kernels()
    if builder.default_isa() != "avx2":
        pytest.skip("this CPU runs only the baseline build")
    libs = [loader.load(builder.build(flags=builder.compile_flags(isa=i))) for i in ("baseline", "avx2")]
    g = torch.Generator().manual_seed(3)
    BH, Hq, Tq, P, r0, r1 = 6, 3, 40, 37, 8, 40  # row lengths 46..77: the 8-lane blocks and their tails
    c, K = r1 - r0, P + r1
    for dt in (torch.float32, torch.float64):
        S0, dP0 = (torch.randn(BH, c, K, generator=g, dtype=dt) * 4 for _ in range(2))
        field = torch.randn(BH, Tq, generator=g, dtype=dt).cumsum(-1)
        base = dict(
            field=field,
            past_min=torch.randn(BH, P, generator=g, dtype=dt) - 3,
            level=torch.randn(BH, P + Tq, generator=g, dtype=dt).cumsum(-1) * 0.3,
            beta=torch.rand(Hq, generator=g, dtype=dt) + 0.5,
            Hq=Hq,
            r0=r0,
            r1=r1,
            scale=0.3,
        )
        cum = torch.nn.functional.logsigmoid(torch.randn(BH, P + Tq, generator=g, dtype=dt) * 3).cumsum(-1)
        delta = torch.randn(BH, Tq, generator=g, dtype=dt) * 0.1
        outs = []
        for lib in libs:
            S, lse = S0.clone(), torch.zeros(BH, Tq, dtype=dt)
            calls.fpa_rows(S, None, lse, None, **base, lib=lib)
            S2, dP = S0.clone(), dP0.clone()
            grads = (
                torch.zeros(BH, Tq + P, dtype=dt),
                torch.zeros(BH, P + Tq, dtype=dt),
                torch.zeros(BH, dtype=torch.float64),
            )
            calls.fpa_rows(S2, dP, lse, delta, **base, grads=grads, lib=lib)
            F, flse = S0.clone(), torch.zeros(BH, Tq, dtype=dt)
            calls.fox_rows(F, None, flse, None, cum, Tq, r0, r1, 0.3, lib=lib)
            F2, fdP, dcum = S0.clone(), dP0.clone(), torch.zeros(BH, P + Tq, dtype=dt)
            calls.fox_rows(F2, fdP, flse, delta, cum, Tq, r0, r1, 0.3, dcum, lib=lib)
            outs.append([S, lse, S2, dP, *grads, F, flse, F2, fdP, dcum])
        for i, (a, b) in enumerate(zip(*outs)):
            assert torch.equal(a, b), f"{dt} output {i}: max diff {(a - b).abs().max().item():.3e}"
