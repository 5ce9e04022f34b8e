"""Exact resume after SIGKILL: a run killed mid-way and resumed logs the same losses as one that never stopped."""

import json
import os
import signal
import subprocess
import sys

import torch

from fpa.train import train
from fpa.train.checkpoint import list_checkpoints
from fpa.train.metrics import read_metrics

WORKER = r"""
import json, os, signal, sys
from fpa.train import TrainConfig, train
cfg = TrainConfig(**json.loads(sys.argv[1]))
kill_at = int(sys.argv[2])
def on_step(rec):
    if rec["step"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)  # no clean exit: nothing after this runs
train(cfg, on_step=on_step)
"""


def _losses(out_dir):
    return [(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(out_dir)]


def test_sigkill_then_resume_matches_uninterrupted(tiny_cfg, tmp_path):
    n = 8
    ref_cfg = tiny_cfg(out_dir=str(tmp_path / "ref"), steps=n, ckpt_every=n // 2)
    ref = train(ref_cfg)

    cfg = tiny_cfg(out_dir=str(tmp_path / "killed"), steps=n, ckpt_every=n // 2)
    # the worker runs as many intra-op threads as this process: a GEMM split over a different number
    # of threads may round differently, and the claim below is bitwise
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    # killed one step after the step-4 checkpoint: step 5 is lost and must be redone
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(cfg.to_dict()), str(n // 2 + 1)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [p.name for p in list_checkpoints(cfg.out_dir)] == ["step-00000004.pt"]
    assert max(r["step"] for r in read_metrics(cfg.out_dir)) == n // 2 + 1  # logged past the checkpoint

    resumed = train(cfg)
    assert resumed["resumed_from"] == n // 2
    # Bitwise equal: same process-independent data (seed, step), same params/AdamW state, same CPU kernels.
    assert _losses(cfg.out_dir) == _losses(ref_cfg.out_dir)
    assert resumed["final_train_loss"] == ref["final_train_loss"] and resumed["val_loss"] == ref["val_loss"]
