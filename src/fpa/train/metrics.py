"""Metrics: one JSON object per line in ``out_dir/metrics.jsonl`` (and TensorBoard if asked and installed)."""

from __future__ import annotations

import json
from pathlib import Path

from fpa.data.atomic import atomic_write_text

METRICS = "metrics.jsonl"


def read_metrics(out_dir: str | Path) -> list[dict]:
    """The records of ``out_dir/metrics.jsonl`` in order (empty if there is no such file)."""
    path = Path(out_dir) / METRICS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLog:
    """Appends records (each with a "step"); on resume, drops records past the resumed step so
    the file reads as one uninterrupted run."""

    def __init__(self, out_dir: str | Path, resume_step: int, tensorboard: bool = False):
        self.path = Path(out_dir) / METRICS
        kept = [r for r in read_metrics(out_dir) if r.get("step", 0) <= resume_step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._f = self.path.open("a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))
            except ImportError:
                print("tensorboard is not installed; metrics go to metrics.jsonl only")

    def log(self, record: dict) -> None:
        """Append ``record`` (with a "step") to the file, and its numbers to TensorBoard if open."""
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        """Close the file and the TensorBoard writer."""
        self._f.close()
        if self._tb is not None:
            self._tb.close()
