"""Build and load the fused CPU row kernels of the chunked engine (fpa.ops.cpu_rows_src).

The kernels are plain C++ (no torch headers, so the build takes about a second), compiled once
per machine with the system's g++ (``-O3 -march=native -ffast-math -fno-finite-math-only``) into a cache folder and
called through ctypes on tensors' data pointers. They link against the OpenMP runtime torch has
already loaded, so ``torch.set_num_threads`` governs them too.

``FPA_CPU_KERNEL=0`` turns them off (the chunked backends then build their bias with torch ops,
slower, same results); ``FPA_KERNEL_CACHE`` sets the cache folder (default
``~/.cache/fpa/kernels``). A failed build warns once and falls back to the torch ops.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch
from torch import Tensor

from fpa.ops.cpu_rows_src import SOURCE as _ROWS
from fpa.ops.cpu_whole_src import SOURCE as _WHOLE

SOURCE = _ROWS + _WHOLE

# -ffast-math lets the sums vectorize; -fno-finite-math-only keeps inf (empty minima) exact. It is for
# the compile step only: linking with it (gcc 12) adds crtfastmath.o, which would turn on
# flush-to-zero / denormals-are-zero for the whole process when the library loads.
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-ffast-math", "-fno-finite-math-only",
         "-fPIC", "-std=c++20"]
LINK_FLAGS = ["-shared", "-fopenmp"]
_lock = threading.Lock()
_lib: ctypes.CDLL | None | bool = False  # False: not tried yet; None: unavailable
_reason: str | None = None

_I64, _P, _D = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
_FPA_ARGS = [_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _D, ctypes.c_int, _P, _P, _P]
_FOX_ARGS = [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _D, ctypes.c_int, _P]
_WHOLE = [_P] * 10 + [_I64] * 6 + [_D]
_FPA_WHOLE = _WHOLE + [_P, _P, _P, _P, _I64, _I64, ctypes.c_int, _P, _P, _P]
_FOX_WHOLE = _WHOLE + [_P, _I64, ctypes.c_int, _P]
_whole_ok = False  # the whole-op driver (GEMMs through MKL's sgemm_/dgemm_ from libtorch_cpu) is usable


def _cpu_key() -> str:
    """Source, flags, compiler and this CPU's feature flags (-march=native code is CPU-specific)."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    h = hashlib.sha256("\n".join([SOURCE, " ".join(FLAGS + LINK_FLAGS), platform.machine(), flags]).encode())
    return h.hexdigest()[:16]


