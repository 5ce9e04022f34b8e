"""``fpa synth``: a tiny run writes its files; bad arguments give clear errors."""

import re

import pytest

from fpa.cli import main
from fpa.experiments.synthetic.report import read_results


def test_tiny_run_writes_files(tmp_path):
    out = tmp_path / "synth"
    rc = main(
        [
            "synth",
            "--task",
            "stack,scope",
            "--methods",
            "fpa-walk,softmax-alibi",
            "--dims",
            "1,2",
            "--ms",
            "2",
            "--seeds",
            "0,1",
            "--steps",
            "3",
            "--construct-n",
            "5",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    data = read_results(out)
    recs = data["records"]
    assert len(recs) == 2 * 2 * 2 * 2
    for r in recs:
        assert {"task", "method", "dim", "m", "seed", "target_mass", "accuracy", "success"} <= set(r)
        assert 0 <= r["target_mass"] <= 1 and 0 <= r["accuracy"] <= 1
        assert r["success"] == (r["target_mass"] >= 0.99 and r["accuracy"] >= 0.99)
    assert "| fpa-walk | 1 |" in (out / "results.md").read_text()
    for name in (
        "heatmap_stack.png",
        "heatmap_scope.png",
        "curves_stack.png",
        "curves_scope.png",
        "constructive.json",
        "constructive.md",
    ):
        assert (out / name).stat().st_size > 0
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left


@pytest.mark.parametrize(
    "args,match",
    [
        (["--task", "dyck"], "--task must be"),
        (["--methods", "softmax"], "--methods must be"),
        (["--dims", "0"], "--dims must be .* >= 1"),
        (["--dims", "a"], "--dims must be comma-separated integers"),
        (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),  # argparse choices (shown in --help)
        (["--recipe", "fast"], "argument --recipe: invalid choice: 'fast'"),
        (["--batch", "0"], "--batch must be a positive int, got 0"),
        (["--seeds", "5-3"], "--seeds must be comma-separated integers or ranges a-b"),
        (["--seeds", "0-2,2"], "--seeds lists a value twice"),
        (["--seeds", "-1"], "--seeds must be comma-separated integers or ranges"),
        (["--fpa-kwargs", "{}"], "--fpa-kwargs needs an FPA method"),
        (["--methods", "fpa_walk"], "--methods must be .* got 'fpa_walk' \\(did you mean 'fpa-walk'\\?\\)"),
        (["--methods", "fpa-walk", "--fpa-kwargs", "[1]"], "--fpa-kwargs must be a JSON object"),
        (["--methods", "fpa-walk", "--fpa-kwargs", "{level_offset: 1}"], "--fpa-kwargs must be a JSON object"),
        (["--methods", "fpa-walk", "--fpa-kwargs", '{"level_ofset": 1}'], "--fpa-kwargs: .*level_ofset"),
        (
            ["--methods", "fpa-walk", "--fpa-kwargs", '{"fpa_level_offset_init": 2.0}'],
            "--fpa-kwargs: unknown keys .*did you mean 'level_offset_init'",
        ),  # the former config name
        (
            ["--methods", "fpa-walk", "--fpa-kwargs", '{"level_offset_init": "x"}'],
            "level_offset_init must be a finite",
        ),
        (["--methods", "fpa-walk", "--fpa-kwargs", '{"level_offset": false}'], "got False \\(use 'none'"),
        (["--methods", "fpa-walk", "--fpa-kwargs", '{"mode": "sideways"}'], "FPAOptions.mode must be one of"),
    ],
)
def test_bad_arguments(tmp_path, capsys, args, match):
    base = {"--task": "stack", "--methods": "fox", "--dims": "1", "--ms": "2", "--seeds": "0", "--steps": "1"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    argv = ["synth", "--out", str(tmp_path)] + [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    assert re.search(match, capsys.readouterr().err)


def test_seed_ranges_and_determinism(tmp_path):
    """--seeds 3-4 means seeds 3 and 4, and the same command gives the same records twice."""

    def run(name):
        out = tmp_path / name
        assert (
            main(
                [
                    "synth",
                    "--task",
                    "stack",
                    "--methods",
                    "fpa-walk",
                    "--dims",
                    "1",
                    "--ms",
                    "2",
                    "--seeds",
                    "3-4",
                    "--steps",
                    "5",
                    "--no-progress",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        return read_results(out)

    a, b = run("a"), run("b")
    assert a["meta"]["seeds"] == [3, 4] and [r["seed"] for r in a["records"]] == [3, 4]
    assert a["records"] == b["records"]


def test_fpa_kwargs_reach_the_fpa_layers_only_and_are_recorded(tmp_path):
    """--fpa-kwargs (FPAConfig names) changes the FPA walk (a head offset from 2, then none) and
    leaves FoX alone."""

    def run(name, kw):
        out = tmp_path / name
        assert (
            main(
                [
                    "synth",
                    "--task",
                    "stack",
                    "--methods",
                    "fpa-walk,fox",
                    "--dims",
                    "1",
                    "--ms",
                    "2",
                    "--seeds",
                    "0",
                    "--steps",
                    "3",
                    "--no-progress",
                    "--fpa-kwargs",
                    kw,
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        return read_results(out)

    two, none = run("two", '{"level_offset_init": 2.0}'), run("none", '{"level_offset": "none"}')
    assert two["meta"]["fpa_kwargs"] == {"level_offset_init": 2.0}
    assert two["meta"]["fpa_options"]["fpa-walk"]["level_offset_init"] == 2.0
    assert none["meta"]["fpa_options"]["fpa-walk"]["level_offset"] == "none"
    assert "fox" not in two["meta"]["fpa_options"]
    walk = {
        name: [r for r in d["records"] if r["method"] == "fpa-walk"][0] for name, d in (("two", two), ("none", none))
    }
    fox = [[r for r in d["records"] if r["method"] == "fox"][0] for d in (two, none)]
    assert walk["two"]["curve"] != walk["none"]["curve"]
    assert fox[0]["curve"] == fox[1]["curve"]


def test_merge_writes_split_runs_as_one(tmp_path):
    base = ["synth", "--task", "stack", "--dims", "1", "--ms", "2", "--seeds", "0", "--steps", "2", "--no-progress"]
    assert main(base + ["--methods", "fox", "--out", str(tmp_path / "a")]) == 0
    assert main(base + ["--methods", "fpa-walk", "--out", str(tmp_path / "b")]) == 0
    assert main(["synth", "--merge", f"{tmp_path / 'a'},{tmp_path / 'b'}", "--out", str(tmp_path / "m")]) == 0
    recs = read_results(tmp_path / "m")["records"]
    assert sorted(r["method"] for r in recs) == ["fox", "fpa-walk"]
    assert (tmp_path / "m" / "heatmap_stack.png").stat().st_size > 0
    assert main(["synth", "--merge", f"{tmp_path / 'a'},{tmp_path / 'a'}", "--out", str(tmp_path / "x")]) == 2
