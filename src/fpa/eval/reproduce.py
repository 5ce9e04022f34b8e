"""``fpa reproduce``: train the five methods with identical budgets, evaluate them, write the report.

Stages (each resumable, see fpa.eval.stages): config, data, train-<method> (the trainer resumes
from its own checkpoints), loss-<method>, passkey-<method>, cache-<method>-<percent>, example,
then results.json, report.md, the PNGs and README-snippet.md are rewritten from the stage outputs.
Under torchrun (WORLD_SIZE > 1) every rank trains; rank 0 alone evaluates and writes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from fpa.data.atomic import atomic_write_text
from fpa.eval.presets import METHODS, ReproducePreset
from fpa.eval.stages import Stages, read_json


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _wait_for(stages: Stages, name: str, poll_s: float = 2.0) -> None:
    """Block until stage ``name`` is recorded in the state file (written by rank 0)."""
    while True:
        if stages.state_path.is_file() and name in read_json(stages.state_path)["done"]:
            return
        time.sleep(poll_s)


def _train_config(p: ReproducePreset, out: Path, data_dir: Path, attention: str, mode: str, progress: bool):
    from fpa.train import TrainConfig

    return TrainConfig(
        out_dir=str(out), data_dir=str(data_dir), preset=p.model_preset, attention=attention,
        fpa_mode=mode, model_overrides=dict(p.model_overrides), seq_len=p.train_len, batch_size=p.batch_size,
        grad_accum=p.grad_accum, steps=p.steps, lr=p.lr, warmup_steps=p.warmup_steps, seed=p.seed,
        ckpt_every=max(1, p.steps // 4), eval_every=p.steps, log_every=max(1, p.steps // 20), device=p.device,
        mix_task="passkey", mix_rate=p.mix_rate, progress=progress, tokenizer=p.tokenizer)


def load_model(model_dir: Path, device: str):
    """(FPAForCausalLM in eval mode on ``device`` if available, its tokenizer) from a saved folder."""
    import torch

    from fpa.data import load_tokenizer
    from fpa.models import FPAForCausalLM

    dev = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
    model = FPAForCausalLM.from_pretrained(model_dir).to(dev).eval()
    return model, load_tokenizer(model_dir)


def evaluate_method(stages: Stages, p: ReproducePreset, name: str, attention: str, model_dir: Path,
                    data_dir: Path, progress: bool) -> dict:
    """Loss, full-cache passkey grid and cache-policy grids of one trained model (each a stage)."""
    from fpa.eval.kv import policy_grids
    from fpa.eval.loss import heldout_loss
    from fpa.eval.passkey import passkey_grid

    model, tok = load_model(model_dir, p.device)
    L = p.train_len

    def loss():
        return heldout_loss(model, data_dir, L, p.loss_multiple, p.loss_windows, progress)

    def passkey():
        return passkey_grid(model, tok, [L * m for m in p.passkey_multiples], p.depths, p.trials, seed=p.seed,
                            chunk_size=p.chunk_size, batch_size=p.trials, progress=progress, desc=f"passkey {name}")

    def cache(fraction: float):
        return lambda: policy_grids(model, attention, tok, [L * m for m in p.cache_multiples], p.cache_depths,
                                    p.cache_trials, fraction, p.chunk_size, p.calib_prompts, p.seed, progress,
                                    desc=f"{name} ")

    res = {"loss": stages.run(f"loss-{name}", loss), "passkey": stages.run(f"passkey-{name}", passkey), "cache": {}}
    for f in p.fractions:
        res["cache"][str(f)] = stages.run(f"cache-{name}-{round(100 * f)}", cache(f))
    return res


def reproduce(p: ReproducePreset, out_dir: str | Path, progress: bool = True,
              methods: tuple[str, ...] | None = None, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) every stage of preset ``p`` in ``out_dir``; returns the results dict."""
    from fpa.data import prepare_corpus
    from fpa.eval.example import passkey_example
    from fpa.eval.report import write_report
    from fpa.train import train

    out = Path(out_dir)
    chosen = [m for m in METHODS if methods is None or m[0] in methods]
    if not chosen:
        raise ValueError(f"methods must name some of {[m[0] for m in METHODS]}, got {methods!r}")
    stages = Stages(out, log=log, write=_is_main())
    if _is_main():  # the corpus and the trained models stay out of git; the report and results go in
        atomic_write_text(out / ".gitignore", "data/\nmodels/\n")
    cfg = stages.run("config", p.to_dict)
    if json.dumps(cfg) != json.dumps(p.to_dict()):
        raise ValueError(f"out_dir {out} holds a run of another configuration (preset {cfg.get('name')!r}); "
                         f"use another --out or delete it")
    data_dir = out / "data"
    if _is_main():
        stages.run("data", lambda: {"data_dir": str(prepare_corpus(p.data_source, data_dir, tokenizer=p.tokenizer,
                                                                   max_bytes=p.corpus_max_bytes, seed=p.seed))})
    else:  # torchrun: rank 0 prepares the corpus, the others wait for it
        _wait_for(stages, "data")
    trained = {}
    for name, attention, mode in chosen:
        tcfg = _train_config(p, out / "models" / name, data_dir, attention, mode, progress)
        trained[name] = stages.run(f"train-{name}", lambda tcfg=tcfg: train(tcfg))
    if not _is_main():
        return {}
    results = {"preset": p.to_dict(), "train_len": p.train_len, "methods": {}}
    for name, attention, mode in chosen:
        ev = evaluate_method(stages, p, name, attention, Path(trained[name]["model_dir"]), data_dir, progress)
        results["methods"][name] = {"attention": attention, "fpa_mode": mode if attention == "fpa" else None,
                                    "train": trained[name], **ev}
    examples = {}
    for name, attention, _ in chosen:
        if attention == "fpa":
            model, tok = load_model(Path(trained[name]["model_dir"]), p.device)
            examples[name] = stages.run(f"example-{name}", lambda model=model, tok=tok: passkey_example(
                model, tok, p.train_len * p.example_multiple, 0.5, seed=p.seed))
    results["examples"] = examples
    results["seconds"] = stages.seconds()
    write_report(results, out)
    return results
