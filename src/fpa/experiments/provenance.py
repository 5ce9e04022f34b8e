"""Where a result came from: the git commit of the code, whether the tree was clean, the command."""

from __future__ import annotations

import hashlib
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
    """{"commit": 40 hex or None (not a git checkout), "dirty": whether src/ differs from it,
    "src": a digest of src/'s changes against the commit (the changed and untracked paths and the
    diff of the tracked ones), so that two states with the same commit and different edits differ}."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=all", "--", "src") if commit else None
    diff = _git("diff", "HEAD", "--", "src") if status else ""
    digest = hashlib.sha256(f"{status or ''}\0{diff or ''}".encode()).hexdigest()[:16]
    return {"commit": commit, "dirty": bool(status), "src": digest}


def refuse_changed_code(stamp: dict) -> None:
    """Refuse to start stages when the code under src/ is no longer the code ``stamp`` (a run's
    ``code_state()`` at its start) recorded: worker processes import the working tree as it is
    when they start, so their stages would be computed by other code than the stamp says. A stamp
    without "src" (a runner that records no code state) is not checked.

    Raises:
        RuntimeError: The commit or src/'s changes differ from the stamp's.
    """
    if "src" not in stamp:
        return
    now = code_state()
    if (now["commit"], now["src"]) != (stamp.get("commit"), stamp["src"]):
        was = f"{str(stamp.get('commit'))[:12]}{' with changes' if stamp.get('dirty') else ''}"
        is_ = f"{str(now['commit'])[:12]}{' with changes' if now['dirty'] else ''}"
        raise RuntimeError(
            f"the code under src/ changed since this run started (commit {was}, now {is_}): the stages left "
            "would import the new code under the old stamp; restore that code (or start a new folder) and resume"
        )


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
