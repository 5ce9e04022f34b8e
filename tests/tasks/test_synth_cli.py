"""``fpa synth``: a tiny run writes its files; bad arguments give clear errors."""

import json
import re

import pytest

from fpa.cli import main


def test_tiny_run_writes_files(tmp_path):
    out = tmp_path / "synth"
    rc = main(["synth", "--task", "stack,scope", "--methods", "fpa_walk,softmax_alibi", "--dims", "1,2",
               "--ms", "2", "--seeds", "0,1", "--steps", "3", "--construct-n", "5", "--no-progress",
               "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    recs = data["records"]
    assert len(recs) == 2 * 2 * 2 * 2
    for r in recs:
        assert {"task", "method", "dim", "m", "seed", "target_mass", "accuracy", "success"} <= set(r)
        assert 0 <= r["target_mass"] <= 1 and 0 <= r["accuracy"] <= 1
        assert r["success"] == (r["target_mass"] >= 0.99 and r["accuracy"] >= 0.99)
    assert "| fpa_walk | 1 |" in (out / "results.md").read_text()
    for name in ("heatmap_stack.png", "heatmap_scope.png", "curves_stack.png", "curves_scope.png",
                 "constructive.json", "constructive.md"):
        assert (out / name).stat().st_size > 0
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left


@pytest.mark.parametrize("args,match", [
    (["--task", "dyck"], "--task must be"),
    (["--methods", "softmax"], "--methods must be"),
    (["--dims", "0"], "--dims must be .* >= 1"),
    (["--dims", "a"], "--dims must be comma-separated integers"),
    (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),  # argparse choices (shown in --help)
    (["--recipe", "fast"], "argument --recipe: invalid choice: 'fast'"),
    (["--batch", "0"], "--steps and --batch must be >= 1"),
])
def test_bad_arguments(tmp_path, capsys, args, match):
    base = {"--task": "stack", "--methods": "fox", "--dims": "1", "--ms": "2", "--seeds": "0", "--steps": "1"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    argv = ["synth", "--out", str(tmp_path)] + [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    assert re.search(match, capsys.readouterr().err)
