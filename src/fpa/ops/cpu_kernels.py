"""Build and load the fused CPU kernels of the chunked engine (C++ sources in ``fpa/ops/csrc``).

The kernels are plain C++ without torch headers, so the build takes a few seconds:
``csrc/fpa_kernels.h`` holds the per-row work, ``csrc/fpa_rows.cpp`` the driver for one query
chunk between torch's GEMMs, ``csrc/fpa_whole.cpp`` the whole-op driver, whose GEMMs go through the
BLAS torch has already loaded. They are compiled once per (sources, flags, compiler) with the
system's C++ compiler (``$CXX``, else ``g++``, else ``c++``) into a cache folder and called through
ctypes on tensors' data pointers. They link against the OpenMP runtime torch has already loaded, so
``torch.set_num_threads`` governs them too.

The flags (:func:`compile_flags`) are ``-O3`` for the architecture's baseline, plus ``-mavx2`` on
x86-64 CPUs that have it (:func:`default_isa`); nothing tuned to the build machine (no
``-march=native``) and nothing that lets the compiler change the rounding the source writes (no
``-ffast-math``, no FMA contraction; sums in a fixed lane order). So the AVX2 build and the baseline
build give the same bits, and a result depends on the CPU only through what the kernels call:
torch's GEMMs (whose MKL/OpenBLAS code differs between CPUs) and libm's exp/log (docs/design.md,
"CPU kernels").

Environment: ``FPA_CPU_KERNEL=0`` turns the kernels off (the chunked backends then build their bias
with torch ops: slower, same results up to float rounding); ``FPA_KERNEL_CACHE`` sets the cache
folder (default ``$XDG_CACHE_HOME/fpa/kernels``, i.e. ``~/.cache/fpa/kernels``; a folder that cannot
be written falls back to a private one in the temp dir); ``CXX`` the compiler. A failed build warns
once and falls back to the torch ops.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

try:
    import fcntl
except ImportError:  # not POSIX: builds are still installed atomically, just not serialized
    fcntl = None  # type: ignore[assignment]

CSRC = Path(__file__).resolve().parent / "csrc"
HEADERS = ("fpa_kernels.h",)
SOURCES = ("fpa_rows.cpp", "fpa_whole.cpp")

# Flags that change no result: -fno-trapping-math lets the backward loops' selects vectorize (the
# program never enables floating-point traps); -ffp-contract=off keeps a * b + c two roundings
# everywhere (GCC's default in GNU mode fuses them where the target has FMA, e.g. on aarch64).
_COMMON_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math"]
LINK_FLAGS = ["-shared", "-fopenmp"]
_X86 = ("x86_64", "amd64", "x64")

_lock = threading.Lock()
_lib: ctypes.CDLL | None | bool = False  # False: not tried yet; None: unavailable
_reason: str | None = None
_so_path: Path | None = None
_blas_path: str | None = None
_whole_ok = False  # the whole-op driver (GEMMs through the BLAS's sgemm_/dgemm_) is usable

_I64, _P, _D = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
_FPA_ARGS = [_P, _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _D, ctypes.c_int, _P, _P, _P]
_FOX_ARGS = [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _D, ctypes.c_int, _P]
_WHOLE = [_P] * 10 + [_I64] * 6 + [_D]
_FPA_WHOLE = [*_WHOLE, _P, _P, _P, _P, _I64, _I64, ctypes.c_int, _P, _P, _P]
_FOX_WHOLE = [*_WHOLE, _P, _I64, ctypes.c_int, _P]


def default_isa(machine: str | None = None) -> str:
    """The instruction set the kernels are built for on this machine: ``"avx2"`` on an x86-64 CPU that
    torch runs with AVX2 or AVX-512 (``torch.backends.cpu.get_cpu_capability()``, so
    ``ATEN_CPU_CAPABILITY=default`` turns it off too), else ``"baseline"``."""
    m = (machine or platform.machine()).lower()
    if m in _X86 and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        return "avx2"
    return "baseline"


def compile_flags(machine: str | None = None, isa: str = "baseline") -> list[str]:
    """Compiler flags for ``machine`` (default: this one, ``platform.machine()``) and ``isa``.

    ``"baseline"``: ``-O3`` for the architecture's baseline, which every CPU of it runs (SSE2 on
    x86-64, NEON on aarch64, whatever the compiler defaults to elsewhere). ``"avx2"`` (x86-64 only):
    ``-mavx2`` on top, 256-bit vectors for the same code; no FMA (``-mfma`` is not given, and
    ``-ffp-contract=off`` forbids it anyway), so both builds round identically and give the same
    bits (tests/ops/test_cpu_kernels.py checks it). ``-march=x86-64-v2`` measured no faster than the
    baseline; ``-march=native`` and ``-ffast-math`` are out (docs/design.md, "CPU kernels").
    """
    m = (machine or platform.machine()).lower()
    if isa not in ("baseline", "avx2"):
        raise ValueError(f"isa must be 'baseline' or 'avx2', got {isa!r}")
    if m in _X86:
        arch = ["-mavx2"] if isa == "avx2" else []
    elif isa != "baseline":
        raise ValueError(f"isa {isa!r} is for x86-64, not {m}")
    elif m in ("aarch64", "arm64"):
        arch = []  # NEON is part of ARMv8-A: -O3 vectorizes with it
    else:
        arch = []
    return [*_COMMON_FLAGS, *arch]


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else g++, else c++ (RuntimeError when there is none)."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    return cxx


def _compiler_id(cxx: str) -> str:
    """The compiler's path and the first line of ``--version``: part of the cache key."""
    try:
        res = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"cannot run the C++ compiler {cxx!r}: {e}") from e
    first = (res.stdout or res.stderr).splitlines()[:1]
    return f"{shutil.which(cxx) or cxx}\n{first[0] if first else ''}"


