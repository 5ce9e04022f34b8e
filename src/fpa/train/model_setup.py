"""Build the model and the AdamW optimizer of a TrainConfig."""

from __future__ import annotations

import torch
from torch import nn

from fpa.models import FPAConfig, FPAForCausalLM
from fpa.train.config import TrainConfig


def model_config(cfg: TrainConfig, vocab_size: int) -> FPAConfig:
    """The preset with attention / fpa_mode / overrides; vocab_size defaults to the tokenizer's."""
    over = {"vocab_size": vocab_size, **cfg.model_overrides}
    if "num_attention_heads" in over and "num_key_value_heads" not in over:
        over["num_key_value_heads"] = over["num_attention_heads"]  # the preset's kv heads may not divide
    if over["vocab_size"] < vocab_size:
        raise ValueError(f"model_overrides vocab_size ({over['vocab_size']}) is smaller than the tokenizer's ({vocab_size})")
    return FPAConfig.from_preset(cfg.preset, attention=cfg.attention, fpa_mode=cfg.fpa_mode, **over)


def build_model(cfg: TrainConfig, vocab_size: int) -> FPAForCausalLM:
    torch.manual_seed(cfg.seed)
    return FPAForCausalLM(model_config(cfg, vocab_size))


def set_training_eviction(model: nn.Module, threshold: float | None) -> int:
    """Eviction in the training loop: every FirstPassageAttention layer of ``model`` masks a key out
    once beta * dip > ``threshold`` in training mode (``set_training_eviction``); None turns it off.
    Returns the number of layers set; ValueError if the model has none."""
    from fpa.layers.attention import FirstPassageAttention

    layers = [m for m in model.modules() if isinstance(m, FirstPassageAttention)]
    if not layers:
        raise ValueError("eviction in the training loop needs a model with FPA attention layers")
    for m in layers:
        m.set_training_eviction(threshold)
    return len(layers)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Optimizer parameter groups of a model: weight decay on matrices (>= 2-D parameters) only,
    and each group's ``lr_multiplier`` (1.0, or a layer's own, e.g. FirstPassageAttention's
    ``field_lr_multiplier`` for its ``field_parameters()``). The trainer sets each group's lr to
    ``lr_multiplier * schedule(step)``; in your own loop, do the same."""
    from fpa.layers.attention import FirstPassageAttention

    multiplier = {}
    for m in model.modules():
        if isinstance(m, FirstPassageAttention):
            multiplier.update({id(p): m.field_lr_multiplier for p in m.field_parameters()})
    buckets: dict[tuple[bool, float], list] = {}
    for p in model.parameters():
        if p.requires_grad:
            buckets.setdefault((p.dim() >= 2, multiplier.get(id(p), 1.0)), []).append(p)
    return [{"params": ps, "weight_decay": weight_decay if decay else 0.0, "lr_multiplier": mult}
            for (decay, mult), ps in sorted(buckets.items(), key=lambda kv: (not kv[0][0], -kv[0][1]))]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over ``parameter_groups(model, cfg.weight_decay)`` (per-group lr multipliers)."""
    return torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
