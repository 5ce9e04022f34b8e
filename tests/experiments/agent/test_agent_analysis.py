"""The analysis of ``fpa agent`` on hand-built stage outputs (agent_testing): budgets, growth
exponents of known kept-key curves, the control gate, the goal's verdict, the diagnosis of misses."""

import pytest
from agent_testing import PRESET, call, decoded, session, stages

from fpa.experiments.agent.analysis import (
    EXPONENT_MAX,
    MARGIN,
    budget_of,
    decode_name,
    diagnose,
    loss_cause,
    run_figures,
    summarize,
)
from fpa.experiments.agent.preset import BUDGET_METHODS, METHODS

TIGHT = 1e-9  # the kept counts are exact powers of L: the log-log fit recovers the exponent to rounding


def test_budget_is_the_rules_mean_kept_keys_rounded_and_at_least_one():
    d = decoded("fpa-rule", 1000, 10.0, 1.0, n=2)
    d["sessions"][1]["kept_keys"] = 11.4
    assert budget_of(d) == 11  # mean 10.7
    d["sessions"][0]["kept_keys"] = d["sessions"][1]["kept_keys"] = 0.2
    assert budget_of(d) == 1


@pytest.mark.parametrize("a", [0.0, 0.1, 0.5, 0.97])
def test_growth_exponent_of_known_kept_counts(a):
    r = summarize(PRESET, stages(fpa_exponent=a))
    for seed in map(str, PRESET.seeds):
        assert r["growth"]["fpa-rule"][seed]["kept_exponent"] == pytest.approx(a, abs=TIGHT)
        assert r["growth"]["fpa-full"][seed]["kept_exponent"] == pytest.approx(1.0, abs=TIGHT)
        assert r["growth"]["window"][seed]["kept_exponent"] == pytest.approx(a, abs=0.01)  # rounded budgets


def test_run_figures_of_one_decode():
    f = run_figures(decoded("fpa-rule", 1000, 40.0, 0.5, n=2))
    assert f["accuracy"]["open"] == 0.5 and f["accuracy"]["closed"] == 0.0 and f["accuracy"]["n_open"] == 8
    assert f["kept_keys"] == 40.0 and f["bytes_held"] == 64 * 40.0 and f["sessions"] == 2
    assert f["decode_ms_per_token"] == pytest.approx(1e3 * 0.01 / 2)
    assert f["prefill_us_per_token"] == pytest.approx(100.0) and f["open_calls_held"] == 1.0


def test_every_run_is_summarised_per_method_seed_and_length():
    r = summarize(PRESET, stages())
    assert r["counted_seeds"] == list(PRESET.seeds)
    for m in METHODS:
        for s in PRESET.seeds:
            assert set(r["runs"][m][str(s)]) == {str(L) for L in PRESET.lengths}
    assert r["goal"]["met"] is True and r["goal"]["reason"] == ""
    parts = r["goal"]["parts"]
    assert parts["margin"]["margin"] == pytest.approx(0.5) and parts["margin"]["best_baseline"] in BUDGET_METHODS
    assert all(g == 0 for g in parts["accuracy_vs_full"]["gaps"].values())
    assert parts["exponent"]["max"] == pytest.approx(0.1, abs=TIGHT)


def test_a_failed_fpa_control_drops_the_seed_from_the_goal_but_not_from_the_runs():
    r = summarize(PRESET, stages(passed={("fpa-walk-rule", 1): False}))
    assert r["counted_seeds"] == [0]
    assert r["control"]["fpa-walk-rule"]["1"]["passed"] is False and r["control"]["fox"]["1"]["passed"] is True
    assert "1" in r["runs"]["fpa-full"] and "1" in r["runs"]["fpa-rule"]  # still decoded and reported
    assert r["goal"]["parts"]["exponent"]["by_seed"] == [pytest.approx(0.1, abs=TIGHT)]
    fpa_failed = {("fpa-walk-rule", s): False for s in PRESET.seeds}
    r = summarize(PRESET, stages(passed=fpa_failed))
    assert r["counted_seeds"] == [] and r["pooled"] == {}
    assert r["goal"] == {"met": False, "parts": {}, "reason": "no seed passed the FPA arm's 1x control"}