def build_key(cxx: str, flags: list[str] | None = None) -> str:
    """16 hex digits of sha256(sources, flags, compiler, machine): the cached library's name."""
    h = hashlib.sha256()
    for name in (*HEADERS, *SOURCES):
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    flags = compile_flags(isa=default_isa()) if flags is None else flags
    h.update(" ".join([*flags, "|", *LINK_FLAGS]).encode() + b"\0")
    h.update(_compiler_id(cxx).encode() + b"\0" + platform.machine().encode())
    return h.hexdigest()[:16]


def _usable_dir(d: Path, private: bool) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        if private:  # a shared temp dir: only a folder of our own, that nobody else can write to
            st = d.stat()
            if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o022:
                return False
        return os.access(d, os.W_OK | os.X_OK)
    except OSError:
        return False


def cache_dir() -> Path:
    """Where the built library goes: ``$FPA_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/fpa/kernels``
    (``~/.cache/fpa/kernels`` when XDG_CACHE_HOME is unset, empty or relative); when that cannot be
    written, a private ``fpa-kernels-<uid>`` folder in the temp dir."""
    env = os.environ.get("FPA_KERNEL_CACHE")
    if env:
        first = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
        first = base / "fpa" / "kernels"
    if _usable_dir(first, private=False):
        return first
    tmp = Path(tempfile.gettempdir()) / f"fpa-kernels-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    if _usable_dir(tmp, private=True):
        return tmp
    raise RuntimeError(f"no writable kernel cache folder ({first} and {tmp} are not usable)")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (fcntl.flock; released if the holder dies)."""
    with open(path, "a+b") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def build(cxx: str | None = None, flags: list[str] | None = None, cache: Path | None = None) -> Path:
    """Compile the kernels (unless the cache already holds them) and return the library's path.

    One process builds at a time per library (a file lock beside it); the result is installed with
    an atomic rename, so a reader never sees a half-written file.
    """
    cxx = cxx or compiler()
    flags = compile_flags(isa=default_isa()) if flags is None else flags
    cache = cache or cache_dir()
    key = build_key(cxx, flags)
    so = cache / f"fpa_kernels_{key}.so"
    if so.exists():
        return so
    with _file_lock(cache / f"fpa_kernels_{key}.lock"):
        if so.exists():  # another process built it while we waited
            return so
        with tempfile.TemporaryDirectory(dir=cache, prefix="build-") as tmp:
            objs = [str(Path(tmp) / (name.rsplit(".", 1)[0] + ".o")) for name in SOURCES]
            _run([[cxx, *flags, "-c", str(CSRC / name), "-o", obj] for name, obj in zip(SOURCES, objs)])
            out = Path(tmp) / "fpa_kernels.so"
            _run([[cxx, *LINK_FLAGS, *objs, "-o", str(out)]])
            os.replace(out, so)
    return so


def _run(cmds: list[list[str]]) -> None:
    """Run the commands side by side (the sources compile in parallel); RuntimeError with the
    compiler's message when one fails."""
    try:
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    except OSError as e:
        raise RuntimeError(f"{cmds[0][0]} failed to run: {e}") from e
    errors = []
    for cmd, proc in zip(cmds, procs):
        try:
            _, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err = "timed out after 600 s\n" + err
        if proc.returncode != 0:
            errors.append(f"{' '.join(cmd)} failed: {err[-2000:]}")
    if errors:
        raise RuntimeError("\n".join(errors))


