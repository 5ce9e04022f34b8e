"""Worker entry points of ``fpa agent``: training one arm on one seed, its 1x control, and decoding
the long sessions of one length under one method. Module-level functions of picklable arguments
returning JSON-able dicts (fpa.experiments.pool)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from fpa.experiments.agent.analysis import accuracy
from fpa.experiments.agent.preset import ARM_OF, BUDGET_METHODS, FPA_ARM, FULL_METHODS, AgentPreset
from fpa.tasks.agent_sessions import TRAIN_SPEC, SessionSpec, _max_tail_bytes


def train_config(p: AgentPreset, arm: str, seed: int, out_dir: str | Path, data_dir: str | Path, progress: bool):
    """The TrainConfig of ``arm`` on ``seed``: agent sessions at ``p.seq_len``; the FPA arm is a walk
    with ``p.fpa_options`` trained under FPAEviction(``p.threshold``) (``evict_threshold``) from step
    ``p.evict_from_step`` on, and with ``p.live_reg`` > 0 the live-fraction term at that threshold
    from the same step."""
    from fpa.train import TrainConfig

    fpa = arm == FPA_ARM
    over = {**p.model_overrides, **({"fpa": dict(p.fpa_options)} if fpa else dict(p.fox_overrides))}
    return TrainConfig(
        out_dir=str(out_dir),
        data_dir=str(data_dir),
        preset=p.model_preset,
        attention="fpa" if fpa else "fox",
        fpa_mode="walk",
        model_overrides=over,
        seq_len=p.seq_len,
        batch_size=p.batch_size,
        steps=p.steps,
        lr=p.lr,
        warmup_steps=p.warmup_steps,
        seed=seed,
        ckpt_every=max(1, p.steps // 4),
        eval_every=p.eval_every,
        eval_batches=1,
        log_every=max(1, p.steps // 20),
        device=p.device,
        mix_task=p.mix_task,
        mix_rate=p.mix_rate,
        progress=progress,
        evict_threshold=p.threshold if fpa else None,
        evict_from_step=p.evict_from_step if fpa else 0,
        evict_threshold_start=p.threshold_start if fpa else None,
        evict_ramp_steps=p.ramp_steps if fpa else 0,
        evict_straight_through=p.straight_through if fpa else False,
        live_reg=p.live_reg if fpa else 0.0,
        live_reg_threshold=p.threshold if fpa and p.live_reg else TrainConfig.live_reg_threshold,
        live_reg_from_step=p.evict_from_step if fpa and p.live_reg else 0,
    )


def train_arm(cfg_dict: dict) -> dict:
    """Train one run from its TrainConfig as a dict: the trainer's summary and the answer-loss
    curve (``task_loss``, fpa.tasks.agent_sessions.answer_loss) read from its metrics."""
    from fpa.train import TrainConfig, train

    summary = train(TrainConfig.from_dict(cfg_dict))
    curve = []
    metrics = Path(summary["metrics"])
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            rec = json.loads(line)
            if "task_loss" in rec:
                curve.append({"step": rec["step"], "task_loss": rec["task_loss"]})
    return {**summary, "task_loss_curve": curve}


def load_model(model_dir: str | Path) -> tuple[Any, float | None]:
    """(FPAForCausalLM in eval mode on the CPU, the threshold it was trained under or None). A
    rule-trained model applies its rule in its cache-free forwards too (``set_training_eviction``)."""
    from fpa.compat import hf_progress_bars
    from fpa.models import FPAForCausalLM
    from fpa.train.model_setup import set_training_eviction

    with hf_progress_bars(False):
        model = FPAForCausalLM.from_pretrained(model_dir)
    model.eval()
    threshold = json.loads((Path(model_dir) / "training.json").read_text())["config"].get("evict_threshold")
    if threshold is not None:
        set_training_eviction(model, float(threshold))
    return model, None if threshold is None else float(threshold)


def make_policy(p: AgentPreset, method: str, budget: int | None = None):
    """A zero-argument factory of the cache policy of ``method`` (None for the full cache);
    ``budget`` (keys per head) for the BUDGET_METHODS."""
    from fpa.cache import H2O, TOVA, FoXEviction, FPAEviction, SlidingWindow, StreamingLLM

    if method in BUDGET_METHODS:
        if budget is None:
            raise ValueError(f"method {method!r} needs a budget (keys per head)")
        b = int(budget)
        return {
            "window": lambda: SlidingWindow(b),
            "streamingllm": lambda: StreamingLLM(b, sinks=min(4, b)),
            "tova": lambda: TOVA(b),
            "h2o": lambda: H2O(b),
        }[method]
    if method in FULL_METHODS:
        return lambda: None
    if method == "fpa-rule":
        return lambda: FPAEviction(p.threshold, within_chunks=True)
    if method == "fox-rule":
        return lambda: FoXEviction(p.fox_threshold)
    raise ValueError(f"unknown method {method!r}")


def control_length(p: AgentPreset) -> int:
    """Bytes of the control sessions: the training samples' session length at ``p.seq_len`` (the
    sample is the session, a question and its answer, ``seq_len + 1`` bytes in all)."""
    return p.seq_len + 1 - _max_tail_bytes(TRAIN_SPEC)


def _decode(p: AgentPreset, model_dir: str, method: str, length: int, seeds, budget: int | None) -> dict:
    import torch

    from fpa.experiments.agent.decode import decode_session

    torch.manual_seed(0)
    model, served = load_model(model_dir)
    if method not in ARM_OF:
        raise ValueError(f"unknown method {method!r}")
    if (ARM_OF[method] == FPA_ARM) != (served is not None):
        raise ValueError(f"method {method!r} does not fit the model in {model_dir} (trained under {served})")
    spec = replace(SessionSpec(depth=p.depth, length=length), seeds=tuple(seeds))
    policy = make_policy(p, method, budget)
    sessions = [decode_session(model, spec, s, policy, p.chunk_size, walk=method == "fpa-rule") for s in seeds]
    return {"method": method, "length": length, "budget": budget, "sessions": sessions}


def control_stage(p_dict: dict, model_dir: str, method: str) -> dict:
    """The 1x control of one model as served (``method``: "fpa-rule" or "fox-full"): held-out sessions
    at the training length, one question of each kind; "passed" when the open kinds' accuracy is
    >= ``control_min``."""
    p = AgentPreset.from_dict(p_dict)
    seeds = range(p.control_seed, p.control_seed + p.control_sessions)
    out = _decode(p, model_dir, method, control_length(p), seeds, None)
    acc = accuracy([q for s in out["sessions"] for q in s["questions"]])
    return {**out, "accuracy": acc, "passed": bool(acc["open"] >= p.control_min)}


def decode_stage(p_dict: dict, model_dir: str, method: str, length: int, budget: int | None = None) -> dict:
    """The long sessions of ``length`` bytes decoded by one model under ``method`` (``budget``
    keys per head for the budget policies)."""
    p = AgentPreset.from_dict(p_dict)
    out = _decode(p, model_dir, method, length, p.session_seeds(length), budget)
    return {**out, "accuracy": accuracy([q for s in out["sessions"] for q in s["questions"]])}
