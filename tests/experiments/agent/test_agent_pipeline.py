"""``fpa agent --preset smoke`` end to end: stopped after training, then resumed to the end; every
file and every figure the report promises (per method and seed: accuracy and kept keys per
length, the growth exponent, the baselines at equal memory), and the command line."""

import json
import math

import pytest

from fpa.cli import main
from fpa.experiments.agent.analysis import budget_of, decode_name
from fpa.experiments.agent.pipeline import run_agent
from fpa.experiments.agent.preset import ARMS, BUDGET_METHODS, METHODS, PRESETS
from fpa.experiments.agent.report import PLOT
from fpa.experiments.stages import read_json
from fpa.tasks.agent_sessions import KINDS

SMOKE = PRESETS["smoke"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("agent-smoke")
    first: list[str] = []
    run_agent(SMOKE, out, progress=False, stop_after="train", log=first.append, command="fpa agent (train)")
    partial = {"report": (out / "report.md").read_text(), "files": sorted(p.name for p in out.iterdir())}
    logs: list[str] = []
    res = run_agent(SMOKE, out, progress=False, log=logs.append, command="fpa agent --preset smoke")
    return out, res, logs, partial


def test_the_run_stopped_after_training_reports_only_training(smoke):
    _, _, _, partial = smoke
    assert PLOT not in partial["files"] and PLOT not in partial["report"]
    assert "results.json" in partial["files"] and "report.md" in partial["files"]
    assert "training runs 4 of 4, 1x controls 0 of 4, long-session decodes 0 of 42" in partial["report"]


def test_resuming_does_not_train_again(smoke):
    _, _, logs, _ = smoke
    assert not any(line.startswith("[stage] train-") for line in logs)
    assert any(line.startswith("[stage] control-") for line in logs)


def test_every_file_and_key_of_the_done_when(smoke):
    out, res, _, _ = smoke
    for name in ("report.md", "results.json", PLOT, "state.json", ".gitignore"):
        assert (out / name).is_file(), name
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(res))
    seeds, lengths = [str(s) for s in SMOKE.seeds], [str(L) for L in SMOKE.lengths]
    for m in METHODS:
        assert set(res["runs"][m]) == set(seeds), m
        for s in seeds:
            for L in lengths:
                fig = res["runs"][m][s][L]
                assert set(KINDS) | {"open", "closed"} <= set(fig["accuracy"])
                assert 0 <= fig["accuracy"]["open"] <= 1 and fig["kept_keys"] > 0 and fig["bytes_held"] > 0
            assert math.isfinite(res["growth"][m][s]["kept_exponent"])
    for s in SMOKE.seeds:
        for L in SMOKE.lengths:
            budget = res["budgets"][str(s)][str(L)]
            assert budget == budget_of(read_json(out / "stages" / f"{decode_name('fpa-rule', s, L)}.json"))
            for m in BUDGET_METHODS:  # at FPA's memory: the budget, or every key when it exceeds the length
                assert res["runs"][m][str(s)][str(L)]["kept_keys"] <= min(budget, L), (m, s, L)
            assert res["runs"]["window"][str(s)][str(L)]["kept_keys"] == min(budget, L)
            assert res["runs"]["fpa-full"][str(s)][str(L)]["kept_keys"] == L  # one key per byte
    for arm in ARMS:
        assert set(res["control"][arm]) == set(seeds) and set(res["training"][arm]) == set(seeds)
    assert res["goal"]["met"] in (True, False, None) and set(res["diagnosis"]) == set(lengths)
    assert res["provenance"]["command"] == "fpa agent --preset smoke" and len(res["provenance"]["commit"]) == 40


def test_the_report_has_a_row_per_method_and_seed(smoke):
    out, _, _, _ = smoke
    text = (out / "report.md").read_text()
    assert f"![memory and accuracy against session length]({PLOT})" in text and "A partial run" not in text
    for m in METHODS:
        for s in SMOKE.seeds:
            assert f"| {m} | {s}" in text, (m, s)


def test_bad_arguments_and_another_preset_in_the_folder(smoke, tmp_path):
    out, _, _, _ = smoke
    with pytest.raises(ValueError, match="jobs"):
        run_agent(SMOKE, tmp_path, jobs=0)
    with pytest.raises(ValueError, match="stop_after"):
        run_agent(SMOKE, tmp_path, stop_after="decode")
    with pytest.raises(ValueError, match="another configuration"):
        run_agent(PRESETS["cpu"], out, progress=False, log=lambda m: None)


def test_the_command_line_resumes_a_finished_run(smoke, capsys):
    out, _, _, _ = smoke
    assert main(["agent", "--preset", "smoke", "--out", str(out), "--no-progress"]) == 0
    assert "report.md" in capsys.readouterr().out
    assert main(["agent", "--preset", "smoke", "--out", str(out), "--seeds", "1,1"]) == 2
    assert "--seeds" in capsys.readouterr().err


def test_one_arm_alone_trains_and_controls_that_arm_only(tmp_path, capsys):
    from fpa.experiments.agent.preset import FOX_ARM, FPA_ARM

    res = run_agent(SMOKE, tmp_path, progress=False, stop_after="control", arms=(FPA_ARM,), log=lambda m: None)
    assert set(res["control"]) == {FPA_ARM} and set(res["training"][FOX_ARM]) == set()
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [f"{FPA_ARM}-s{s}" for s in SMOKE.seeds]
    with pytest.raises(ValueError, match="one arm alone needs stop_after"):
        run_agent(SMOKE, tmp_path, arms=(FPA_ARM,))
    with pytest.raises(ValueError, match="arms must be distinct names"):
        run_agent(SMOKE, tmp_path, stop_after="train", arms=("fpa",))
    argv = ["agent", "--preset", "smoke", "--out", str(tmp_path), "--arms", "fpa"]
    assert main([*argv, "--stop-after", "train"]) == 2
    assert "--arms must be a comma list of distinct arms" in capsys.readouterr().err
    assert main(["agent", "--preset", "smoke", "--out", str(tmp_path), "--arms", FPA_ARM]) == 2
    assert "--arms with one arm needs --stop-after" in capsys.readouterr().err
