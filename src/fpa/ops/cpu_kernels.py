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

from fpa.ops.cpu_rows_src import SOURCE

# -ffast-math lets the sums vectorize; -fno-finite-math-only keeps inf (empty minima) exact.
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-ffast-math", "-fno-finite-math-only",
         "-fPIC", "-shared", "-std=c++20"]
_lock = threading.Lock()
_lib: ctypes.CDLL | None | bool = False  # False: not tried yet; None: unavailable
_reason: str | None = None

_I64, _P, _D = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
_FPA_ARGS = [_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _D, ctypes.c_int, _P, _P, _P]
_FOX_ARGS = [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _D, ctypes.c_int, _P]


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
    h = hashlib.sha256("\n".join([SOURCE, " ".join(FLAGS), platform.machine(), flags]).encode())
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
            out = Path(tmp) / "rows.so"
            res = subprocess.run([cxx, *FLAGS, str(src), "-o", str(out)], capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"{cxx} failed: {res.stderr[-2000:]}")
            os.replace(out, so)  # atomic: concurrent builders each install a complete file
    lib = ctypes.CDLL(str(so))
    for name in ("fpa_fwd_f32", "fpa_bwd_f32", "fpa_fwd_f64", "fpa_bwd_f64"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = _FPA_ARGS, None
    for name in ("fox_fwd_f32", "fox_bwd_f32", "fox_fwd_f64", "fox_bwd_f64"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = _FOX_ARGS, None
    return lib


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
