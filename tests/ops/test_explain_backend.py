"""backend="auto" says in one line what it runs and why (fpa.ops.dispatch.explain_backend), and on
CUDA picks triton only where the record allows it AND a compiled-clean configuration exists.

No GPU here: the CUDA cases use a stand-in for q (device, dtype, shape are all the choice reads)
and a stubbed architecture query."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from fpa.ops import dispatch, gpu_verified
from fpa.ops.fpa import triton_configs

pytest.importorskip("triton")


@pytest.fixture
def record(tmp_path, monkeypatch):
    monkeypatch.setenv("FPA_GPU_CHECK_RECORD", str(tmp_path / "rec.json"))
    monkeypatch.delenv("FPA_GPU_BACKENDS", raising=False)
    key = {"device": "Fake H100", "torch": torch.__version__, "triton": "x", "source": gpu_verified.source_hash()}
    monkeypatch.setattr(gpu_verified, "environment_key", lambda device: dict(key))
    monkeypatch.setattr(triton_configs, "cuda_arch", lambda device: (90, "sm_90"))
    gpu_verified._allowed.cache_clear()
    return key


def fake_cuda_q(dtype=torch.bfloat16, D=128):
    return SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype, shape=(1, 4, 16, D))


def test_cpu_explained():
    q = torch.zeros(1, 2, 3, 8)
    assert dispatch.explain_backend(q) == "auto -> chunked: q is on cpu; auto runs triton or flex only on CUDA"


def test_cuda_without_a_record(record):
    why = dispatch.explain_backend(fake_cuda_q())
    assert why.startswith("auto -> chunked: no record of benchmarks/gpu_check.py for Fake H100")


def test_cuda_verified_picks_triton_with_its_configuration(record):
    gpu_verified.write_verdicts(torch.device("cuda", 0), {"triton": True, "flex": False})
    why = dispatch.explain_backend(fake_cuda_q())
    cfg = triton_configs.CONFIGS[(90, "bf16", 128)]
    assert why.startswith("auto -> triton: benchmarks/gpu_check.py passed triton and failed flex on Fake H100")
    assert cfg.describe() in why and "compiled clean ahead of time" in why
    assert dispatch._pick_auto(fake_cuda_q(), True, None, None, explain=False) == ("triton", "")


def test_cuda_uncovered_inputs_fall_back_with_the_reason(record):
    gpu_verified.write_verdicts(torch.device("cuda", 0), {"triton": True, "flex": False})
    why = dispatch.explain_backend(fake_cuda_q(torch.float64))
    assert why.startswith("auto -> chunked:") and "triton cannot run these inputs" in why and "float64" in why
    why = dispatch.explain_backend(fake_cuda_q(D=256))
    assert "head dim 256" in why


def test_stale_record_and_override(record, monkeypatch):
    gpu_verified.write_verdicts(torch.device("cuda", 0), {"triton": True, "flex": True})
    monkeypatch.setattr(gpu_verified, "environment_key", lambda device: dict(record, source="0" * 16))
    gpu_verified._allowed.cache_clear()
    assert "stale (source changed" in dispatch.explain_backend(fake_cuda_q())
    monkeypatch.setenv("FPA_GPU_BACKENDS", "flex")
    assert dispatch.explain_backend(fake_cuda_q()).startswith("auto -> flex: FPA_GPU_BACKENDS='flex' allows flex")


def test_auto_logs_its_reason_at_debug(caplog):
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    field, level = torch.randn(1, 2, 5), torch.randn(1, 2, 5)
    with caplog.at_level(logging.DEBUG, logger="fpa.ops.dispatch"):
        dispatch.first_passage_attention(q, k, v, field, level)
    assert "auto -> chunked: q is on cpu" in caplog.text
