"""The smoke presets end to end (default suite): tuning and reported runs, every file, resume,
provenance, refusal of a folder of another configuration or of stages from another commit."""

import dataclasses
import json

import pytest

from fpa.cli import main
from fpa.experiments.lm.presets import PRESETS, get_preset
from fpa.experiments.lm.reproduce import reproduce, run_id, runs_of

HEX = set("0123456789abcdef")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    logs = []
    res = reproduce(get_preset("smoke"), out, progress=False, log=logs.append, command="fpa reproduce --preset smoke")
    return out, res, logs


@pytest.fixture(scope="module")
def tuning_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke-tune")
    return out, reproduce(get_preset("smoke-tune"), out, progress=False, log=lambda m: None)


def test_runs_are_the_presets_configurations_on_their_seeds():
    p = get_preset("smoke")
    runs = runs_of(p)
    core = [(r["spec"].name, r["seed"]) for r in runs if r["role"] == "core"]
    assert core == [(s.name, seed) for seed in p.seeds for s in p.core]
    assert [(r["spec"].name, r["seed"]) for r in runs if r["role"] == "context"] == [
        ("fpa-free", 5),
        ("fox-rule[bias=2,threshold=8]", 5),
    ]
    assert run_id(runs_of(get_preset("cpu-tune"))[3]) == "fox-bias5-s0"
    with pytest.raises(ValueError, match="methods must name"):
        runs_of(p, ("fpa", "fox"))


def test_presets_keep_tuning_and_reported_seeds_apart():
    cpu, tune = get_preset("cpu"), get_preset("cpu-tune")
    assert len(cpu.seeds) >= 10 and not set(cpu.seeds) & set(tune.tuning_seeds)
    assert cpu.tuning_seeds == tune.tuning_seeds
    assert [s.arm for s in cpu.core] == ["fpa-walk", "fox", "fpa-walk-rule"]
    assert cpu.steps >= 1500 and cpu.model_overrides["num_hidden_layers"] == 2
    assert cpu.control_min_pass == 9 and cpu.retry_steps == 2000
    per_arm = {a: sum(s.arm == a for s in tune.tuning) for a in ("fpa-walk", "fox", "fpa-walk-rule")}
    assert len(set(per_arm.values())) == 1 and per_arm["fox"] >= 2  # the same tuning budget per arm
    rule = [s for s in tune.tuning if s.arm == "fpa-walk-rule"]
    assert {s.training_threshold for s in rule} == {2.0, 4.0} and all(s.base == "fpa-walk" for s in rule)
    with pytest.raises(ValueError, match="overlap"):
        type(cpu)(**{**cpu.__dict__, "seeds": (0, 10)})


def test_seeds_and_selection_options(tuning_run):
    from fpa.experiments.lm.cli import customise

    cpu = dataclasses.replace(get_preset("cpu"), selection_pending=False)
    p = customise(cpu, seeds="10,11,12,13,14")
    assert p.seeds == (10, 11, 12, 13, 14) and p.control_min_pass == 5  # 9 of 10 -> the same share of 5
    with pytest.raises(ValueError, match="tuning seeds"):
        customise(cpu, seeds="2,10")
    with pytest.raises(ValueError, match="comma list of ints"):
        customise(cpu, seeds="10,x")
    out, res = tuning_run
    for path in (out, out / "tuning.json"):
        q = customise(cpu, selection=str(path))
        sel = res["tuning"]["selected"]
        assert [s.arm for s in q.core] == list(sel) and q.tuning_source == str(out)
        for s in q.core:
            label = sel[s.arm]["label"]
            spec = next(t for t in get_preset("smoke-tune").tuning if t.name == f"{s.arm}[{label}]")
            assert s.model == spec.model and s.train == spec.train
            expected = sel[s.arm].get("eviction", {}).get("threshold", spec.training_threshold)
            assert q.thresholds[s.arm] == expected
    with pytest.raises(ValueError, match="--selection"):
        customise(cpu, selection=str(out / "missing"))
    pending = dataclasses.replace(cpu, selection_pending=True)  # a grid newer than the frozen selection
    with pytest.raises(ValueError, match="--selection: preset 'cpu' has no frozen selection yet"):
        customise(pending, seeds="10,11")
    assert not customise(pending, selection=str(out)).selection_pending
    rc = main(["reproduce", "--preset", "cpu", "--out", str(out / "x"), "--seeds", "0,10"])
    assert rc == 2


