"""Where a result came from: the git commit of the code, whether the tree was clean, the command."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import fpa

if TYPE_CHECKING:
    from fpa.experiments.stages import Stages


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


def run_provenance(stages: Stages, command: str | None) -> dict:
    """{"commit", "dirty", "command", "wall_s"} of a staged run: the one commit every recorded stage
    was computed at, whether any was computed from a dirty tree, the command (this process's if
    None) and the run's wall time (``Stages.wall_time``: every call's, a resumed run's included).

    Raises:
        ValueError: The stages were computed at different commits (naming the stages of each).
    """
    by_commit: dict[str | None, list[str]] = {}
    for name in stages.state["done"]:
        by_commit.setdefault(stages.stamp_of(name).get("commit"), []).append(name)
    if len(by_commit) > 1:
        detail = "; ".join(f"{c}: {names[:4]}{' ...' if len(names) > 4 else ''}" for c, names in by_commit.items())
        raise ValueError(
            f"stages of {stages.dir} were computed at different commits ({detail}); "
            "rerun the stale ones (delete them from state.json) or start a new folder"
        )
    return {
        "commit": next(iter(by_commit), None),
        "dirty": any(stages.stamp_of(n).get("dirty") for n in stages.state["done"]),
        "command": command or command_line(),
        "wall_s": round(stages.wall_time(), 1),
    }