def _load(so: Path) -> ctypes.CDLL:
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
    global _so_path
    _so_path = build()
    lib = _load(_so_path)
    _link_gemm(lib)
    return lib


# ---- BLAS for the whole-op driver ----


def _blas_candidates() -> list[str]:
    """Shared libraries that may export sgemm_/dgemm_, best first: torch's CPU library (MKL or
    OpenBLAS linked in, on the usual wheels), then every BLAS-looking library already mapped into
    this process (/proc/self/maps on Linux), so the kernels use the BLAS torch itself runs."""
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
    return list(dict.fromkeys(found))  # in order, without repeats


def _ilp64(lib: ctypes.CDLL) -> bool:
    """True for an OpenBLAS built with 64-bit integers (the kernels pass 32-bit ones)."""
    if hasattr(lib, "openblas_get_config"):
        lib.openblas_get_config.restype = ctypes.c_char_p
        return b"USE64BITINT" in (lib.openblas_get_config() or b"")
    return False


def _addr(lib: ctypes.CDLL, name: str) -> int | None:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _link_gemm(lib: ctypes.CDLL) -> None:
    """Hand the kernels the first candidate BLAS exporting sgemm_ and dgemm_ (32-bit integers),
    checked on a small product; with none, only the per-chunk path (GEMMs through torch) runs."""
    global _whole_ok, _blas_path
    _whole_ok, _blas_path = False, None
    tried = []
    for path in _blas_candidates():
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
        if all(_gemm_self_test(lib, dt) for dt in (torch.float32, torch.float64)):
            _whole_ok, _blas_path = True, path
            return
        lib.set_gemm(None, None, None)
    why = f"self-test failed with {', '.join(tried)}" if tried else "no loaded BLAS exports sgemm_/dgemm_"
    warnings.warn(f"fpa: whole-op CPU kernel off, per-chunk kernels only ({why})", stacklevel=4)


def _gemm_self_test(lib: ctypes.CDLL, dt: torch.dtype) -> bool:
    """FoX attention through the whole-op driver against plain torch math, 2 heads x 5 positions."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 2, 5, 3, generator=g, dtype=dt) for _ in range(3))
    k, v = k[:, :, 0].contiguous(), v[:, :, 0].contiguous()
    cum = torch.zeros(2, 5, dtype=dt)
    out, lse = torch.empty(1, 1, 2, 5, 3, dtype=dt), torch.empty(2, 5, dtype=dt)
    fox_whole(q, k, v, out, None, lse, None, None, None, None, cum, 2, 0.5, lib=lib)
    s = (q[0, 0] @ k[0, 0].T) * 0.5 + torch.full((5, 5), float("-inf"), dtype=dt).triu(1)
    return bool(torch.allclose(out[0, 0], torch.softmax(s, -1) @ v[0, 0], atol=1e-5))


# ---- state ----


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
    """Why library() is None after a failed build (None otherwise)."""
    return _reason


def info() -> dict:
    """What is in use: the library file, the BLAS of the whole-op driver, the flags."""
    return {
        "enabled": library() is not None,
        "library": None if _so_path is None else str(_so_path),
        "blas": _blas_path,
        "whole_op": _whole_ok,
        "isa": default_isa(),
        "flags": compile_flags(isa=default_isa()),
        "reason": _reason,
    }


def whole_usable(B_kv: int) -> bool:
    """True when the whole-op driver should run: GEMMs linked and at least one (batch, kv head) per thread
    (it parallelizes over those; with fewer, the per-chunk path's multithreaded GEMMs do better)."""
    return library() is not None and _whole_ok and B_kv >= torch.get_num_threads()


def usable(*xs: Tensor) -> bool:
    """True when the kernels can run on these tensors (CPU, float32/float64, kernels built)."""
    return (
        all(x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) for x in xs) and library() is not None
    )


# ---- calls: every array is checked (CPU, dtype, contiguous, large enough) before its pointer goes to C++ ----


def _arr(name: str, x: Tensor | None, dtype: torch.dtype, numel: int, required: bool = True) -> int | None:
    """The data pointer of ``x`` after checking it; None for an absent optional array."""
    if x is None:
        if required:
            raise ValueError(f"{name} is required here")
        return None
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {x.device}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got shape {tuple(x.shape)} with strides {x.stride()}")
    if x.numel() < numel:
        raise ValueError(f"{name} has {x.numel()} elements, the kernel needs {numel} (shape {tuple(x.shape)})")
    return x.data_ptr()


