"""The smoke preset end to end (default suite, ~20-40 s on 2 cores): every stage, every file, resume."""

import json

import pytest

from fpa.cli import main
from fpa.eval.presets import METHODS, get_preset
from fpa.eval.reproduce import reproduce


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    logs = []
    res = reproduce(get_preset("smoke"), out, progress=False, log=logs.append)
    return out, res, logs


def test_smoke_writes_every_file(smoke_run):
    out, res, logs = smoke_run
    names = [m[0] for m in METHODS]
    expected = ["results.json", "report.md", "README-snippet.md", "loss-curves.png", "state.json",
                "kept-2x.png", "example-fpa-free.png", "example-fpa-walk.png"] + [f"passkey-{n}.png" for n in names]
    for f in expected:
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    assert not list(out.rglob("*.tmp"))
    assert (out / ".gitignore").read_text().split() == ["data/", "models/"]
    r = json.loads((out / "results.json").read_text())
    assert sorted(r["methods"]) == sorted(names)
    for n, m in r["methods"].items():
        assert m["loss"]["loss"] > 0 and len(m["loss"]["curve"]) == 4 * 128
        assert [len(row) for row in m["passkey"]["accuracy"]] == [2, 2]
        own = {"fpa": ["fpa"], "fox": ["fox"]}.get(m["attention"], [])
        assert list(m["cache"]["0.5"]) == own + ["window", "streamingllm", "tova", "h2o"]
        for g in m["cache"]["0.5"].values():
            assert 0.3 < g["kept_fraction_mean"] < 0.7
        assert m["train"]["steps"] == 4
    report = (out / "report.md").read_text()
    for n in names:
        assert f"passkey-{n}.png" in report and f"| {n} |" in report
    assert "## Targets" in report and "fpa reproduce --preset smoke" in (out / "README-snippet.md").read_text()


def test_smoke_resumes_without_redoing_finished_stages(smoke_run):
    out, res, _ = smoke_run
    state = json.loads((out / "state.json").read_text())
    assert "train-fpa-free" in state["done"] and "example-fpa-walk" in state["done"]
    logs = []
    assert reproduce(get_preset("smoke"), out, progress=False, log=logs.append)["methods"].keys() == res["methods"].keys()
    assert logs == []
    # lose one stage (as if interrupted during it): only that one runs again
    state["done"].remove("passkey-fox")
    (out / "state.json").write_text(json.dumps(state))
    reproduce(get_preset("smoke"), out, progress=False, log=logs.append)
    assert [m for m in logs if m.endswith("...")] == ["[stage] passkey-fox ..."]


def test_another_preset_in_the_same_folder_is_refused(smoke_run):
    with pytest.raises(ValueError, match="another configuration"):
        reproduce(get_preset("cpu"), smoke_run[0], progress=False, log=lambda m: None)


def test_fpa_eval_cli_on_a_trained_model(smoke_run, tmp_path, capsys):
    out = smoke_run[0]
    dst = tmp_path / "eval.json"
    rc = main(["eval", "--model", str(out / "models" / "fpa-walk" / "model"), "--out", str(dst), "--multiples", "1,2",
               "--depths", "0,1", "--trials", "2", "--fractions", "0.5", "--loss-multiple", "2", "--loss-windows", "2",
               "--chunk-size", "64", "--calib-prompts", "1", "--no-progress"])
    assert rc == 0
    r = json.loads(dst.read_text())
    assert r["train_len"] == 128 and len(r["loss"]["curve"]) == 256
    assert r["passkey"]["lengths"] == [128, 256] and "fpa" in r["cache"]["0.5"]
    assert main(["eval", "--model", str(tmp_path), "--out", str(dst)]) == 2  # not a model folder
    assert "--model" in capsys.readouterr().err
    assert main(["eval", "--model", str(tmp_path), "--out", str(dst), "--what", "loss,ppl"]) == 2
    assert "--what" in capsys.readouterr().err
