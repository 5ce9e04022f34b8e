"""fpa.experiments.provenance: the code state digests src/'s edits, and stages refuse to start
when the code changed since the run's stamp."""

import pytest

from fpa.experiments import provenance
from fpa.experiments.pool import run_tasks, run_units
from fpa.experiments.stages import Stages


def _fake_git(monkeypatch, status: str, diff: str) -> None:
    answers = {"rev-parse": "a" * 40, "status": status, "diff": diff}
    monkeypatch.setattr(provenance, "_git", lambda *args: answers[args[0]])


def test_the_digest_follows_the_changes_under_src(monkeypatch):
    _fake_git(monkeypatch, "", "")
    clean = provenance.code_state()
    assert clean["commit"] == "a" * 40 and clean["dirty"] is False
    _fake_git(monkeypatch, " M src/fpa/x.py", "+a = 1")
    one = provenance.code_state()
    _fake_git(monkeypatch, " M src/fpa/x.py", "+a = 2")  # the same file, edited again
    two = provenance.code_state()
    _fake_git(monkeypatch, "?? src/fpa/new.py", "")  # an untracked file is a change
    new = provenance.code_state()
    assert one["dirty"] and two["dirty"] and new["dirty"]
    assert len({clean["src"], one["src"], two["src"], new["src"]}) == 4
    _fake_git(monkeypatch, " M src/fpa/x.py", "+a = 1")
    assert provenance.code_state() == one


def test_refuses_code_that_changed_since_the_stamp(monkeypatch):
    stamp = {"commit": "a" * 40, "dirty": False, "src": "d0"}
    monkeypatch.setattr(provenance, "code_state", lambda: dict(stamp))
    provenance.refuse_changed_code(stamp)
    for now in ({**stamp, "src": "d1", "dirty": True}, {**stamp, "commit": "b" * 40}):
        monkeypatch.setattr(provenance, "code_state", lambda now=now: now)
        with pytest.raises(RuntimeError, match=r"code under src/ changed since this run started \(commit aaaaaaaaaaaa"):
            provenance.refuse_changed_code(stamp)
    provenance.refuse_changed_code({"commit": "a" * 40})  # a stamp without a code state: nothing to check


def _touch(path: str) -> dict:
    open(path, "w").close()
    return {}


@pytest.mark.parametrize("runner", ["tasks", "units"])
def test_no_stage_starts_after_the_code_changed(tmp_path, monkeypatch, runner):
    stamp = {"commit": "a" * 40, "dirty": False, "src": "d0"}
    monkeypatch.setattr(provenance, "code_state", lambda: {**stamp, "src": "d1", "dirty": True})
    stages = Stages(tmp_path / "run", log=lambda m: None, stamp=stamp)
    marker = tmp_path / "ran"
    with pytest.raises(RuntimeError, match="changed since this run started"):
        if runner == "tasks":
            run_tasks(stages, [("s", _touch, (str(marker),))], progress=False)
        else:
            run_units(stages, [("u", _touch, (str(marker),))], progress=False)
    assert not marker.exists() and stages.state["done"] == []
    monkeypatch.setattr(provenance, "code_state", lambda: dict(stamp))
    assert run_tasks(stages, [("s", _touch, (str(marker),))], progress=False) == {"s": {}}
    assert marker.exists()
