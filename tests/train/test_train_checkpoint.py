import pytest
import torch

from fpa.train import checkpoint as ck
from fpa.train import train


def test_save_load_roundtrip_and_keep_last(tmp_path):
    for step in (1, 2, 3):
        ck.save_checkpoint(tmp_path, step, {"step": step, "w": torch.arange(4.0) * step}, keep=2)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step-00000002.pt", "step-00000003.pt"]
    state = ck.load_checkpoint(ck.latest_checkpoint(tmp_path))
    assert state["step"] == 3 and torch.equal(state["w"], torch.arange(4.0) * 3)


def test_truncated_corrupt_and_sidecarless_checkpoints(tmp_path):
    path = ck.save_checkpoint(tmp_path, 5, {"w": torch.ones(100)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="step-00000005.pt is truncated"):
        ck.load_checkpoint(path)
    path.write_bytes(data[:-8] + b"\xff" * 8)
    with pytest.raises(ValueError, match="step-00000005.pt is corrupt"):
        ck.load_checkpoint(path)
    path.with_suffix(".json").write_text("garbage")
    with pytest.raises(ValueError, match="sidecar"):
        ck.load_checkpoint(path)
    path.with_suffix(".json").unlink()
    assert ck.latest_checkpoint(tmp_path) is None  # a payload without its sidecar is not a checkpoint


def test_crash_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    ck.save_checkpoint(tmp_path, 1, {"w": torch.zeros(3)})

    def dying_write(path, write):
        with open(str(path) + ".partial", "wb") as f:
            f.write(b"half a checkpoint")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(ck, "atomic_write", dying_write)
    with pytest.raises(KeyboardInterrupt):
        ck.save_checkpoint(tmp_path, 2, {"w": torch.ones(3)})
    latest = ck.latest_checkpoint(tmp_path)
    assert latest.name == "step-00000001.pt"
    assert torch.equal(ck.load_checkpoint(latest)["w"], torch.zeros(3))


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    from fpa.data.atomic import atomic_write

    target = tmp_path / "f.bin"
    atomic_write(target, lambda f: f.write(b"old"))

    def fail(f):
        f.write(b"new partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(target, fail)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]  # no temp file left behind


def test_resume_from_corrupt_checkpoint_is_a_clear_error(tiny_cfg):
    cfg = tiny_cfg(steps=4, ckpt_every=2)
    train(cfg)
    last = ck.latest_checkpoint(cfg.out_dir)
    last.write_bytes(last.read_bytes()[:1000])
    with pytest.raises(ValueError, match="truncated or corrupt.*previous checkpoint"):
        train(tiny_cfg(steps=6, ckpt_every=2))
