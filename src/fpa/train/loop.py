"""train(cfg): the training loop (one process, DDP or FSDP2), exact resume, final save_pretrained."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from torch import nn

from fpa.compat import hf_progress_bars
from fpa.data import TokenShards, load_tokenizer, prepare_corpus
from fpa.data.atomic import atomic_write_text
from fpa.train import distributed as D
from fpa.train.batches import StepBatches, eval_windows
from fpa.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from fpa.train.config import TrainConfig
from fpa.train.metrics import MetricsLog
from fpa.train.model_setup import build_model, build_optimizer, set_training_eviction
from fpa.train.progress import StepProgress
from fpa.train.schedule import lr_at

MODEL_DIR = "model"
# settings a checkpoint must share with the run that resumes it (they define the model or the data stream)
RESUME_KEYS = (
    "preset",
    "attention",
    "fpa_mode",
    "model_overrides",
    "seed",
    "batch_size",
    "seq_len",
    "tokenizer",
    "mix_task",
    "mix_rate",
    "live_reg",
    "live_reg_threshold",
    "live_reg_from_step",
    "evict_threshold",
    "evict_from_step",
    "evict_threshold_start",
    "evict_ramp_steps",
    "evict_straight_through",
)


def resolve_data(cfg: TrainConfig, d: D.Dist) -> Path:
    """cfg.data_dir, or cfg.data_source prepared into out_dir/data (by rank 0; the others wait)."""
    if cfg.data_dir is not None:
        return Path(cfg.data_dir)
    data_dir = Path(cfg.out_dir) / "data"
    if d.is_main:
        prepare_corpus(
            cfg.data_source,
            data_dir,
            tokenizer=cfg.tokenizer,
            vocab_size=cfg.vocab_size,
            seed=cfg.seed,
            max_bytes=cfg.max_bytes,
        )
    if d.world_size > 1:
        torch.distributed.barrier()
    return data_dir


def _autocast(cfg: TrainConfig, d: D.Dist):
    use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and d.device.type == "cuda")
    if use_bf16:
        return torch.autocast(device_type=d.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: nn.Module, val: TokenShards, cfg: TrainConfig, d: D.Dist, micro: int) -> float:
    """Mean next-token loss over ``eval_batches * batch_size`` fixed held-out windows (all ranks)."""
    starts = eval_windows(val, cfg.seq_len, cfg.eval_batches * cfg.batch_size)[d.rank :: d.world_size]
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(starts), micro):
        x = torch.stack([torch.from_numpy(val[s : s + cfg.seq_len + 1]) for s in starts[i : i + micro]]).to(d.device)
        with _autocast(cfg, d):
            tok = model(input_ids=x, labels=x, return_per_token_loss=True).per_token_loss
        total, count = total + tok.float().sum().item(), count + tok.numel()
    model.train()
    total_all, count_all = D.all_reduce_sum([total, float(count)], d)
    return total_all / max(count_all, 1.0)


def check_resumable(saved: dict, cfg: TrainConfig, ckpt: Path) -> None:
    """ValueError naming every RESUME_KEYS setting that differs between a checkpoint and ``cfg``."""
    now = cfg.to_dict()
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # keys older checkpoints lack
    diff = {k: (saved.get(k, defaults[k]), now[k]) for k in RESUME_KEYS if saved.get(k, defaults[k]) != now[k]}
    if diff:
        raise ValueError(
            f"cannot resume from {ckpt}: settings differ (checkpoint, now): {diff}; "
            "use another out_dir or the checkpoint's settings"
        )


def _mixer(cfg: TrainConfig):
    if not cfg.mix_task or cfg.mix_rate == 0:
        return None
    from fpa.tasks import get_mixer

    return get_mixer(cfg.mix_task)


def _train_step(model, opt, batches: StepBatches, step: int, cfg: TrainConfig, d: D.Dist, micro: int, reg=None) -> dict:
    """One optimizer step over the global batch; returns the step's record (loss is the global mean)."""
    lr = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    for g in opt.param_groups:
        g["lr"] = lr * g.get("lr_multiplier", 1.0)
    loss_sum, n_mixed = 0.0, 0
    for a in range(cfg.grad_accum):
        lo = (a * d.world_size + d.rank) * micro
        x, mixed = batches.get(step, lo, lo + micro)
        x = x.to(d.device)
        last = a == cfg.grad_accum - 1
        if d.parallel == "fsdp":
            model.set_requires_gradient_sync(last)  # reduce-scatter gradients once, after the last micro-batch
        sync = model.no_sync() if d.parallel == "ddp" and not last else contextlib.nullcontext()
        with sync:
            with _autocast(cfg, d):
                loss = model(input_ids=x, labels=x).loss
            total = loss if reg is None else loss + reg.penalty().to(loss.device)
            (total / cfg.grad_accum).backward()
        loss_sum += loss.item()
        n_mixed += mixed
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss_all, mixed_all = D.all_reduce_sum([loss_sum, float(n_mixed)], d)
    gn = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
    return {
        "step": step + 1,
        "loss": loss_all / (cfg.grad_accum * d.world_size),
        "lr": lr,
        "grad_norm": float(gn),
        "mixed": int(mixed_all),
    }