def test_a_failed_fox_control_is_reported_and_leaves_the_goal_to_fpa():
    # FoX is the architecture compared, not the reference of the goal: its failed control is a
    # finding, the goal is about FPA's rule against the same model's full cache and budgets
    r = summarize(PRESET, stages(passed={("fox", s): False for s in PRESET.seeds}))
    assert r["counted_seeds"] == list(PRESET.seeds) and r["goal"]["met"] is True
    assert all(r["control"]["fox"][str(s)]["passed"] is False for s in PRESET.seeds)


@pytest.mark.parametrize(
    "kw, missed",
    [
        (dict(fpa_exponent=EXPONENT_MAX + 0.05), "exponent"),
        (dict(fpa_right=0.75), "accuracy_vs_full"),
        (dict(baseline_right=1 - MARGIN / 2), "margin"),
    ],
)
def test_each_part_of_the_goal_can_miss(kw, missed):
    g = summarize(PRESET, stages(**kw))["goal"]
    assert g["met"] is False and not g["parts"][missed]["met"]
    assert all(p["met"] for name, p in g["parts"].items() if name != missed)


def test_missing_stages_leave_the_goal_unassessed():
    st = stages(decodes=False)
    r = summarize(PRESET, st)
    assert r["runs"] == {} and r["goal"]["met"] is None and "decodes" in r["goal"]["reason"]
    del st["control-fox-s0"]
    r = summarize(PRESET, st)
    assert r["goal"]["met"] is None and "controls" in r["goal"]["reason"]
    partial = stages()
    del partial[decode_name("h2o", 0, PRESET.lengths[-1])]
    r = summarize(PRESET, partial)
    assert r["goal"]["met"] is None and "margin" not in r["goal"]["parts"] and "h2o" in r["runs"]


def test_loss_cause_names_the_part_that_passed_the_threshold_on_the_best_head():
    def parts(dip, offset):  # head 0 keeps the call best (least penalty); head 1 is far worse
        return {"dip": [dip, 9.0], "offset": [offset, 9.0], "penalty": [max(0.0, dip + offset), 18.0]}

    c = call("open", 0.0, penalty=[parts(3.0, 0.5), parts(0.5, 3.0), parts(3.0, 3.0), parts(1.5, 1.5)])
    assert loss_cause(c, threshold=2.0) == ["dip", "offset", "both", "sum"]
    assert loss_cause(call("open", 0.0), threshold=2.0) == []  # not an FPA decode: no penalty recorded


def test_diagnosis_separates_lost_calls_from_held_ones():
    lost = [call("open", 0.0, depth=2, start=100, text="abc12"), call("closed", 0.0)]
    held = [call("open", 1.0, text="abc12"), call("closed", 0.0)]
    d = decoded("fpa-rule", 1000, 40.0, 1.0, n=0)
    d["sessions"] = [session(1000, 40.0, 0.0, False, seed=5, calls=lost), session(1000, 40.0, 0.0, False, calls=held)]
    out = diagnose({"0": d}, threshold=2.0)
    n_open = 4
    assert out["open_missed"] == 2 * n_open and out["lost"] == n_open and out["held"] == n_open
    assert {c["session"] for c in out["lost_calls"]} == {5}
    assert all(c["depth"] == 2 and c["back"] == 900 for c in out["lost_calls"])


def test_pooled_figures_cover_only_the_counted_seeds():
    st = stages(passed={("fpa-walk-rule", 0): False})
    one = dict(st[decode_name("fpa-rule", 0, 1000)])
    one["sessions"] = [session(1000, 40.0, 0.0, False)]  # seed 0 misses every open question, seed 1 none
    st[decode_name("fpa-rule", 0, 1000)] = one
    r = summarize(PRESET, st)
    assert r["pooled"]["fpa-rule"]["1000"]["accuracy"]["open"] == 1.0
    assert r["runs"]["fpa-rule"]["0"]["1000"]["accuracy"]["open"] == 0.0
    assert r["diagnosis"]["1000"]["open_missed"] == 4  # the diagnosis covers every seed
