"""Resumable pipeline stages: each finished stage's output is a JSON file written atomically, and
a state file lists the finished stages, so an interrupted run restarts where it stopped."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from fpa.data.atomic import atomic_write_text
from fpa.train.progress import console_line


def write_json(path: str | Path, obj) -> None:
    """Atomically write ``obj`` as indented JSON (temp file + os.replace)."""
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False, allow_nan=True) + "\n")


def read_json(path: str | Path):
    """The JSON value stored at ``path``."""
    return json.loads(Path(path).read_text())


class Stages:
    """Stage runner over ``out_dir``: ``out_dir/state.json`` = {"done": [names], "seconds": {name: s}}
    and ``out_dir/stages/<name>.json`` = each stage's output. ``write=False`` (torchrun ranks > 0)
    runs the stages without recording them. ``stamp`` (e.g. the code's commit) is recorded with
    every stage this runner finishes, in ``state["stamps"][name]``. ``log`` prints its
    ``[stage]`` lines (default ``tqdm.write``, so that they never break a progress bar)."""

    def __init__(
        self,
        out_dir: str | Path,
        log: Callable[[str], None] = console_line,
        write: bool = True,
        stamp: dict | None = None,
    ):
        self.dir, self.write = Path(out_dir), write
        self.state_path = self.dir / "state.json"
        self.log = log
        self.stamp = dict(stamp or {})
        self.state = read_json(self.state_path) if self.state_path.is_file() else {"done": [], "seconds": {}}
        self.state.setdefault("stamps", {})
        self._mark = time.time()  # wall time up to here is counted in state["wall_s"]

    def output_path(self, name: str) -> Path:
        """Where the output of stage ``name`` is written.

        Raises:
            ValueError: If ``name`` is not a plain file name.
        """
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"stage name must be a plain file name, got {name!r}")
        return self.dir / "stages" / f"{name}.json"

    def done(self, name: str) -> bool:
        """Whether stage ``name`` is recorded as finished and its output file exists."""
        return name in self.state["done"] and self.output_path(name).is_file()

    def run(self, name: str, fn: Callable[[], dict]) -> dict:
        """The output of stage ``name``: read back if it already finished, else ``fn()`` (saved)."""
        if self.done(name):
            return read_json(self.output_path(name))
        self.log(f"[stage] {name} ...")
        t0 = time.perf_counter()
        out = fn()
        return self.record(name, out, time.perf_counter() - t0)

    def discard(self, names: list[str]) -> None:
        """Forget the stages ``names``: their outputs are deleted and they are no longer done."""
        if not self.write:
            return
        for name in names:
            self.output_path(name).unlink(missing_ok=True)
            for key in ("seconds", "stamps"):
                self.state[key].pop(name, None)
        self.state["done"] = [n for n in self.state["done"] if n not in set(names)]
        write_json(self.state_path, self.state)

    def record(self, name: str, out: dict, seconds: float) -> dict:
        """Save the output of stage ``name`` (computed elsewhere, e.g. in a worker process) and mark
        it done; returns ``out``."""
        if not self.write:
            return out
        write_json(self.output_path(name), out)
        self.state["done"] = [n for n in self.state["done"] if n != name] + [name]
        self.state["seconds"][name] = round(seconds, 2)
        self.state["stamps"][name] = self.stamp
        self._count_wall_time()
        write_json(self.state_path, self.state)
        self.log(f"[stage] {name} done in {seconds:.1f} s")
        return out

    def seconds(self) -> dict:
        """{stage name: seconds it took} for every recorded stage."""
        return dict(self.state["seconds"])

    def stamp_of(self, name: str) -> dict:
        """The stamp recorded with stage ``name`` ({} for a stage recorded without one)."""
        return dict(self.state["stamps"].get(name, {}))

    def _count_wall_time(self) -> None:
        now = time.time()
        self.state["wall_s"] = float(self.state.get("wall_s", 0.0)) + (now - self._mark)
        self._mark = now

    def wall_time(self) -> float:
        """The run's wall time in seconds: every call's, summed in the state file as it goes (each
        recorded stage counts the time since the last), so that a killed call's time up to its last
        recorded stage is kept; this call's remainder is counted now."""
        self._count_wall_time()
        if self.write:
            write_json(self.state_path, self.state)
        return self.state["wall_s"]
