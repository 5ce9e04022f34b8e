"""Training progress on the console: a tqdm bar on a terminal, else one plain line every few steps
(step, loss, tokens/s, ETA), so that a log file written by a cluster job shows progress."""

from __future__ import annotations

import sys
import time

from fpa.checks import positive_int


def console_line(text: str) -> None:
    """Print one line without breaking an active tqdm bar (``tqdm.write``)."""
    from tqdm import tqdm

    tqdm.write(text)


def _duration(seconds: float) -> str:
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class StepProgress:
    """Progress of steps ``start`` .. ``total``. ``bar``: a tqdm bar if True and stdout is a
    terminal; otherwise (``bar=False``, i.e. ``--no-progress``, or stdout redirected) a line
    ``[name] step S/T loss L tok/s R eta E`` every ``every`` steps and at the last step."""

    def __init__(self, name: str, start: int, total: int, every: int, bar: bool = True):
        positive_int("every", every)
        self.name, self.start, self.total, self.every = name, start, total, every
        self.t0 = time.perf_counter()
        self._bar = None
        if bar and sys.stdout.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, desc=name, dynamic_ncols=True)

    @property
    def is_bar(self) -> bool:
        """Whether progress is shown as a bar (else as plain lines)."""
        return self._bar is not None

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        """Report that step ``step`` (1-based count of steps done) finished with ``loss``;
        ``tokens_per_s`` is the mean throughput since ``start``."""
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")
            return
        if step % self.every and step != self.total:
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(1, step - self.start) * (self.total - step)
        console_line(
            f"[{self.name}] step {step}/{self.total} loss {loss:.4f} tok/s {tokens_per_s:,.0f} eta {_duration(eta)}"
        )

    def close(self) -> None:
        """Close the bar, if any."""
        if self._bar is not None:
            self._bar.close()
