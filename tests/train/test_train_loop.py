import numpy as np
import pytest
import torch

import fpa.tasks
from fpa.data import load_tokenizer
from fpa.models import FPAForCausalLM
from fpa.train import TrainConfig, train
from fpa.train.metrics import read_metrics
from fpa.train.schedule import lr_at


def test_smoke_on_embedded_corpus_lowers_loss(tiny_cfg, tmp_path):
    cfg = tiny_cfg(
        out_dir=str(tmp_path / "smoke"),
        data_dir=None,
        data_source="stdlib",
        max_bytes=300_000,
        steps=40,
        eval_every=20,
        ckpt_every=40,
        log_every=5,
    )
    summary = train(cfg)
    recs = read_metrics(cfg.out_dir)
    vals = [r["val_loss"] for r in recs if "val_loss" in r]
    assert recs[0]["loss"] > 5.0  # ~ln(257) at initialisation
    assert summary["final_train_loss"] < recs[0]["loss"] - 1.5
    assert vals[-1] < vals[0] and summary["val_loss"] == vals[-1]
    assert summary["tokens_per_s"] > 0
    # the final model and its tokenizer load from out_dir/model
    model = FPAForCausalLM.from_pretrained(summary["model_dir"])
    tok = load_tokenizer(summary["model_dir"])
    ids = torch.tensor([tok.encode("def main():\n    return 0\n")])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], tok.vocab_size)


def test_task_mixing_rate_and_samples(tiny_cfg, monkeypatch):
    calls = []

    def fake_mixer(rng, seq_len, tokenizer):
        calls.append(seq_len)
        return np.full(seq_len + 1, tokenizer.encode("z")[0], dtype=np.int64)

    monkeypatch.setitem(fpa.tasks.TASK_MIXERS, "fake", "test_train_loop:_unused")
    monkeypatch.setattr(fpa.tasks, "get_mixer", lambda name: fake_mixer)
    cfg = tiny_cfg(steps=25, batch_size=8, mix_task="fake", mix_rate=0.5, ckpt_every=25, eval_every=25)
    train(cfg)
    mixed = sum(r["mixed"] for r in read_metrics(cfg.out_dir))
    assert mixed == len(calls)
    assert 0.35 < mixed / (25 * 8) < 0.65 and set(calls) == {64}


def test_mixing_sample_with_wrong_length_is_rejected(tiny_cfg, monkeypatch):
    monkeypatch.setattr(fpa.tasks, "get_mixer", lambda name: lambda rng, n, tok: np.zeros(n, dtype=np.int64))
    with pytest.raises(ValueError, match=r"shape \(65,\)"):
        train(tiny_cfg(steps=4, mix_task="fake", mix_rate=1.0))


def test_lr_schedule():
    assert lr_at(0, 1.0, 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_at(10, 1.0, 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_at(55, 1.0, 10, 100, 0.1) == pytest.approx(0.55)
    assert lr_at(100, 1.0, 10, 100, 0.1) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(steps=0), "steps must be a positive int"),
        (dict(lr=0), "lr must be a finite number > 0"),
        (dict(batch_size=6, grad_accum=4), "multiple of grad_accum"),
        (dict(mix_rate=0.5), "mix_task is not set"),
        (dict(mix_rate=2.0, mix_task="passkey"), "mix_rate must be"),
        (dict(device="tpu"), "device must be one of"),
        (dict(parallel="zero3"), "parallel must be one of"),
        (dict(data_dir=None, data_source=None), "data_dir"),
        (dict(steps=True), r"steps must be a positive int, got True"),
        (dict(seed=False), r"seed must be a non-negative int, got False"),
        (dict(seed=-1), r"seed must be a non-negative int, got -1"),
        (dict(lr=float("inf")), r"lr must be a finite number > 0, got inf"),
        (dict(lr=float("nan")), r"lr must be a finite number > 0, got nan"),
        (dict(lr=True), r"lr must be a finite number > 0, got True"),
        (dict(grad_clip=float("inf")), r"grad_clip must be a finite number >= 0, got inf"),
        (dict(beta2=float("nan")), r"beta2 must be a finite number in \[0, 1\], got nan"),
        (dict(live_reg_threshold=0), r"live_reg_threshold must be a finite number > 0, got 0"),
        (dict(evict_threshold=float("inf")), r"evict_threshold must be a finite number >= 0 \(or None\)"),
        (dict(vocab_size=True), r"vocab_size must be a positive int \(or None\), got True"),
    ],
)
def test_bad_config(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(out_dir="x", **kw)


def test_config_file_json_and_yaml(tmp_path):
    (tmp_path / "c.json").write_text('{"out_dir": "o", "steps": 7, "attention": "fox"}')
    cfg = TrainConfig.from_file(tmp_path / "c.json", steps=9)
    assert (cfg.steps, cfg.attention) == (9, "fox")
    (tmp_path / "c.yaml").write_text("out_dir: o\nlr: 0.01\nmodel_overrides: {hidden_size: 64}\n")
    assert TrainConfig.from_file(tmp_path / "c.yaml").model_overrides == {"hidden_size": 64}
    (tmp_path / "bad.json").write_text('{"out_dir": "o", "stepz": 7}')
    with pytest.raises(ValueError, match="unknown keys in the training config"):
        TrainConfig.from_file(tmp_path / "bad.json")


def test_mismatched_resume_is_refused(tiny_cfg):
    train(tiny_cfg(steps=4))
    with pytest.raises(ValueError, match=r"settings differ.*'seed': \(0, 1\)"):
        train(tiny_cfg(steps=6, seed=1))
    with pytest.raises(ValueError, match="attention"):
        train(tiny_cfg(steps=6, attention="fox"))
    again = train(tiny_cfg(steps=4))  # already finished: nothing to do, same summary
    assert again["resumed_from"] == 4 and again["final_train_loss"] is not None