def test_reported_smoke_writes_every_file_and_key(smoke_run):
    out, res, _ = smoke_run
    for f in (
        "results.json",
        "report.md",
        "README-snippet.md",
        "passkey.png",
        "eviction.png",
        "growth.png",
        "loss-curves.png",
        "answer-loss.png",
        "state.json",
    ):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    assert not list(out.rglob("*.tmp"))
    assert (out / ".gitignore").read_text().split() == ["data/", "models/"]
    r = json.loads((out / "results.json").read_text())
    pv = r["provenance"]
    assert pv["command"] == "fpa reproduce --preset smoke" and pv["wall_s"] > 0
    assert pv["commit"] is None or (len(pv["commit"]) == 40 and set(pv["commit"]) <= HEX)
    fw, fox = r["methods"]["fpa-walk"], r["methods"]["fox"]
    assert [s["seed"] for s in fw["seeds"]] == [s["seed"] for s in fox["seeds"]] == [5, 6]
    assert all(s["commit"] == pv["commit"] for s in fw["seeds"] + fox["seeds"])
    assert set(r["analysis"]) == {"fpa-walk-rule vs fox", "fpa-walk vs fox", "fpa-walk-rule vs fpa-walk"}
    an = r["analysis"]["fpa-walk vs fox"]
    assert an["loss"]["n"] == 2 and an["loss"]["ci95"][0] <= an["loss"]["mean_diff"] <= an["loss"]["ci95"][1]
    assert an["loss"]["higher_is_better"] is False and {"sign_p", "wins_a", "wins_b"} <= set(an["loss"])
    assert an["loss"]["mean_diff"] == pytest.approx(
        fw["seeds"][0]["loss"] / 2
        + fw["seeds"][1]["loss"] / 2
        - fox["seeds"][0]["loss"] / 2
        - fox["seeds"][1]["loss"] / 2
    )
    assert "passkey_8x_as_served" not in an and "perfect_at_8x" not in an  # 8x is not evaluated in smoke
    for m in (fw, fox, r["methods"]["fpa-walk-rule"]):
        ev = m["eviction"]
        assert ev["threshold"] == get_preset("smoke").thresholds[m["arm"]] and set(ev["by_multiple"]) == {"1", "2"}
        for by in ev["by_multiple"].values():
            assert len(by["kept_fraction"]) == len(by["accuracy"]) == 2
            assert all(0 < k <= 1 for k in by["kept_fraction"])
        assert isinstance(ev["keys_growth_exponent"], float)
    assert "eviction" not in r["methods"]["fpa-free"]  # context: no eviction tables
    assert r["tuning"]["seeds"] == [] and set(r["tuning"]["selected"]) == {"fpa-walk", "fox", "fpa-walk-rule"}
    assert (
        r["gate"]["passed"] and r["gate"]["min_pass"] == 0 and set(r["gate"]["by_arm"]) == set(r["tuning"]["selected"])
    )
    report = (out / "report.md").read_text()
    assert "## Verdicts (paired seeds)" in report and "at n = 2 (mean fpa-walk - fox" in report
    assert "fpa-walk passed on 0 of 2 seeds" in report and "| fpa-free | context | full cache | 1 |" in report
    # a partial run names only what it computed: no unwritten figure, no unevaluated length, no tuning run
    assert "paired.png" not in report and "diagnosis.png" not in report and "8x" not in report
    assert "None" not in report and "tuning run (" not in report


