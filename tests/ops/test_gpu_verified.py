"""auto on CUDA picks triton/flex only where verified (fpa.ops.gpu_verified): env override, record keyed
by device, versions and sources, a failed check takes a backend out again."""

from __future__ import annotations

import pytest
import torch

from fpa.ops import gpu_verified


@pytest.fixture
def record(tmp_path, monkeypatch):
    monkeypatch.setenv("FPA_GPU_CHECK_RECORD", str(tmp_path / "rec.json"))
    monkeypatch.delenv("FPA_GPU_BACKENDS", raising=False)
    key = {"device": "Fake H200", "torch": torch.__version__, "triton": "x", "source": gpu_verified.source_hash()}
    monkeypatch.setattr(gpu_verified, "environment_key", lambda device: dict(key))
    gpu_verified._allowed.cache_clear()
    return key


def test_nothing_allowed_without_a_record(record):
    assert gpu_verified.allowed_backends("cuda:0") == ()
    assert gpu_verified.allowed_backends("cpu") == ()


def test_record_allows_what_passed_and_a_failure_revokes(record):
    dev = torch.device("cuda", 0)
    gpu_verified.write_verdicts(dev, {"triton": False, "flex": True})
    assert gpu_verified.allowed_backends("cuda:0") == ("flex",)
    gpu_verified.write_verdicts(dev, {"triton": True, "flex": True})
    assert gpu_verified.allowed_backends("cuda:0") == ("triton", "flex")
    gpu_verified.write_verdicts(dev, {"triton": False, "flex": True})  # a later failed check
    assert gpu_verified.allowed_backends("cuda:0") == ("flex",)


def test_record_is_for_one_environment(record, monkeypatch):
    gpu_verified.write_verdicts(torch.device("cuda", 0), {"triton": True, "flex": True})
    changed = dict(record, source="0123456789abcdef")  # the kernel sources changed since the check
    monkeypatch.setattr(gpu_verified, "environment_key", lambda device: dict(changed))
    gpu_verified._allowed.cache_clear()
    assert gpu_verified.allowed_backends("cuda:0") == ()


def test_environment_overrides(record, monkeypatch):
    gpu_verified.write_verdicts(torch.device("cuda", 0), {"triton": True, "flex": True})
    monkeypatch.setenv("FPA_GPU_BACKENDS", "flex, nonsense")
    assert gpu_verified.allowed_backends("cuda:0") == ("flex",)
    monkeypatch.setenv("FPA_GPU_BACKENDS", "")
    assert gpu_verified.allowed_backends("cuda:0") == ()
