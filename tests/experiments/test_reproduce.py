"""The smoke presets end to end (default suite): tuning and reported runs, every file, resume,
provenance, refusal of a folder of another configuration or of stages from another commit."""

import json

import pytest

from fpa.cli import main
from fpa.experiments.presets import PRESETS, get_preset
from fpa.experiments.reproduce import reproduce, run_id, runs_of

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
    assert [(r["spec"].name, r["seed"]) for r in runs if r["role"] == "context"] == [("fpa-free", 5)]
    assert run_id(runs_of(get_preset("cpu-tune"))[3]) == "fpa-walk-offsethead1-field_lr0.1-s0"
    with pytest.raises(ValueError, match="methods must name"):
        runs_of(p, ("fpa", "fox"))


def test_presets_keep_tuning_and_reported_seeds_apart():
    cpu, tune = get_preset("cpu"), get_preset("cpu-tune")
    assert len(cpu.seeds) >= 10 and not set(cpu.seeds) & set(tune.tuning_seeds)
    assert cpu.tuning_seeds == tune.tuning_seeds
    assert [s.base for s in cpu.core] == ["fpa-walk", "fox"]
    per_base = {b: sum(s.base == b for s in tune.tuning) for b in ("fpa-walk", "fox")}
    assert per_base["fpa-walk"] == per_base["fox"] >= 3  # the same tuning budget for both
    with pytest.raises(ValueError, match="overlap"):
        type(cpu)(**{**cpu.__dict__, "seeds": (0, 10)})


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
    an = r["analysis"]["fpa-walk vs fox"]
    assert an["loss"]["n"] == 2 and an["loss"]["ci95"][0] <= an["loss"]["mean_diff"] <= an["loss"]["ci95"][1]
    assert an["loss"]["mean_diff"] == pytest.approx(
        fw["seeds"][0]["loss"] / 2
        + fw["seeds"][1]["loss"] / 2
        - fox["seeds"][0]["loss"] / 2
        - fox["seeds"][1]["loss"] / 2
    )
    for m in (fw, fox):
        ev = m["eviction"]
        assert ev["tau"] == get_preset("smoke").taus[m["base"]] and set(ev["by_multiple"]) == {"1", "2"}
        for by in ev["by_multiple"].values():
            assert len(by["kept_fraction"]) == len(by["accuracy"]) == 2
            assert all(0 < k <= 1 for k in by["kept_fraction"])
        assert isinstance(ev["keys_growth_exponent"], float)
    assert "eviction" not in r["methods"]["fpa-free"]  # context: no eviction tables
    assert r["tuning"]["seeds"] == [] and set(r["tuning"]["selected"]) == {"fpa-walk", "fox"}
    report = (out / "report.md").read_text()
    assert "## Verdicts (paired seeds)" in report and "at n = 2 (mean fpa-walk - fox" in report
    assert "1x control (>= 90% at the training length): fpa-walk passed on 0 of 2 seeds" in report
    assert "| fpa-free | context | 1 |" in report


def test_tuning_smoke_selects_one_configuration_and_tau_per_method(tuning_run):
    out, res = tuning_run
    t = res["tuning"]
    assert t["seeds"] == [0] and {r["name"] for r in t["rows"]} == {s.name for s in get_preset("smoke-tune").tuning}
    for base in ("fpa-walk", "fox"):
        sel = t["selected"][base]
        assert sel["config"].startswith(base + "[") and sel["eviction"]["tau"] in (4.0, 16.0)
    assert "| fpa-walk[offset=none] |" in (out / "report.md").read_text() and (out / "tuning.png").is_file()


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
    assert [m for m in logs if m.endswith("...")] == ["[stage] passkey-fox-s6 ..."]


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


def test_cpu_preset_freezes_what_the_committed_tuning_run_selected():
    """The reported preset's configurations and taus are the tuning run's output, not chosen by hand."""
    from pathlib import Path

    p = PRESETS["cpu"]
    path = Path(__file__).resolve().parents[2] / p.tuning_source / "results.json"
    tuned = json.loads(path.read_text())
    assert tuned["preset"]["name"] == "cpu-tune" and tuned["tuning"]["seeds"] == list(p.tuning_seeds)
    from fpa.experiments.presets import SELECTED_CPU

    for base, (label, tau) in SELECTED_CPU.items():
        sel = tuned["tuning"]["selected"][base]
        assert sel["config"] == f"{base}[{label}]" and sel["eviction"]["tau"] == tau