def test_rule_trained_models_are_scored_under_their_rule_in_every_stage(smoke_run):
    """fpa-walk-rule and fox-rule are trained under their rule: every stage serves them under it
    (their passkey grids keep fewer keys than a full cache, which keeps all), while the arms
    trained without a rule are scored with the full cache."""
    out, res, _ = smoke_run
    from fpa.experiments.lm.train_eval import load_model, served_rule

    stages = out / "stages"
    rule_threshold = get_preset("smoke").thresholds["fpa-walk-rule"]  # the frozen selection's training threshold
    for rid, rule in (("fpa-walk-rule-s5", ("fpa", rule_threshold)), ("fox-rule-bias2-threshold8-s5", ("fox", 8.0))):
        serve = served_rule(out / "models" / rid / "model")
        assert serve == {"attention": rule[0], "threshold": rule[1], "within_chunks": True}
        core = rid.startswith("fpa")  # fox-rule is context: no control, no eviction tables
        for kind in ("loss", "passkey") + (("control", "evict", "growth") if core else ()):
            assert json.loads((stages / f"{kind}-{rid}.json").read_text())["served"] == serve, kind
        kept = json.loads((stages / f"passkey-{rid}.json").read_text())["kept_fraction"]
        assert min(min(row) for row in kept) < 1.0, "scored on the full cache"
        model, _ = load_model(out / "models" / rid / "model", "cpu")
        assert {getattr(b.attn, "training_eviction_threshold", None) for b in model.model.layers} == {rule[1]}
    full = json.loads((stages / "passkey-fpa-walk-s5.json").read_text())
    assert full["served"] is None and all(k == 1.0 for row in full["kept_fraction"] for k in row)
    assert res["methods"]["fpa-walk-rule"]["served"]["threshold"] == rule_threshold


def test_the_gate_stops_retrains_at_more_steps_and_reports_both(tmp_path):
    import dataclasses

    p = dataclasses.replace(get_preset("smoke"), control_min_pass=1)
    out = tmp_path / "run"
    logs = []
    res = reproduce(p, out, progress=False, methods=("fpa-walk",), log=logs.append)
    retry = tmp_path / "run-steps6"
    assert res["kind"] == "gate-failed" and res["retry_of"]["out"] == str(out) and res["preset"]["steps"] == 6
    first = json.loads((out / "results.json").read_text())
    assert first["kind"] == "gate-failed" and first["retry"] == {"steps": 6, "out": str(retry)}
    assert first["gate"]["by_arm"]["fpa-walk"]["passed"] == 0 and not first["gate"]["passed"]
    assert not list((out / "stages").glob("passkey-*")) and not list((out / "stages").glob("loss-*"))
    assert "Retrained at 6 steps" in (out / "report.md").read_text()
    assert "retrains, at 6 steps, the run in" in (retry / "report.md").read_text()
    assert any(m.startswith("[gate]") for m in logs)


def test_stop_after_control_records_the_gate_evaluates_nothing_and_never_retrains(tmp_path, capsys, monkeypatch):
    import dataclasses

    from fpa.experiments.lm import cli as lm_cli

    p = dataclasses.replace(get_preset("smoke"), control_min_pass=1)  # 4 steps: never met
    out = tmp_path / "run"
    res = reproduce(p, out, progress=False, methods=("fpa-walk",), log=lambda m: None, stop_after="control")
    assert res["kind"] == "control" and res["retry"] is None and not res["gate"]["passed"]
    assert res["gate"]["by_arm"]["fpa-walk"]["n"] == len(p.seeds)
    assert list((out / "stages").glob("control-*")) and not list((out / "stages").glob("passkey-*"))
    assert not (tmp_path / "run-steps6").exists()
    text = (out / "report.md").read_text()
    assert "stopped after the 1x controls" in text and "it did not; the run was stopped there" in text
    assert res["provenance"]["wall_s"] is not None
    with pytest.raises(ValueError, match="stop_after='control' needs a preset with core arms"):
        reproduce(get_preset("smoke-tune"), tmp_path / "tune", progress=False, stop_after="control")
    # the CLI's exit status says whether the control passed (the gate failed here; the run resumes)
    monkeypatch.setattr(lm_cli, "customise", lambda *a, **k: p)
    args = ["reproduce", "--preset", "smoke", "--out", str(out), "--methods", "fpa-walk", "--stop-after", "control"]
    code = main([*args, "--no-progress"])
    assert code == 1 and "1x control passed on fpa-walk 0/2 seeds" in capsys.readouterr().out