def _build() -> ctypes.CDLL:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) found")
    cache = Path(os.environ.get("FPA_KERNEL_CACHE", Path.home() / ".cache" / "fpa" / "kernels"))
    cache.mkdir(parents=True, exist_ok=True)
    so = cache / f"fpa_rows_{_cpu_key()}.so"
    if not so.exists():
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src = Path(tmp) / "rows.cpp"
            src.write_text(SOURCE)
            obj, out = Path(tmp) / "rows.o", Path(tmp) / "rows.so"
            for cmd in ([cxx, *FLAGS, "-c", str(src), "-o", str(obj)], [cxx, *LINK_FLAGS, str(obj), "-o", str(out)]):
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    raise RuntimeError(f"{cxx} failed: {res.stderr[-2000:]}")
            os.replace(out, so)  # atomic: concurrent builders each install a complete file
    lib = ctypes.CDLL(str(so))
    for name in ("fpa_fwd_f32", "fpa_bwd_f32", "fpa_fwd_f64", "fpa_bwd_f64"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = _FPA_ARGS, None
    for name in ("fox_fwd_f32", "fox_bwd_f32", "fox_fwd_f64", "fox_bwd_f64"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = _FOX_ARGS, None
    for kind, args in (("fpa", _FPA_WHOLE), ("fox", _FOX_WHOLE)):
        for d in ("fwd", "bwd"):
            for t in ("f32", "f64"):
                getattr(lib, f"{kind}_whole_{d}_{t}").argtypes = args
    lib.set_gemm.argtypes = [_P, _P, _P]
    _link_gemm(lib)
    return lib


def _link_gemm(lib: ctypes.CDLL) -> None:
    """Hand the kernels MKL's sgemm_/dgemm_ (exported by torch's CPU library), then check them on a
    small product; on any failure only the per-chunk path (GEMMs through torch) is used."""
    global _whole_ok
    try:
        tl = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        ptr = lambda name: ctypes.cast(getattr(tl, name), ctypes.c_void_p).value  # noqa: E731
        # the C interface (by value); in this build the lowercase symbol is the Fortran one (by pointer)
        threads_local = ptr("MKL_Set_Num_Threads_Local") if hasattr(tl, "MKL_Set_Num_Threads_Local") else None
        lib.set_gemm(ptr("sgemm_"), ptr("dgemm_"), threads_local)
        _whole_ok = True
        for dt in (torch.float32, torch.float64):
            if not _gemm_self_test(lib, dt):
                raise RuntimeError(f"sgemm_/dgemm_ self-test failed for {dt}")
    except Exception as e:  # noqa: BLE001 - no MKL in this torch build, or an ILP64 one
        _whole_ok = False
        warnings.warn(f"fpa: whole-op CPU kernel off, per-chunk kernels only ({e})", stacklevel=3)


def _gemm_self_test(lib: ctypes.CDLL, dt: torch.dtype) -> bool:
    """FoX attention through the whole-op driver against plain torch math, 2 heads x 5 positions."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 2, 5, 3, generator=g, dtype=dt) for _ in range(3))
    k, v = k[:, :, 0], v[:, :, 0]
    cum = torch.zeros(2, 5, dtype=dt)
    out, lse = torch.empty(1, 1, 2, 5, 3, dtype=dt), torch.empty(2, 5, dtype=dt)
    fox_whole(q, k, v, out, None, lse, None, None, None, None, cum, 2, 0.5, lib=lib)
    s = (q[0, 0] @ k[0, 0].T) * 0.5 + torch.full((5, 5), float("-inf"), dtype=dt).triu(1)
    return bool(torch.allclose(out[0, 0], torch.softmax(s, -1) @ v[0, 0], atol=1e-5))


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (disabled by FPA_CPU_KERNEL=0, or the build failed: see reason())."""
    global _lib, _reason
    if os.environ.get("FPA_CPU_KERNEL", "1") == "0":
        return None
    if _lib is False:
        with _lock:
            if _lib is False:
                try:
                    _lib = _build()
                except Exception as e:  # no compiler, odd platform: fall back to torch ops
                    _lib, _reason = None, f"{type(e).__name__}: {e}"
                    warnings.warn(f"fpa: fused CPU kernels unavailable, using torch ops ({_reason})", stacklevel=2)
    return _lib  # type: ignore[return-value]


def reason() -> str | None:
    return _reason


def whole_usable(B_kv: int) -> bool:
    """True when the whole-op driver should run: GEMMs linked and at least one (batch, kv head) per thread
    (it parallelizes over those; with fewer, the per-chunk path's multithreaded GEMMs do better)."""
    return library() is not None and _whole_ok and B_kv >= torch.get_num_threads()


def usable(*xs: Tensor) -> bool:
    """True when the kernels can run on these tensors (CPU, float32/float64, kernels built)."""
    return all(x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) for x in xs) and library() is not None


def _ptr(x: Tensor | None) -> int | None:
    if x is None:
        return None
    assert x.is_contiguous(), "kernel arrays must be contiguous"
    return x.data_ptr()


def _suffix(x: Tensor) -> str:
    return "f64" if x.dtype == torch.float64 else "f32"


def fpa_rows(S: Tensor, dP: Tensor | None, lse: Tensor, delta: Tensor | None, field: Tensor, past_min: Tensor,
             level: Tensor, beta: Tensor, Hq: int, r0: int, r1: int, scale: float,
             grads: tuple[Tensor, Tensor, Tensor] | None = None) -> None:
    """One FPA query chunk [r0, r1). S, dP (BH, c, K) raw q.k and dO.v; lse, delta (BH, Tq);
    field (BH, Tq); past_min (BH, P); level (BH, Tk); beta (Hq,). Forward when dP is None
    (S -> P, lse written); else backward (S -> P, dP -> dS), accumulating into grads =
    (dvirtual (BH, Tq + P), dlevel (BH, Tk), dbeta (BH,) float64) when given."""
    lib = library()
    BH, Tq, P = field.shape[0], field.shape[1], past_min.shape[1]
    dv, dl, db = grads if grads is not None else (None, None, None)
    fn = getattr(lib, f"fpa_{'fwd' if dP is None else 'bwd'}_{_suffix(S)}")
    fn(_ptr(S), _ptr(dP), _ptr(lse), _ptr(delta), _ptr(field), _ptr(past_min), _ptr(level), _ptr(beta),
       BH, Hq, Tq, P, r0, r1, float(scale), int(grads is not None), _ptr(dv), _ptr(dl), _ptr(db))


def fox_rows(S: Tensor, dP: Tensor | None, lse: Tensor, delta: Tensor | None, cum: Tensor, Tq: int,
             r0: int, r1: int, scale: float, dcum: Tensor | None = None) -> None:
    """One FoX query chunk: like fpa_rows with the bias cum_i - cum_j; cum (BH, Tk), dcum likewise."""
    lib = library()
    BH, Tk = cum.shape
    fn = getattr(lib, f"fox_{'fwd' if dP is None else 'bwd'}_{_suffix(S)}")
    fn(_ptr(S), _ptr(dP), _ptr(lse), _ptr(delta), _ptr(cum), BH, Tq, Tk - Tq, r0, r1, float(scale),
       int(dcum is not None), _ptr(dcum))


def _whole_common(q, k, v, out, dout, lse, delta, dq, dk, dv, chunk: int, scale: float) -> list:
    """Shared arguments: q (B, Hkv, G, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), out/dout
    (B, Hkv, G, Tq, Dv), lse/delta (B*Hq, Tq), dq/dk/dv like q/k/v; all contiguous."""
    B, Hkv, G, Tq, D = q.shape
    return [_ptr(x) for x in (q, k, v, out, dout, lse, delta, dq, dk, dv)] + [B * Hkv, G, Tq, D, v.shape[-1], chunk,
                                                                             float(scale)]


def fpa_whole(q, k, v, out, dout, lse, delta, dq, dk, dv, field: Tensor, past_min: Tensor, level: Tensor,
              beta: Tensor, chunk: int, scale: float, grads: tuple[Tensor, Tensor, Tensor] | None = None) -> None:
    """The whole FPA op in C++ (forward when dout is None, else backward); field/past_min/level as
    in fpa_rows, grads = (dvirtual, dlevel, dbeta) accumulated when given."""
    dv_, dl, db = grads if grads is not None else (None, None, None)
    fn = getattr(library(), f"fpa_whole_{'fwd' if dout is None else 'bwd'}_{_suffix(q)}")
    fn(*_whole_common(q, k, v, out, dout, lse, delta, dq, dk, dv, chunk, scale), _ptr(field), _ptr(past_min),
       _ptr(level), _ptr(beta), beta.shape[0], past_min.shape[1], int(grads is not None), _ptr(dv_), _ptr(dl), _ptr(db))


def fox_whole(q, k, v, out, dout, lse, delta, dq, dk, dv, cum: Tensor, chunk: int, scale: float,
              dcum: Tensor | None = None, lib: ctypes.CDLL | None = None) -> None:
    """The whole FoX op in C++; cum (B*Hq, Tk), dcum likewise (accumulated when given)."""
    fn = getattr(lib or library(), f"fox_whole_{'fwd' if dout is None else 'bwd'}_{_suffix(q)}")
    fn(*_whole_common(q, k, v, out, dout, lse, delta, dq, dk, dv, chunk, scale), _ptr(cum),
       cum.shape[1] - q.shape[3], int(dcum is not None), _ptr(dcum))
