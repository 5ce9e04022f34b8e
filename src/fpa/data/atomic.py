"""Atomic file writes: write a temp file in the target folder, fsync, then ``os.replace``.

A crash mid-write leaves the previous file (if any) intact and at most a stray ``*.tmp``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(f)`` on a temp file beside ``path``, then atomically move it to ``path``.

    Args:
        path: The destination; its folder is created if missing.
        write: Writes the content to the open binary file; its return value is ignored.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Atomically write ``text`` to ``path`` as UTF-8."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Atomically write ``data`` to ``path``."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_figure(path: str | Path, fig, dpi: int = 110, **savefig_kw) -> None:
    """Render a matplotlib figure to PNG in memory, write it atomically, and close the figure."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, **savefig_kw)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