def test_control_presets_check_each_candidate_recipe_on_seeds_of_their_own():
    from fpa.experiments.lm.grid import TUNING_GRID

    cpu = get_preset("cpu")
    for name, arm in (("cpu-walk-control", "fpa-walk"), ("cpu-rule-control", "fpa-walk-rule")):
        p = get_preset(name)
        assert [s.arm for s in p.core] == [arm] and len(p.seeds) >= 10 and p.control_min_pass >= 0.9 * len(p.seeds)
        assert any((s.model, s.train) == (p.core[0].model, p.core[0].train) for s in TUNING_GRID if s.arm == arm)
        assert p.retry_steps is None and not set(p.seeds) & (set(cpu.seeds) | set(cpu.tuning_seeds))
        assert (p.steps, p.train_len, p.model_overrides) == (cpu.steps, cpu.train_len, cpu.model_overrides)
    rule = get_preset("cpu-rule-control").core[0].train
    assert get_preset("cpu").steps // 2 <= rule["evict_from_step"] < get_preset("cpu").steps


def test_tuning_smoke_selects_one_configuration_and_threshold_per_arm(tuning_run):
    out, res = tuning_run
    t = res["tuning"]
    assert t["seeds"] == [0] and {r["name"] for r in t["rows"]} == {s.name for s in get_preset("smoke-tune").tuning}
    for arm in ("fpa-walk", "fox"):
        sel = t["selected"][arm]
        assert sel["config"].startswith(arm + "[") and sel["eviction"]["threshold"] in (4.0, 16.0)
    rule = t["selected"]["fpa-walk-rule"]
    assert rule["config"].startswith("fpa-walk-rule[") and rule["training_threshold"] == 2.0 and "eviction" not in rule
    assert "| fpa-walk[offset=none,init=fox2] |" in (out / "report.md").read_text() and (out / "tuning.png").is_file()
    assert json.loads((out / "tuning.json").read_text())["tuning"]["selected"] == t["selected"]


def test_smoke_resumes_without_redoing_finished_stages(smoke_run):
    out, res, _ = smoke_run
    state = json.loads((out / "state.json").read_text())
    logs = []
    assert (
        reproduce(get_preset("smoke"), out, progress=False, log=logs.append)["methods"].keys() == res["methods"].keys()
    )
    assert [m for m in logs if m.endswith("...")] == []
    state["done"].remove("passkey-fox-s6")
    (out / "state.json").write_text(json.dumps(state))
    reproduce(get_preset("smoke"), out, progress=False, log=logs.append)
    assert [m for m in logs if m.endswith("...")] == ["[stage] fox-s6: passkey ..."]


