"""benchmarks/gpu_check.py --dry-run runs end to end on CPU (tiny shapes, triton in its interpreter),
including the tile-skip figure of a saved model, and reports every section; without CUDA and
without --dry-run it refuses clearly."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run(tmp_path):
    pytest.importorskip("triton")
    from fpa.models import FPAConfig, FPAForCausalLM

    model_dir = tmp_path / "model"
    FPAForCausalLM(
        FPAConfig.from_preset("tiny", attention="fpa", fpa={"mode": "walk"}, num_hidden_layers=1)
    ).save_pretrained(model_dir)
    out = tmp_path / "dry.md"
    record = tmp_path / "record.json"
    env = dict(os.environ, FPA_GPU_CHECK_RECORD=str(record))
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--dry-run",
            "--out",
            str(out),
            "--model",
            str(model_dir),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    text = out.read_text()
    for part in (
        "## (a) Correctness",
        "Verdict: triton **PASS**, flex **PASS**",
        "## (b) Forward + backward time",
        "| FoX via triton |",
        "Off-diagonal tile pairs skipped",
        "Trained model",
        "## (c) Training throughput",
        "| fpa-walk |",
    ):
        assert part in text, f"missing {part!r} in:\n{text}"
    assert "FAIL" not in text and "failed" not in text
    assert not record.exists(), "a dry run must not record a GPU verdict"


def test_gpu_check_quick_dry_run(tmp_path):
    """--quick takes the path an H100 takes (fewer shapes, a short speed table, no training), up to the
    device calls, and writes the table and its JSON."""
    pytest.importorskip("triton")
    out = tmp_path / "quick.md"
    env = dict(os.environ, FPA_GPU_CHECK_RECORD=str(tmp_path / "record.json"))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--quick", "--dry-run", "--out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    text = out.read_text()
    assert "Verdict: triton **PASS**, flex **PASS**" in text and "| FPA triton |" in text
    assert "## (c)" not in text and "--quick --dry-run" in text
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["verdict"] == {"triton": True, "flex": True}
    assert {c["backend"] for c in rec["correctness"]} == {"triton", "flex"} and all(
        c["passed"] for c in rec["correctness"]
    )
    assert {r["method"] for r in rec["speed_ms"]} >= {"FPA triton", "SDPA flash"}
    assert all(isinstance(r["ms"], float) and r["ms"] > 0 for r in rec["speed_ms"])


def test_device_slug(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert check.device_slug("NVIDIA H200") == "h200"
    assert check.device_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert check.device_slug("Some GPU 9000") == "some-gpu-9000"


def test_gpu_check_needs_cuda_or_dry_run(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # where the script finds gpu_timing
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        check.main(["--compare", "--dry-run"])
    rows = list(check.methods(2, 16, compare=True))
    assert {"FPA flex", check.FLA_ROW} <= set(rows)
    # the default rows, in their order, are the rows --compare keeps
    assert [r for r in rows if r not in ("FPA flex", check.FLA_ROW)] == list(check.methods(2, 16))
