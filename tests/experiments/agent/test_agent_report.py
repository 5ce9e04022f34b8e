"""report.md and the plot of ``fpa agent`` on hand-built results: a complete run gets every table
and the plot; a partial one only what ran, and no reference to a file or stage that is not there."""

import re

import pytest
from agent_testing import PRESET, stages

from fpa.experiments.agent.analysis import summarize
from fpa.experiments.agent.preset import ARMS, METHODS
from fpa.experiments.agent.report import PLOT, markdown, write_report


def results(st: dict, trained: bool = True) -> dict:
    r = {"preset": PRESET.to_dict(), **summarize(PRESET, st)}
    t = {"steps": PRESET.steps, "final_train_loss": 1.5, "tokens_per_s": 900.0, "task_loss_curve": []}
    r["training"] = {a: {str(s): t for s in PRESET.seeds} if trained else {} for a in ARMS}
    r["provenance"] = {"commit": "abc", "dirty": False, "command": "fpa agent --preset smoke", "wall_s": 60.0}
    return r


def linked_files(text: str) -> list[str]:
    return re.findall(r"\]\(([^)]+)\)", text)


def test_a_complete_run_has_every_table_and_the_plot(tmp_path):
    write_report(results(stages()), tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert (tmp_path / PLOT).stat().st_size > 10_000
    assert linked_files(text) == [PLOT]
    assert "Verdict: **MET**" in text and "A partial run" not in text and "Not run." not in text
    assert f"long-session decodes {len(METHODS) * 2 * 3} of {len(METHODS) * 2 * 3}" in text
    for m in METHODS:
        for s in PRESET.seeds:
            assert re.search(rf"^\| {m} \| {s} \| ", text, flags=re.M), (m, s)
    for section in (
        "## Goal",
        "## 1x control",
        "## Long sessions",
        "## Per question kind",
        "## Diagnosis",
        "## Training",
    ):
        assert section in text


@pytest.mark.parametrize("ran", ["training", "control"])
def test_a_partial_run_reports_only_what_ran(tmp_path, ran):
    (tmp_path / PLOT).write_bytes(b"left from an earlier report")
    st = stages(decodes=False) if ran == "control" else {}
    write_report(results(st), tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert not (tmp_path / PLOT).exists() and linked_files(text) == [] and PLOT not in text
    assert "A partial run" in text and "Verdict: **NOT ASSESSED**" in text
    assert "## Diagnosis" not in text and "## Per question kind" not in text
    runs_section = text.split("## Long sessions")[1].split("##")[0]
    assert "Not run." in runs_section
    control_section = text.split("## 1x control")[1].split("##")[0]
    assert ("Not run." in control_section) == (ran == "training")
    if ran == "training":
        assert "training runs 4 of 4, 1x controls 0 of 4, long-session decodes 0 of 42" in text


def test_a_failed_control_is_flagged_on_the_runs_of_that_arm():
    text = markdown(results(stages(passed={("fox", 1): False})))
    assert re.search(r"^\| fox-rule \| 1\* \| ", text, flags=re.M)
    assert re.search(r"^\| fpa-rule \| 1 \| ", text, flags=re.M)  # the other arm passed on seed 1
    assert re.search(r"^\| window \| 1 \| ", text, flags=re.M)  # the budgets run on the FPA model
    assert "| fox | 1 |" in text and "**no** |" in text


def test_no_training_says_so():
    text = markdown(results({}, trained=False))
    assert "training runs 0 of 4" in text and text.split("## Training")[1].split("##")[0].strip() == "Not run."