def test_a_run_resumes_on_another_machine_from_its_recorded_stages(smoke_run):
    """The trained models are not in the folder a new machine gets: a run whose stages are all
    recorded is not redone; one with a stage missing is redone whole, training included, so that
    all its stages come from one model."""
    import shutil

    out = smoke_run[0]
    shutil.rmtree(out / "models")
    state = json.loads((out / "state.json").read_text())
    state["done"].remove("evict-fpa-walk-s5")
    (out / "state.json").write_text(json.dumps(state))
    before = {n: (out / "stages" / f"{n}.json").read_text() for n in ("train-fox-s5", "loss-fpa-walk-s5")}
    logs = []
    res = reproduce(get_preset("smoke"), out, progress=False, log=logs.append)
    assert [m for m in logs if m.endswith("...")] == [
        "[stage] fpa-walk-s5: train, control, loss, passkey, evict, growth, diagnose ..."
    ]
    assert (out / "stages" / "train-fox-s5.json").read_text() == before["train-fox-s5"]
    assert json.loads((out / "state.json").read_text())["done"][-1] == "diagnose-fpa-walk-s5"
    assert (out / "models" / "fpa-walk-s5" / "model" / "training.json").is_file()
    assert not (out / "models" / "fox-s5").exists()
    assert res["methods"].keys() == smoke_run[1]["methods"].keys()


def test_stages_from_another_commit_are_refused(smoke_run):
    out = smoke_run[0]
    state = json.loads((out / "state.json").read_text())
    state["stamps"]["loss-fox-s5"] = {"commit": "f" * 40, "dirty": False}
    (out / "state.json").write_text(json.dumps(state))
    try:
        with pytest.raises(ValueError, match="different commits"):
            reproduce(get_preset("smoke"), out, progress=False, log=lambda m: None)
    finally:
        state = json.loads((out / "state.json").read_text())
        state["stamps"]["loss-fox-s5"] = state["stamps"]["loss-fpa-walk-s5"]
        (out / "state.json").write_text(json.dumps(state))


def test_another_preset_in_the_same_folder_is_refused(smoke_run):
    with pytest.raises(ValueError, match="another configuration"):
        reproduce(get_preset("cpu"), smoke_run[0], progress=False, log=lambda m: None)


def test_fpa_eval_cli_on_a_trained_model(smoke_run, tmp_path, capsys):
    out = smoke_run[0]
    dst = tmp_path / "eval.json"
    rc = main(
        [
            "eval",
            "--model",
            str(out / "models" / "fpa-walk-s5" / "model"),
            "--out",
            str(dst),
            "--multiples",
            "1,2",
            "--depths",
            "0,1",
            "--trials",
            "2",
            "--fractions",
            "0.5",
            "--thresholds",
            "4,8",
            "--loss-multiple",
            "2",
            "--loss-windows",
            "2",
            "--chunk-size",
            "64",
            "--no-progress",
        ]
    )
    assert rc == 0
    r = json.loads(dst.read_text())
    assert r["train_len"] == 128 and len(r["loss"]["curve"]) == 256
    assert list(r["cache_curve"]) == ["full", "fpa", "window", "streamingllm", "tova", "h2o"]
    assert main(["eval", "--model", str(tmp_path), "--out", str(dst)]) == 2  # not a model folder
    assert "--model" in capsys.readouterr().err


def test_cpu_preset_freezes_the_committed_tuning_runs_choices_for_the_arms_it_tuned():
    """The frozen configurations and thresholds are the committed tuning run's output for every arm
    it tuned, not chosen by hand; while the selection is pending, --preset cpu refuses to report
    without --selection."""
    from pathlib import Path

    from fpa.experiments.lm.cli import customise
    from fpa.experiments.lm.presets import SELECTED_CPU

    p = PRESETS["cpu"]
    if p.selection_pending:
        with pytest.raises(ValueError, match="no frozen selection yet"):
            customise(p)
        return
    path = Path(__file__).resolve().parents[3] / p.tuning_source / "results.json"
    tuned = json.loads(path.read_text())
    assert tuned["preset"]["name"] == "cpu-tune" and tuned["tuning"]["seeds"] == list(p.tuning_seeds)
    for arm, sel in tuned["tuning"]["selected"].items():  # the former run's output names it "tau"
        label, threshold = SELECTED_CPU[arm]
        chosen = sel.get("eviction", {}).get("threshold", sel.get("eviction", {}).get("tau"))
        assert sel["config"] == f"{arm}[{label}]" and (chosen or sel.get("training_threshold")) == threshold
