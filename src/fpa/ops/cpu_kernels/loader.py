"""The process's CPU kernels: built, loaded and linked to a BLAS once, on first use.

``FPA_CPU_KERNEL=0`` turns them off (:func:`library` is then None and :func:`usable` False); a
failed build warns once, and :func:`reason` says why.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fpa.ops.cpu_kernels import blas, builder

_lock = threading.Lock()
_tried = False  # whether the build was attempted (then _lib is the library, or None after a failure)
_lib: ctypes.CDLL | None = None
_reason: str | None = None
_so_path: Path | None = None
_blas_path: str | None = None
_whole_ok = False  # the whole-op driver (GEMMs through the BLAS's sgemm_/dgemm_) is usable

# The C signatures (csrc/fpa_rows.cpp, csrc/fpa_whole.cpp); fpa.ops.cpu_kernels.calls passes the arguments.
_I64, _P, _D = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
_FPA_ARGS = [_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _D, ctypes.c_int, _P, _P, _P, _P]
_FOX_ARGS = [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _D, ctypes.c_int, _P]
_WHOLE = [_P] * 10 + [_I64] * 6 + [_D]
_FPA_WHOLE = [*_WHOLE, _P, _P, _P, _P, _I64, _I64, ctypes.c_int, _P, _P, _P, _P]
_FOX_WHOLE = [*_WHOLE, _P, _I64, ctypes.c_int, _P]


def load(so: Path) -> ctypes.CDLL:
    """Load a built library (``builder.build``) and declare its functions' C signatures.

    The GEMMs of its whole-op driver are not linked: ``blas.link_gemm`` does that.

    Args:
        so: The shared library's path.

    Raises:
        OSError: The file cannot be loaded.
    """
    lib = ctypes.CDLL(str(so))
    for name in ("fpa_fwd_f32", "fpa_bwd_f32", "fpa_fwd_f64", "fpa_bwd_f64"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = _FPA_ARGS, None
    for name in ("fox_fwd_f32", "fox_bwd_f32", "fox_fwd_f64", "fox_bwd_f64"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = _FOX_ARGS, None
    for kind, args in (("fpa", _FPA_WHOLE), ("fox", _FOX_WHOLE)):
        for d in ("fwd", "bwd"):
            for t in ("f32", "f64"):
                fn = getattr(lib, f"{kind}_whole_{d}_{t}")
                fn.argtypes, fn.restype = args, None
    lib.set_gemm.argtypes, lib.set_gemm.restype = [_P, _P, _P], None
    return lib


def _build() -> ctypes.CDLL:
    global _so_path, _blas_path, _whole_ok
    _whole_ok, _blas_path = False, None
    _so_path = builder.build()
    lib = load(_so_path)
    _blas_path = blas.link_gemm(lib)
    _whole_ok = _blas_path is not None
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, built on the first call.

    Returns:
        The library, or None: disabled by ``FPA_CPU_KERNEL=0``, or the build failed (one warning,
        then :func:`reason` says why).
    """
    global _tried, _lib, _reason
    if os.environ.get("FPA_CPU_KERNEL", "1") == "0":
        return None
    if not _tried:
        with _lock:
            if not _tried:
                try:
                    _lib = _build()
                except Exception as e:  # no compiler, odd platform: fall back to torch ops
                    _lib, _reason = None, f"{type(e).__name__}: {e}"
                    warnings.warn(f"fpa: fused CPU kernels unavailable, using torch ops ({_reason})", stacklevel=2)
                _tried = True
    return _lib


def require() -> ctypes.CDLL:
    """The loaded kernels, for the typed calls of ``fpa.ops.cpu_kernels.calls``.

    Raises:
        RuntimeError: The kernels are not available (``FPA_CPU_KERNEL=0``, or the build failed).
    """
    lib = library()
    if lib is None:
        raise RuntimeError(f"fpa: the CPU kernels are not available ({reason() or 'FPA_CPU_KERNEL=0'})")
    return lib


def reason() -> str | None:
    """Why :func:`library` is None after a failed build (None otherwise)."""
    return _reason


def info() -> dict[str, Any]:
    """What is in use, for reports and bug reports.

    Returns:
        ``enabled`` (the kernels run), ``library`` (the file), ``blas`` (the whole-op driver's BLAS),
        ``whole_op`` (that driver is usable), ``isa``, ``flags`` and ``reason`` (of a failed build).
    """
    return {
        "enabled": library() is not None,
        "library": None if _so_path is None else str(_so_path),
        "blas": _blas_path,
        "whole_op": _whole_ok,
        "isa": builder.default_isa(),
        "flags": builder.compile_flags(isa=builder.default_isa()),
        "reason": _reason,
    }


def whole_usable(B_kv: int) -> bool:
    """True when the whole-op driver should run: GEMMs linked and at least one (batch, kv head) per
    thread (it parallelizes over those; with fewer, the per-chunk path's multithreaded GEMMs do better).

    Args:
        B_kv: The number of (batch, kv head) pairs, B * Hkv.
    """
    return library() is not None and _whole_ok and B_kv >= torch.get_num_threads()


def usable(*xs: Tensor) -> bool:
    """True when the kernels can run on these tensors (CPU, float32/float64, kernels built)."""
    return (
        all(x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) for x in xs) and library() is not None
    )