def _dtype(name: str, x: Tensor) -> tuple[torch.dtype, str]:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype == torch.float32:
        return x.dtype, "f32"
    if x.dtype == torch.float64:
        return x.dtype, "f64"
    raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")


def _chunk(r0: int, r1: int, Tq: int) -> None:
    if not 0 <= r0 < r1 <= Tq:
        raise ValueError(f"the query chunk [r0, r1) = [{r0}, {r1}) must lie in [0, Tq = {Tq})")


def _lib_or_raise(lib: ctypes.CDLL | None = None) -> ctypes.CDLL:
    lib = lib or library()
    if lib is None:
        raise RuntimeError(f"fpa: the CPU kernels are not available ({reason() or 'FPA_CPU_KERNEL=0'})")
    return lib


def fpa_rows(
    S: Tensor,
    dP: Tensor | None,
    lse: Tensor,
    delta: Tensor | None,
    field: Tensor,
    past_min: Tensor,
    level: Tensor,
    beta: Tensor,
    Hq: int,
    r0: int,
    r1: int,
    scale: float,
    grads: tuple[Tensor, Tensor, Tensor] | None = None,
) -> None:
    """One FPA query chunk [r0, r1). S, dP (BH, c, K) raw q.k and dO.v; lse, delta (BH, Tq);
    field (BH, Tq); past_min (BH, P); level (BH, Tk); beta (Hq,). Forward when dP is None
    (S -> P, lse written); else backward (S -> P, dP -> dS), accumulating into grads =
    (dvirtual (BH, Tq + P), dlevel (BH, Tk), dbeta (BH,) float64) when given."""
    lib = _lib_or_raise()
    dt, sfx = _dtype("S", S)
    if field.dim() != 2 or past_min.dim() != 2:
        raise ValueError(
            f"field and past_min must be (BH, Tq) and (BH, P), got {tuple(field.shape)}, {tuple(past_min.shape)}"
        )
    BH, Tq, P = field.shape[0], field.shape[1], past_min.shape[1]
    _chunk(r0, r1, Tq)
    n, bwd = BH * (r1 - r0) * (P + r1), dP is not None
    ptrs = [
        _arr("S", S, dt, n),
        _arr("dP", dP, dt, n, required=False),
        _arr("lse", lse, dt, BH * Tq),
        _arr("delta", delta, dt, BH * Tq, required=bwd),
        _arr("field", field, dt, BH * Tq),
        _arr("past_min", past_min, dt, BH * P),
        _arr("level", level, dt, BH * (P + Tq)),
        _arr("beta", beta, dt, Hq),
    ]
    if Hq <= 0 or BH % Hq:
        raise ValueError(f"Hq = {Hq} must divide the number of row blocks BH = {BH}")
    dv, dl, db = grads if grads is not None else (None, None, None)
    want = grads is not None and bwd
    gp = [
        _arr("dvirtual", dv, dt, BH * (Tq + P), want),
        _arr("dlevel", dl, dt, BH * (P + Tq), want),
        _arr("dbeta", db, torch.float64, BH, want),
    ]
    fn = getattr(lib, f"fpa_{'bwd' if bwd else 'fwd'}_{sfx}")
    fn(*ptrs, BH, Hq, Tq, P, r0, r1, float(scale), int(want), *gp)


def fox_rows(
    S: Tensor,
    dP: Tensor | None,
    lse: Tensor,
    delta: Tensor | None,
    cum: Tensor,
    Tq: int,
    r0: int,
    r1: int,
    scale: float,
    dcum: Tensor | None = None,
) -> None:
    """One FoX query chunk: like fpa_rows with the bias cum_i - cum_j; cum (BH, Tk), dcum likewise."""
    lib = _lib_or_raise()
    dt, sfx = _dtype("S", S)
    if cum.dim() != 2 or cum.shape[1] < Tq:
        raise ValueError(f"cum must be (BH, Tk) with Tk >= Tq = {Tq}, got {tuple(cum.shape)}")
    BH, Tk = cum.shape
    _chunk(r0, r1, Tq)
    n, bwd = BH * (r1 - r0) * (Tk - Tq + r1), dP is not None
    want = dcum is not None and bwd
    fn = getattr(lib, f"fox_{'bwd' if bwd else 'fwd'}_{sfx}")
    fn(
        _arr("S", S, dt, n),
        _arr("dP", dP, dt, n, required=False),
        _arr("lse", lse, dt, BH * Tq),
        _arr("delta", delta, dt, BH * Tq, required=bwd),
        _arr("cum", cum, dt, BH * Tk),
        BH,
        Tq,
        Tk - Tq,
        r0,
        r1,
        float(scale),
        int(want),
        _arr("dcum", dcum, dt, BH * Tk, want),
    )


