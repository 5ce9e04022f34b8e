"""The BLAS of the whole-op driver: the ``sgemm_``/``dgemm_`` of the BLAS torch already runs.

Candidates are torch's ``libtorch_cpu`` (MKL or OpenBLAS linked in on the usual wheels), then any
BLAS-named library mapped into the process (``/proc/self/maps``). An ILP64 OpenBLAS (64-bit
integers) is skipped, and the choice is checked on a small product. With none, only the per-chunk
driver runs, its GEMMs through torch.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from pathlib import Path

import torch

from fpa.ops.cpu_kernels import calls


def blas_candidates() -> list[str]:
    """Shared libraries that may export sgemm_/dgemm_, best first.

    torch's CPU library (MKL or OpenBLAS linked in, on the usual wheels), then every BLAS-looking
    library already mapped into this process (/proc/self/maps on Linux), so the kernels use the
    BLAS torch itself runs.

    Returns:
        Their paths, in order, without repeats.
    """
    found: list[str] = []
    lib_dir = Path(torch.__file__).resolve().parent / "lib"
    for pattern in ("libtorch_cpu.so*", "libtorch_cpu.dylib", "libtorch_cpu*.so"):
        found += sorted(str(p) for p in lib_dir.glob(pattern))
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    for line in maps.splitlines():
        parts = line.split(None, 5)
        path = parts[5].strip() if len(parts) == 6 else ""
        name = os.path.basename(path).lower()
        if path.startswith("/") and any(s in name for s in ("torch_cpu", "mkl_rt", "openblas", "blas")):
            found.append(path)
    return list(dict.fromkeys(found))


def _ilp64(lib: ctypes.CDLL) -> bool:
    """True for an OpenBLAS built with 64-bit integers (the kernels pass 32-bit ones)."""
    if hasattr(lib, "openblas_get_config"):
        lib.openblas_get_config.restype = ctypes.c_char_p
        return b"USE64BITINT" in (lib.openblas_get_config() or b"")
    return False


def _addr(lib: ctypes.CDLL, name: str) -> int | None:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def link_gemm(lib: ctypes.CDLL) -> str | None:
    """Hand the kernels the first candidate BLAS exporting sgemm_ and dgemm_ (32-bit integers) that
    passes :func:`gemm_self_test` in float32 and float64.

    With none, the library's GEMM pointers are left unset and a warning says why: only the
    per-chunk path (GEMMs through torch) may run.

    Args:
        lib: The loaded kernels (``fpa.ops.cpu_kernels.loader.load``).

    Returns:
        The path of the BLAS linked, or None.
    """
    tried = []
    for path in blas_candidates():
        try:
            bl = ctypes.CDLL(path)  # already loaded: the same handle, no second copy
        except OSError:
            continue
        if not (hasattr(bl, "sgemm_") and hasattr(bl, "dgemm_")) or _ilp64(bl):
            continue
        tried.append(os.path.basename(path))
        # MKL's C entry point (by value); lets the driver run one GEMM thread per OpenMP thread
        threads_local = _addr(bl, "MKL_Set_Num_Threads_Local") if hasattr(bl, "MKL_Set_Num_Threads_Local") else None
        lib.set_gemm(_addr(bl, "sgemm_"), _addr(bl, "dgemm_"), threads_local)
        if all(gemm_self_test(lib, dt) for dt in (torch.float32, torch.float64)):
            return path
        lib.set_gemm(None, None, None)
    why = f"self-test failed with {', '.join(tried)}" if tried else "no loaded BLAS exports sgemm_/dgemm_"
    warnings.warn(f"fpa: whole-op CPU kernel off, per-chunk kernels only ({why})", stacklevel=4)
    return None


def gemm_self_test(lib: ctypes.CDLL, dt: torch.dtype) -> bool:
    """FoX attention through the whole-op driver against plain torch math, 2 heads x 5 positions.

    Args:
        lib: The loaded kernels, with the GEMMs to test set.
        dt: torch.float32 or torch.float64.

    Returns:
        True when the driver's output matches within 1e-5.
    """
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 2, 5, 3, generator=g, dtype=dt) for _ in range(3))
    k, v = k[:, :, 0].contiguous(), v[:, :, 0].contiguous()
    cum = torch.zeros(2, 5, dtype=dt)
    out, lse = torch.empty(1, 1, 2, 5, 3, dtype=dt), torch.empty(2, 5, dtype=dt)
    calls.fox_whole(q, k, v, out, None, lse, None, None, None, None, cum, 2, 0.5, lib=lib)
    s = (q[0, 0] @ k[0, 0].T) * 0.5 + torch.full((5, 5), float("-inf"), dtype=dt).triu(1)
    return bool(torch.allclose(out[0, 0], torch.softmax(s, -1) @ v[0, 0], atol=1e-5))
