"""Where a result came from: the git commit of the code, whether the tree was clean, the command."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import fpa


def _git(*args: str) -> str | None:
    root = Path(fpa.__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_state() -> dict:
    """{"commit": 40 hex or None (not a git checkout), "dirty": whether src/ differs from it}."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", "src") if commit else None
    return {"commit": commit, "dirty": bool(status)}


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: ``fpa <args>`` when run through the console script."""
    argv = list(sys.argv if argv is None else argv)
    if argv and Path(argv[0]).name in ("fpa", "cli.py", "__main__.py"):
        argv[0] = "fpa"
    return shlex.join(argv)
