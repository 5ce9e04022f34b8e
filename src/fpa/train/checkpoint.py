"""Checkpoints: ``out_dir/checkpoints/step-{N:08d}.pt`` written atomically, with a sha256 sidecar.

Each checkpoint is one ``torch.save`` payload written to a temp file and renamed; its sidecar
``step-{N:08d}.json`` ({"step", "sha256", "bytes"}) is written (also atomically) after it, so a
checkpoint counts only once both exist. ``load_checkpoint`` checks size and hash before
unpickling, so a truncated or corrupted file raises ValueError naming it.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import torch

from fpa.data.atomic import atomic_write, atomic_write_text

CKPT_DIR = "checkpoints"
_NAME = re.compile(r"step-(\d{8})\.json$")


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives under ``out_dir``."""
    return Path(out_dir) / CKPT_DIR / f"step-{step:08d}.pt"


def save_checkpoint(out_dir: str | Path, step: int, state: dict, keep: int = 2) -> Path:
    """Write ``state`` as the checkpoint of ``step`` and delete all but the newest ``keep``."""
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    path = checkpoint_path(out_dir, step)
    atomic_write(path, lambda f: f.write(data))
    side = {"step": step, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    atomic_write_text(path.with_suffix(".json"), json.dumps(side) + "\n")
    for old in list_checkpoints(out_dir)[:-keep]:
        old.with_suffix(".json").unlink(missing_ok=True)
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoints (payload + sidecar), oldest first."""
    d = Path(out_dir) / CKPT_DIR
    if not d.is_dir():
        return []
    found = sorted((int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name)))
    return [p.with_suffix(".pt") for _, p in found if p.with_suffix(".pt").is_file()]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``out_dir``, or None if there is none."""
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def load_checkpoint(path: str | Path) -> dict:
    """The state saved at ``path``; ValueError if it is truncated, corrupt or not a checkpoint."""
    path = Path(path)
    side_path = path.with_suffix(".json")
    try:
        side = json.loads(side_path.read_text())
        expected_bytes, expected_hash = int(side["bytes"]), side["sha256"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {path}: its sidecar {side_path.name} is missing or corrupt ({e})") from None
    if not path.is_file():
        raise ValueError(f"checkpoint {path} is missing")
    data = path.read_bytes()
    if len(data) != expected_bytes:
        raise ValueError(
            f"checkpoint {path} is truncated or corrupt: {len(data)} bytes, expected {expected_bytes}. "
            f"Delete it (and {side_path.name}) to resume from the previous checkpoint."
        )
    if hashlib.sha256(data).hexdigest() != expected_hash:
        raise ValueError(
            f"checkpoint {path} is corrupt: sha256 mismatch. "
            f"Delete it (and {side_path.name}) to resume from the previous checkpoint."
        )
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        raise ValueError(f"checkpoint {path} could not be read: {type(e).__name__}: {e}") from None