def _save_final(model, cfg: TrainConfig, d: D.Dist, data_dir: Path, summary: dict) -> Path:
    """save_pretrained to out_dir/model (rank 0), with the tokenizer and training.json beside it."""
    msd = D.full_model_state(model, d)
    out = Path(cfg.out_dir) / MODEL_DIR
    if d.is_main:
        from fpa.data.tokenizer import save_hf_tokenizer
        from fpa.models import FPAConfig, FPAForCausalLM
        from fpa.models.card import write_model_card

        base = D.unwrap(model)
        if not isinstance(base, FPAForCausalLM):
            raise TypeError(f"model must be an FPAForCausalLM, possibly wrapped, got {type(base).__name__}")
        final = FPAForCausalLM(cast(FPAConfig, base.config))  # config_class of FPAForCausalLM
        final.load_state_dict(msd)
        tok = load_tokenizer(data_dir)
        for c in (final.config, final.generation_config):  # generation stops at the document separator
            c.eos_token_id = c.pad_token_id = tok.eos_id
        final.save_pretrained(out)
        tok.save(out)
        save_hf_tokenizer(tok, out)  # tokenizer.json + tokenizer_config.json: AutoTokenizer loads the folder
        atomic_write_text(
            out / "training.json",
            json.dumps({"config": cfg.to_dict(), "data_dir": str(data_dir), "summary": summary}, indent=1) + "\n",
        )
        write_model_card(
            out,
            final.config,
            {**summary, "tokenizer": tok.kind},
            n_parameters=sum(p.numel() for p in final.parameters()),
        )
    return out


def _resume(out: Path, model: nn.Module, opt, cfg: TrainConfig, d: D.Dist) -> tuple[int, dict | None]:
    """Load the newest checkpoint in ``out`` if any: (its step, its last metrics record); else (0, None)."""
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        return 0, None
    state = load_checkpoint(ckpt)
    check_resumable(state["config"], cfg, ckpt)
    D.load_full_state(model, opt, state["model"], state["optimizer"], d)
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"]), state.get("record")


def _checkpoint(out: Path, step: int, model: nn.Module, opt, cfg: TrainConfig, d: D.Dist, rec: dict) -> None:
    """Gather the full state (all ranks) and write checkpoint ``step`` (rank 0)."""
    msd, osd = D.full_state(model, opt, d)
    if d.is_main:
        save_checkpoint(
            out,
            step,
            {
                "step": step,
                "model": msd,
                "optimizer": osd,
                "config": cfg.to_dict(),
                "torch_rng": torch.get_rng_state(),
                "record": rec,
            },
            keep=cfg.keep_checkpoints,
        )


def train(cfg: TrainConfig, on_step: Callable[[dict], None] | None = None) -> dict:
    """Train (or resume) ``cfg``; returns a summary dict (final_train_loss, val_loss, tokens_per_s, paths).

    ``on_step(record)`` is called on every rank after each optimizer step (tests use it)."""
    d = D.setup(cfg.device, cfg.parallel)
    try:
        # transformers' bars ("Writing model shards") only where ours is a bar
        with hf_progress_bars(cfg.progress and sys.stdout.isatty()):
            return _run(cfg, d, on_step)
    finally:
        D.teardown(d)


