"""The 110m recipe's training path runs: two optimizer steps of the 110m model (768 wide, 12 layers,
32k vocabulary) through the TrainConfig ``fpa reproduce --preset 110m`` builds, shrunk only in
sequence length, batch and steps, under torchrun with 2 CPU processes and FSDP2 (gloo).

What this shows: the model shape, the preset's optimizer settings, gradient accumulation and the
FSDP2 wrapping and checkpointing run end to end and give finite losses. What it does not: GPU
memory, speed, the CUDA kernels, or anything at 2048 tokens (docs/reproduce.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fpa.experiments.lm.presets import PRESETS
from fpa.experiments.lm.reproduce import _train_config
from fpa.train.metrics import read_metrics

WORKER = r"""
import json, sys
from fpa.train import TrainConfig, train
train(TrainConfig(**json.loads(sys.argv[1])))
"""


@pytest.mark.slow
def test_110m_two_fsdp_steps_on_cpu(tmp_path):
    from fpa.data import prepare_corpus

    p = PRESETS["110m"]
    data = prepare_corpus("stdlib", tmp_path / "data", max_bytes=400_000, val_fraction=0.1)
    run = dict(spec=p.core[0], seed=p.seeds[0], role="core")
    cfg = _train_config(p, tmp_path / "run", Path(data), run, progress=False)
    assert (cfg.preset, cfg.lr, cfg.grad_accum, cfg.batch_size, cfg.seq_len) == ("110m", p.lr, 8, 256, 2048)
    # shrink only what a CPU cannot do: 2 ranks x 2 micro-batches x 1 sequence of 128 byte tokens, 2 steps
    small = cfg.to_dict() | dict(
        seq_len=128,
        batch_size=4,
        grad_accum=2,
        steps=2,
        ckpt_every=2,
        eval_every=2,
        eval_batches=1,
        log_every=1,
        device="cpu",
        parallel="fsdp",
        tokenizer="byte",
        mix_rate=0.0,
    )
    small["model_overrides"] = {**small["model_overrides"], "vocab_size": 32000}  # the BPE's size, byte data
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*cmd, json.dumps(small)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_metrics(tmp_path / "run")
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(32000), rel=0.1)  # an untrained 32k-way softmax
    saved = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert (saved["hidden_size"], saved["num_hidden_layers"], saved["vocab_size"]) == (768, 12, 32000)


def test_training_doc_yaml_is_the_preset(tmp_path):
    """docs/training.md's 110m-fpa.yaml trains what ``fpa reproduce --preset 110m`` trains (one recipe)."""
    import re

    from fpa.train import TrainConfig

    text = (Path(__file__).resolve().parents[3] / "docs" / "training.md").read_text()
    match = re.search(r"`110m-fpa.yaml`:\n\n```yaml\n(.*?)```", text, re.S)
    assert match, "docs/training.md lost its 110m-fpa.yaml"
    (tmp_path / "c.yaml").write_text(match.group(1))
    doc = TrainConfig.from_file(str(tmp_path / "c.yaml"))
    p = PRESETS["110m"]
    fpa_walk = next(s for s in p.core if s.base == "fpa-walk")
    ref = _train_config(p, tmp_path, tmp_path, dict(spec=fpa_walk, seed=p.seeds[0], role="core"), progress=False)
    keys = ("preset", "attention", "fpa_mode", "model_overrides", "seq_len", "batch_size", "grad_accum", "steps")
    keys += ("lr", "warmup_steps", "min_lr_ratio", "weight_decay", "mix_task", "mix_rate", "ckpt_every", "eval_every")
    assert {k: getattr(doc, k) for k in keys} == {k: getattr(ref, k) for k in keys}
