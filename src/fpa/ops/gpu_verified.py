"""Which GPU backends ``backend="auto"`` may choose: only those verified on this kind of GPU.

The triton and flex FPA paths were written without a GPU. So ``auto`` on CUDA picks one of them
only when it is allowed, in this order:

1. ``FPA_GPU_BACKENDS`` (environment), a comma-separated preference list such as ``triton,flex``
   or ``flex``; empty (``FPA_GPU_BACKENDS=``) means neither (``auto`` then uses ``chunked``).
2. Otherwise the record ``benchmarks/gpu_check.py`` writes (default ``~/.cache/fpa/gpu_check.json``,
   or ``FPA_GPU_CHECK_RECORD``): a backend is allowed on a device when its correctness section
   passed there, with the same device name, torch and triton versions and the same source of the
   triton/flex files. A failed check, or any change of those, takes the backend out again.
3. With neither, nothing is allowed, and ``auto`` on CUDA runs ``chunked`` (exact, slower).

An explicit ``backend="triton"`` or ``"flex"`` always runs what was asked.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import torch

GPU_BACKENDS = ("triton", "flex")
_SOURCES = ("fpa/triton.py", "fpa/triton_kernels.py", "fpa/triton_prep.py", "fpa/triton_configs.py", "fpa/flex.py")


def record_path() -> Path:
    """The verification record's file: ``$FPA_GPU_CHECK_RECORD``, else ``~/.cache/fpa/gpu_check.json``."""
    return Path(os.environ.get("FPA_GPU_CHECK_RECORD", Path.home() / ".cache" / "fpa" / "gpu_check.json"))


def source_hash() -> str:
    """sha256 (16 hex) of the GPU backends' source files."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for rel in _SOURCES:
        p = root / rel
        h.update(p.read_bytes() if p.exists() else b"missing")
    return h.hexdigest()[:16]


def environment_key(device: torch.device) -> dict[str, str]:
    """What a verification is valid for: device name, torch, triton, source hash."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return {"device": name, "torch": torch.__version__, "triton": triton_version, "source": source_hash()}


def _read() -> list[dict]:
    try:
        data = json.loads(record_path().read_text())
        return data if isinstance(data, list) else []
    except (OSError, ValueError):
        return []


def write_verdicts(device: torch.device, verdicts: dict[str, bool], detail: str = "") -> Path:
    """Record the correctness verdict of each GPU backend for this environment (replacing older ones)."""
    key = environment_key(device)
    entries = [e for e in _read() if e.get("key") != key]
    entries.append({"key": key, "verdicts": {b: bool(v) for b, v in verdicts.items()}, "detail": detail[-2000:]})
    path = record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    os.replace(tmp, path)
    return path


@functools.lru_cache(maxsize=16)
def _allowed(device: str, env: str | None, stamp: float) -> tuple[str, ...]:
    if env is not None:
        return tuple(b for b in (s.strip() for s in env.split(",")) if b in GPU_BACKENDS)
    dev = torch.device(device)
    if dev.type != "cuda":
        return ()
    key = environment_key(dev)
    for e in _read():
        if e.get("key") == key:
            return tuple(b for b in GPU_BACKENDS if e.get("verdicts", {}).get(b) is True)
    return ()


@torch.compiler.assume_constant_result  # a compiled model reads it once, at trace time
def allowed_backends(device: str) -> tuple[str, ...]:
    """GPU backends ``auto`` may pick on ``device`` (e.g. "cuda:0"), in order of preference (see the
    module docstring). Cached; a new record (its mtime) or environment value is seen at once."""
    try:
        stamp = record_path().stat().st_mtime
    except OSError:
        stamp = 0.0
    return _allowed(device, os.environ.get("FPA_GPU_BACKENDS"), stamp)


def explain(device: str) -> str:
    """Why ``allowed_backends(device)`` is what it is, in one clause (for ``explain_backend``)."""
    allowed = allowed_backends(device)
    env = os.environ.get("FPA_GPU_BACKENDS")
    if env is not None:
        return f"FPA_GPU_BACKENDS={env!r} allows {', '.join(allowed) or 'none'}"
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"{device} is not a CUDA device"
    key = environment_key(dev)
    entries = [e for e in _read() if isinstance(e.get("key"), dict)]
    path = record_path()
    for e in entries:
        if e["key"] == key:
            failed = [b for b in GPU_BACKENDS if b not in allowed]
            return (
                f"benchmarks/gpu_check.py passed {', '.join(allowed) or 'nothing'}"
                + (f" and failed {', '.join(failed)}" if failed else "")
                + f" on {key['device']} (record {path})"
            )
    same = [e for e in entries if e["key"].get("device") == key["device"]]
    if same:
        changed = [k for k in key if same[-1]["key"].get(k) != key[k]]
        return (
            f"the record of benchmarks/gpu_check.py on {key['device']} is stale ({', '.join(changed)} changed; {path})"
        )
    return f"no record of benchmarks/gpu_check.py for {key['device']} in {path} and FPA_GPU_BACKENDS unset"