def _run(cfg: TrainConfig, d: D.Dist, on_step) -> dict:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    per_step = d.world_size * cfg.grad_accum
    if cfg.batch_size % per_step:
        raise ValueError(f"batch_size ({cfg.batch_size}) must be a multiple of world_size * grad_accum ({per_step})")
    micro = cfg.batch_size // per_step
    data_dir = resolve_data(cfg, d)
    tok = load_tokenizer(data_dir)
    train_shards = TokenShards(data_dir, "train", verify=cfg.verify_data)
    val_shards = TokenShards(data_dir, "val", verify=cfg.verify_data)
    batches = StepBatches(train_shards, cfg.seq_len, cfg.batch_size, cfg.seed, _mixer(cfg), cfg.mix_rate, tok)
    eval_windows(val_shards, cfg.seq_len, 1)  # fail now, not at the first eval, if val is too short

    probe = None
    if cfg.mix_task and cfg.mix_rate > 0:
        from fpa.tasks import get_probe

        probe = get_probe(cfg.mix_task)
    model: nn.Module = build_model(cfg, tok.vocab_size)
    model = D.wrap(model.to(d.device), d)
    opt = build_optimizer(model, cfg)
    reg = None
    if cfg.live_reg > 0:
        from fpa.train.regularizers import LiveFractionRegularizer

        reg = LiveFractionRegularizer(model, cfg.live_reg, cfg.live_reg_threshold)
    start, rec = _resume(out, model, opt, cfg, d)
    log = MetricsLog(out, start, cfg.tensorboard) if d.is_main else None
    shown = StepProgress(f"train {out.name}", start, cfg.steps, cfg.log_every, cfg.progress) if d.is_main else None
    tokens_per_step = cfg.batch_size * cfg.seq_len
    train_time, val_loss = 0.0, None
    threshold: float | None = None  # the training eviction's threshold now
    model.train()
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        if cfg.evict_threshold is not None:
            now = cfg.evict_threshold_at(step)
            if step == start or now != threshold:
                threshold = now
                set_training_eviction(model, threshold, cfg.evict_straight_through)
        if reg is not None:
            reg.active = step >= cfg.live_reg_from_step
        rec = _train_step(model, opt, batches, step, cfg, d, micro, reg)
        if d.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        train_time += dt
        rec["tokens_per_s"] = tokens_per_step / dt
        if not math.isfinite(rec["loss"]):
            raise FloatingPointError(f"loss is {rec['loss']} at step {rec['step']}; lower lr or check the data")
        done = rec["step"]
        if done % cfg.eval_every == 0 or done == cfg.steps:
            val_loss = evaluate(model, val_shards, cfg, d, micro)
            rec["val_loss"] = val_loss
            if probe is not None:  # every rank runs it (an FSDP forward needs all of them)
                rec["task_loss"] = probe(model, tok, cfg.seq_len, device=d.device)
        if log is not None and (done % cfg.log_every == 0 or done == cfg.steps or "val_loss" in rec):
            log.log(rec)
        if shown is not None:
            shown.update(done, rec["loss"], (done - start) * tokens_per_step / train_time)
        if done % cfg.ckpt_every == 0 or done == cfg.steps:
            _checkpoint(out, done, model, opt, cfg, d, rec)
        if on_step is not None:
            on_step(rec)
    if shown is not None:
        shown.close()
    if log is not None:
        log.close()
    if val_loss is None:
        val_loss = evaluate(model, val_shards, cfg, d, micro)
    ran = cfg.steps - start
    summary = {
        "steps": cfg.steps,
        "resumed_from": start,
        "final_train_loss": rec["loss"] if rec else None,
        "val_loss": val_loss,
        "tokens_per_s": ran * tokens_per_step / train_time if train_time else None,
        "train_tokens": cfg.steps * tokens_per_step,
        "out_dir": str(out),
        "data_dir": str(data_dir),
        "model_dir": str(out / MODEL_DIR),
        "metrics": str(out / "metrics.jsonl"),
        "checkpoint": str(latest_checkpoint(out)),
    }
    _save_final(model, cfg, d, data_dir, summary)
    return summary