def _whole_common(q, k, v, out, dout, lse, delta, dq, dk, dv, P: int, chunk: int, scale: float) -> tuple[list, str]:
    """Shared arguments: q (B, Hkv, G, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), out/dout
    (B, Hkv, G, Tq, Dv), lse/delta (B*Hq, Tq), dq/dk/dv like q/k/v; all contiguous."""
    dt, sfx = _dtype("q", q)
    if q.dim() != 5 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be (B, Hkv, G, Tq, D), (B, Hkv, Tk, D), (B, Hkv, Tk, Dv), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, Hkv, G, Tq, D = q.shape
    Dv, BKV, Tk = v.shape[-1], B * Hkv, P + Tq
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    bwd = dout is not None
    ptrs = [
        _arr("q", q, dt, BKV * G * Tq * D),
        _arr("k", k, dt, BKV * Tk * D),
        _arr("v", v, dt, BKV * Tk * Dv),
        _arr("out", out, dt, BKV * G * Tq * Dv, required=not bwd),
        _arr("dout", dout, dt, BKV * G * Tq * Dv, required=False),
        _arr("lse", lse, dt, BKV * G * Tq),
        _arr("delta", delta, dt, BKV * G * Tq, required=bwd),
        _arr("dq", dq, dt, BKV * G * Tq * D, bwd),
        _arr("dk", dk, dt, BKV * Tk * D, bwd),
        _arr("dv", dv, dt, BKV * Tk * Dv, bwd),
    ]
    return [*ptrs, BKV, G, Tq, D, Dv, chunk, float(scale)], sfx


def fpa_whole(
    q,
    k,
    v,
    out,
    dout,
    lse,
    delta,
    dq,
    dk,
    dv,
    field: Tensor,
    past_min: Tensor,
    level: Tensor,
    beta: Tensor,
    chunk: int,
    scale: float,
    grads: tuple[Tensor, Tensor, Tensor] | None = None,
) -> None:
    """The whole FPA op in C++ (forward when dout is None, else backward); field/past_min/level as
    in fpa_rows, grads = (dvirtual, dlevel, dbeta) accumulated when given."""
    lib = _lib_or_raise()
    P = past_min.shape[-1]
    common, sfx = _whole_common(q, k, v, out, dout, lse, delta, dq, dk, dv, P, chunk, scale)
    dt, BH, Tq, Hq = q.dtype, q.shape[0] * q.shape[1] * q.shape[2], q.shape[3], beta.numel()
    if Hq <= 0 or BH % Hq:
        raise ValueError(f"beta's {Hq} heads must divide the number of row blocks BH = {BH}")
    want = grads is not None and dout is not None
    dv_, dl, db = grads if grads is not None else (None, None, None)
    fn = getattr(lib, f"fpa_whole_{'fwd' if dout is None else 'bwd'}_{sfx}")
    fn(
        *common,
        _arr("field", field, dt, BH * Tq),
        _arr("past_min", past_min, dt, BH * P),
        _arr("level", level, dt, BH * (P + Tq)),
        _arr("beta", beta, dt, Hq),
        Hq,
        P,
        int(want),
        _arr("dvirtual", dv_, dt, BH * (Tq + P), want),
        _arr("dlevel", dl, dt, BH * (P + Tq), want),
        _arr("dbeta", db, torch.float64, BH, want),
    )


def fox_whole(
    q,
    k,
    v,
    out,
    dout,
    lse,
    delta,
    dq,
    dk,
    dv,
    cum: Tensor,
    chunk: int,
    scale: float,
    dcum: Tensor | None = None,
    lib: ctypes.CDLL | None = None,
) -> None:
    """The whole FoX op in C++; cum (B*Hq, Tk), dcum likewise (accumulated when given)."""
    lib = _lib_or_raise(lib)
    Tq = q.shape[3]
    P = cum.shape[-1] - Tq
    if cum.dim() != 2 or P < 0:
        raise ValueError(f"cum must be (B*Hq, Tk) with Tk >= Tq = {Tq}, got {tuple(cum.shape)}")
    common, sfx = _whole_common(q, k, v, out, dout, lse, delta, dq, dk, dv, P, chunk, scale)
    BH, want = q.shape[0] * q.shape[1] * q.shape[2], dcum is not None and dout is not None
    fn = getattr(lib, f"fox_whole_{'fwd' if dout is None else 'bwd'}_{sfx}")
    fn(
        *common,
        _arr("cum", cum, q.dtype, BH * (P + Tq)),
        P,
        int(want),
        _arr("dcum", dcum, q.dtype, BH * (P + Tq), want),
    )
