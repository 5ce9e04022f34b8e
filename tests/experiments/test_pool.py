"""The worker pool of fpa.experiments.pool: workers do not outlive a killed parent."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = """
import os, sys, time
from pathlib import Path
from fpa.experiments.pool import run_tasks
from fpa.experiments.stages import Stages

def sleeper(path):
    Path(path).write_text(str(os.getpid()))
    time.sleep(300)
    return {}

if __name__ == "__main__":
    d = Path(sys.argv[1])
    tasks = [(n, sleeper, (str(d / f"{n}.pid"),)) for n in ("a", "b")]
    run_tasks(Stages(d / "stages", log=lambda m: None), tasks, jobs=2, progress=False)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its new parent, counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_exit_when_the_parent_is_killed(tmp_path):
    (tmp_path / "run.py").write_text(SCRIPT)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "run.py"), str(tmp_path)])
    try:
        pid_files = [tmp_path / "a.pid", tmp_path / "b.pid"]
        deadline = time.time() + 120
        while not all(p.is_file() and p.read_text() for p in pid_files):
            assert time.time() < deadline and parent.poll() is None, "the workers never started"
            time.sleep(0.2)
        workers = [int(p.read_text()) for p in pid_files]
        assert all(_alive(w) for w in workers)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 30
        while any(_alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers), "a worker outlived its killed parent"
    finally:
        parent.kill()
        for p in (tmp_path / "a.pid", tmp_path / "b.pid"):
            if p.is_file() and p.read_text():
                try:
                    os.kill(int(p.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _two_stages(tag: str) -> dict:
    return {f"first-{tag}": {"output": {"tag": tag}, "seconds": 0.5}, f"second-{tag}": {"output": {}, "seconds": 1.0}}


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_unit_records_every_stage_it_returns(tmp_path, jobs):
    from fpa.experiments.pool import run_units
    from fpa.experiments.stages import Stages

    st = Stages(tmp_path, log=lambda m: None)
    run_units(st, [("u1", _two_stages, ("x",)), ("u2", _two_stages, ("y",))], jobs=jobs, progress=False)
    assert sorted(st.state["done"]) == ["first-x", "first-y", "second-x", "second-y"]
    assert st.seconds()["second-y"] == 1.0
    assert (tmp_path / "stages" / "first-x.json").read_text().strip().startswith("{")
