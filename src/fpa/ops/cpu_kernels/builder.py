"""Compile the C++ kernels into a cached shared library: compiler, flags, cache folder, build lock.

The flags (:func:`compile_flags`) are ``-O3`` for the architecture's baseline, plus ``-mavx2`` on
x86-64 CPUs that have it (:func:`default_isa`); nothing tuned to the build machine (no
``-march=native``) and nothing that lets the compiler change the rounding the source writes (no
``-ffast-math``, no FMA contraction; sums in a fixed lane order). So the AVX2 build and the baseline
build give the same bits, and a result depends on the CPU only through what the kernels call:
torch's GEMMs (whose MKL/OpenBLAS code differs between CPUs) and libm's exp/log (docs/design.md,
"CPU kernels").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

_fcntl: ModuleType | None
try:
    import fcntl as _fcntl
except ImportError:  # not POSIX: builds are still installed atomically, just not serialized
    _fcntl = None

CSRC = Path(__file__).resolve().parent.parent / "csrc"
HEADERS = ("fpa_kernels.h",)
SOURCES = ("fpa_rows.cpp", "fpa_whole.cpp")

# Flags that change no result: -fno-trapping-math lets the backward loops' selects vectorize (the
# program never enables floating-point traps); -ffp-contract=off keeps a * b + c two roundings
# everywhere (GCC's default in GNU mode fuses them where the target has FMA, e.g. on aarch64).
_COMMON_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math"]
LINK_FLAGS = ["-shared", "-fopenmp"]
_X86 = ("x86_64", "amd64", "x64")


def default_isa(machine: str | None = None) -> str:
    """The instruction set the kernels are built for on this machine.

    Args:
        machine: A ``platform.machine()`` name; default this machine's.

    Returns:
        ``"avx2"`` on an x86-64 CPU that torch runs with AVX2 or AVX-512
        (``torch.backends.cpu.get_cpu_capability()``, so ``ATEN_CPU_CAPABILITY=default`` turns it
        off too), else ``"baseline"``.
    """
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

    Raises:
        ValueError: ``isa`` is neither "baseline" nor "avx2", or "avx2" on a CPU other than x86-64.
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
    """The C++ compiler: ``$CXX``, else g++, else c++.

    Raises:
        RuntimeError: There is none.
    """
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
    """16 hex digits of sha256(sources, flags, compiler, machine): the cached library's name.

    Args:
        cxx: The compiler (its ``--version`` is part of the key).
        flags: The compile flags; default this machine's (:func:`compile_flags`).

    Raises:
        RuntimeError: The compiler cannot be run.
    """
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
    """Where the built library goes.

    ``$FPA_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/fpa/kernels`` (``~/.cache/fpa/kernels`` when
    XDG_CACHE_HOME is unset, empty or relative); when that cannot be written, a private
    ``fpa-kernels-<uid>`` folder in the temp dir.

    Raises:
        RuntimeError: Neither folder is usable.
    """
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
        if _fcntl is not None:
            _fcntl.flock(fh.fileno(), _fcntl.LOCK_EX)
        try:
            yield
        finally:
            if _fcntl is not None:
                _fcntl.flock(fh.fileno(), _fcntl.LOCK_UN)


def build(cxx: str | None = None, flags: list[str] | None = None, cache: Path | None = None) -> Path:
    """Compile the kernels (unless the cache already holds them) and return the library's path.

    One process builds at a time per library (a file lock beside it); the result is installed with
    an atomic rename, so a reader never sees a half-written file.

    Args:
        cxx: The compiler; default :func:`compiler`.
        flags: The compile flags; default :func:`compile_flags` for :func:`default_isa`.
        cache: The folder of the library; default :func:`cache_dir`.

    Returns:
        The path of the shared library, ``fpa_kernels_<build_key>.so`` in ``cache``.

    Raises:
        RuntimeError: No compiler or cache folder, or a compile or link command failed (with the
            compiler's message).
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
