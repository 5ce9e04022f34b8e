import json

import pytest

from fpa.experiments.stages import Stages


def test_finished_stages_are_not_rerun_and_outputs_survive(tmp_path):
    calls = []
    s = Stages(tmp_path, log=lambda m: None)
    assert s.run("a", lambda: calls.append("a") or {"x": 1}) == {"x": 1}
    s2 = Stages(tmp_path, log=lambda m: None)  # a new process resuming
    assert s2.run("a", lambda: calls.append("again") or {"x": 2}) == {"x": 1}
    assert calls == ["a"] and json.loads((tmp_path / "state.json").read_text())["done"] == ["a"]


def test_an_interrupted_stage_is_rerun(tmp_path):
    s = Stages(tmp_path, log=lambda m: None)

    def boom():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s.run("b", boom)
    assert not s.done("b") and not (tmp_path / "stages" / "b.json").exists()
    assert Stages(tmp_path, log=lambda m: None).run("b", lambda: {"ok": True}) == {"ok": True}


def test_a_stage_whose_output_vanished_is_rerun(tmp_path):
    s = Stages(tmp_path, log=lambda m: None)
    s.run("c", lambda: {"v": 1})
    (tmp_path / "stages" / "c.json").unlink()
    assert Stages(tmp_path, log=lambda m: None).run("c", lambda: {"v": 2}) == {"v": 2}


def test_bad_stage_names(tmp_path):
    with pytest.raises(ValueError, match="stage name"):
        Stages(tmp_path).run("../x", dict)


def test_stage_lines_go_through_tqdm_write(tmp_path, monkeypatch, capsys):
    """By default the [stage] lines are printed with tqdm.write, which clears and redraws an
    active bar instead of writing into it; a bar open meanwhile is not broken."""
    import tqdm

    from fpa.experiments.lm.reproduce import reproduce

    written: list[str] = []
    real = tqdm.tqdm.write
    monkeypatch.setattr(tqdm.tqdm, "write", classmethod(lambda cls, s, *a, **k: (written.append(s), real(s))))
    with tqdm.tqdm(total=2, desc="outer") as bar:
        Stages(tmp_path).run("a", lambda: {"x": 1})
        bar.update(1)
    assert written == ["[stage] a ...", "[stage] a done in " + written[1].rsplit(" in ", 1)[1]]
    assert "[stage] a ..." in capsys.readouterr().out
    import inspect

    assert inspect.signature(reproduce).parameters["log"].default is inspect.signature(Stages).parameters["log"].default


def test_discarded_stages_are_no_longer_done_and_their_outputs_are_gone(tmp_path):
    st = Stages(tmp_path, log=lambda m: None)
    for name in ("a", "b"):
        st.run(name, lambda: {"x": 1})
    st.discard(["a"])
    again = Stages(tmp_path, log=lambda m: None)
    assert not again.done("a") and again.done("b") and not again.output_path("a").exists()
    assert "a" not in again.state["seconds"] and "a" not in again.state["stamps"]


def test_wall_time_is_counted_as_stages_are_recorded_so_a_killed_call_keeps_it(tmp_path, monkeypatch):
    import fpa.experiments.stages as stages_module

    clock = iter([100.0, 130.0, 200.0, 205.0])  # start, a stage recorded, (killed); a new call, its end
    monkeypatch.setattr(stages_module.time, "time", lambda: next(clock))
    first = Stages(tmp_path, log=lambda m: None)
    first.record("a", {}, 30.0)  # the call is killed after this stage: its 30 s are in the state file
    again = Stages(tmp_path, log=lambda m: None)
    assert again.state["wall_s"] == 30.0
    assert again.wall_time() == 35.0
