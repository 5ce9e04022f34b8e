"""The CLI on bad input: one line on stderr, exit code 2, no traceback, nothing written.

Also: `fpa --help` is fast and imports no command module (works on a core install), a missing
extra is named, every flag has help text and (where the set is fixed) its choices.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fpa.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def err_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_help_is_fast_and_imports_nothing_heavy():
    code = (
        "import sys, time; t = time.perf_counter(); from fpa.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "heavy = [m for m in ('torch', 'transformers', 'numpy', 'fpa.ops', 'fpa.train') if m in sys.modules]\n"
        "print(time.perf_counter() - t, heavy)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    *_, last = r.stdout.strip().splitlines()
    secs, heavy = last.split(" ", 1)
    assert heavy == "[]", f"fpa --help imported {heavy}"
    assert float(secs) < 1.0
    for name in COMMANDS:
        assert name in r.stdout


def test_missing_extra_is_named():
    """A core install (no transformers): the command says which extra to install."""
    code = "import sys; sys.modules['transformers'] = None\nfrom fpa.cli import main; sys.exit(main(['model-info']))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "pip install 'fpa[models]'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


FIXED_CHOICES = {  # (command, flag) -> a value that must be among its choices
    ("train", "--device"): "cpu",
    ("train", "--attention"): "fox",
    ("train", "--fpa-mode"): "walk",
    ("train", "--preset"): "tiny",
    ("train", "--precision"): "bf16",
    ("train", "--parallel"): "ddp",
    ("train", "--tokenizer"): "bpe",
    ("train", "--mix-task"): "passkey",
    ("prepare-data", "--tokenizer"): "bpe",
    ("eval", "--device"): "cuda",
    ("reproduce", "--preset"): "cpu",
    ("synth", "--recipe"): "legacy",
    ("synth", "--preset"): "quick",
    ("model-info", "--preset"): "110m",
    ("model-info", "--attention"): "fox",
    ("model-info", "--fpa-mode"): "walk",
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_flag_has_help_and_choices(command):
    p = build_parser(command)
    subparsers = next(a for a in p._actions if a.dest == "command")
    assert isinstance(subparsers, argparse._SubParsersAction)
    sub = subparsers.choices[command]
    for a in sub._actions:
        assert a.help and a.help.strip(), f"fpa {command} {a.option_strings or a.dest} has no help text"
        for flag in a.option_strings:
            if (command, flag) in FIXED_CHOICES:
                assert a.choices and FIXED_CHOICES[command, flag] in a.choices, f"fpa {command} {flag}: no choices"


def test_every_train_setting_has_its_own_help():
    from dataclasses import fields

    from fpa.train import TrainConfig
    from fpa.train.cli import _SPECIAL, HELP

    missing = [f.name for f in fields(TrainConfig) if f.name not in _SPECIAL and f.name not in HELP]
    assert not missing, f"add help text for these TrainConfig fields to fpa.train.cli.HELP: {missing}"


def test_usage_error_is_one_line(capsys):
    assert main(["bogus"]) == 2
    assert "invalid choice" in err_line(capsys)
    assert main(["eval", "--model", "x"]) == 2  # --out missing
    assert "--out" in err_line(capsys)


def test_train_rejects_misspelt_override_before_work(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out-dir", str(out), "--model-overrides", '{"hiden_size": 32}']) == 2
    e = err_line(capsys)
    assert "hiden_size" in e and "did you mean 'hidden_size'" in e and "valid keys" in e
    assert not out.exists()
    assert main(["train", "--out-dir", str(out), "--model-overrides", '{"qk_norm": "no"}']) == 2
    assert "qk_norm must be true or false" in err_line(capsys)
    assert main(["train", "--out-dir", str(out), "--model-overrides", "[1]"]) == 2
    assert "must be a JSON object" in err_line(capsys)
    (tmp_path / "c.json").write_text(json.dumps({"out_dir": str(out), "model_overrides": {"rope_theta": -1}}))
    assert main(["train", "--config", str(tmp_path / "c.json")]) == 2
    assert "rope_theta must be a finite number > 0" in err_line(capsys)
    assert not out.exists()


def test_train_points_former_spellings_to_the_current_ones(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out-dir", str(out), "--model-overrides", '{"fpa_level_offset": "none"}']) == 2
    assert 'did you mean {"fpa": {"level_offset": ...}}' in err_line(capsys)
    assert main(["train", "--out-dir", str(out), "--evict-tau", "2"]) == 2
    assert "--evict-tau (did you mean --evict-threshold?)" in err_line(capsys)
    assert (
        main(["train", "--out-dir", str(out), "--model-overrides", '{"fpa": {"level_offset": "head"}}', "--steps", "x"])
        == 2
    )
    assert "--steps" in err_line(capsys)
    assert not out.exists()


def test_failed_train_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out-dir", str(out), "--data-source", str(tmp_path / "none*.txt"), "--steps", "1"]) == 2
    assert "matches nothing" in err_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("c.yaml", "out_dir: [unclosed", "not valid YAML"),
        ("c.json", "{out_dir", "not valid JSON"),
        (
            "c.json",
            '{"out_dir": "o", "stepz": 3}',
            "unknown keys in the training config: \\['stepz'\\]; 'stepz' \\(did you mean 'steps'\\?\\); valid keys",
        ),
        ("c.toml", "", "must end in .json, .yaml or .yml"),
        ("missing.json", None, "does not exist"),
    ],
)
def test_bad_config_files(tmp_path, capsys, name, text, words):
    import re

    if text is not None:
        (tmp_path / name).write_text(text)
    assert main(["train", "--config", str(tmp_path / name)]) == 2
    assert re.search(words, err_line(capsys))


def test_out_dir_naming_a_file(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    for argv in (
        ["train", "--out-dir", str(f)],
        ["prepare-data", "stdlib", "--out-dir", str(f)],
        ["synth", "--preset", "quick", "--out", str(f)],
    ):
        assert main(argv) == 2
        assert "is a file" in err_line(capsys)
    assert f.read_text() == "x"


def test_synth_negative_construct_n(tmp_path, capsys):
    out = tmp_path / "s"
    assert (
        main(
            [
                "synth",
                "--task",
                "stack",
                "--dims",
                "1",
                "--ms",
                "1",
                "--seeds",
                "0",
                "--construct-n",
                "-3",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert "--construct-n must be a non-negative int" in err_line(capsys)
    assert not out.exists()


def test_failed_prepare_data_leaves_nothing(tmp_path, capsys):
    (tmp_path / "one.txt").write_text("a single short document")
    out = tmp_path / "data"
    assert main(["prepare-data", str(tmp_path / "one.txt"), "--out-dir", str(out)]) == 2
    assert "0 val documents" in err_line(capsys)
    assert not out.exists()
    out.mkdir()  # an existing folder is kept, but emptied of what this run wrote
    assert main(["prepare-data", str(tmp_path / "one.txt"), "--out-dir", str(out)]) == 2
    err_line(capsys)
    assert list(out.iterdir()) == []


def test_prepare_data_corrupt_meta(tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    (out / "meta.json").write_text("{broken")
    assert main(["prepare-data", "stdlib", "--out-dir", str(out), "--max-bytes", "1000"]) == 2
    assert "corrupt meta.json" in err_line(capsys) and (out / "meta.json").read_text() == "{broken"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from fpa.data import ByteTokenizer
    from fpa.models import FPAConfig, FPAForCausalLM

    d = tmp_path_factory.mktemp("m") / "model"
    cfg = FPAConfig.from_preset(
        "tiny", hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, intermediate_size=32
    )
    FPAForCausalLM(cfg).save_pretrained(d)
    ByteTokenizer().save(d)
    return d


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_eval_bad_model_folders(model_dir, tmp_path, capsys):
    out = tmp_path / "res.json"
    base = ["eval", "--out", str(out), "--train-len", "128", "--what", "passkey", "--no-progress"]
    trunc = _copy(model_dir, tmp_path / "trunc")
    w = trunc / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    badcfg = _copy(model_dir, tmp_path / "badcfg")
    (badcfg / "config.json").write_text("{not json")
    badval = _copy(model_dir, tmp_path / "badval")
    c = json.loads((badval / "config.json").read_text())
    (badval / "config.json").write_text(json.dumps({**c, "rms_norm_eps": -1}))
    shape = _copy(model_dir, tmp_path / "shape")
    (shape / "config.json").write_text(json.dumps({**c, "intermediate_size": 48}))
    noweights = _copy(model_dir, tmp_path / "noweights")
    (noweights / "model.safetensors").unlink()
    cases = [
        (trunc, "truncated or corrupt"),
        (badcfg, "config.json is corrupt"),
        (badval, "rms_norm_eps must be a finite number > 0"),
        (shape, "do not match config.json"),
        (noweights, "holds no weights"),
        (tmp_path, "saved model folder"),
    ]
    for d, words in cases:
        assert main(base + ["--model", str(d)]) == 2, d
        assert words in err_line(capsys), d
        assert not out.exists()


def test_eval_unwritable_out_found_before_work(model_dir, tmp_path, capsys, monkeypatch):
    import fpa.eval.cli as ecli

    monkeypatch.setattr(
        ecli, "check_model_folder", lambda *a: pytest.fail("the model was read before --out was checked")
    )
    (tmp_path / "afile").write_text("x")
    for bad, words in ((tmp_path / "afile" / "r.json", "is a file"), (tmp_path, "must name a file")):
        assert main(["eval", "--model", str(model_dir), "--out", str(bad), "--train-len", "128"]) == 2
        assert words in err_line(capsys)


def test_eval_bad_flag_values(model_dir, tmp_path, capsys):
    base = ["eval", "--model", str(model_dir), "--out", str(tmp_path / "r.json"), "--train-len", "128"]
    for extra, words in (
        (["--depths", "2"], "in [0, 1]"),
        (["--trials", "0"], ">= 1"),
        (["--what", "ppl"], "comma list"),
        (["--fractions", "0"], "(0, 1]"),
        (["--multiples", "x"], "comma list of ints"),
    ):
        assert main(base + extra) == 2
        assert words in err_line(capsys)
    assert main(base + ["--what", "passkey", "--train-len", "8"]) == 2
    assert "passkey prompts need" in err_line(capsys)
    assert not (tmp_path / "r.json").exists()


def test_eval_runs_on_a_good_folder(model_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = [
        "eval",
        "--model",
        str(model_dir),
        "--out",
        str(out),
        "--train-len",
        "100",
        "--what",
        "passkey",
        "--multiples",
        "1",
        "--depths",
        "0.5",
        "--trials",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 0
    assert "passkey" in json.loads(out.read_text())


def test_console_script_exit_code(tmp_path):
    """The installed entry point: exit 2 and one stderr line, no traceback."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    t = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fpa.cli",
            "synth",
            "--construct-n",
            "-3",
            "--task",
            "stack",
            "--dims",
            "1",
            "--ms",
            "1",
            "--seeds",
            "0",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert time.perf_counter() - t < 60
