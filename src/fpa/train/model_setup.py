"""Build the model and the AdamW optimizer of a TrainConfig."""

from __future__ import annotations

import torch
from torch import nn

from fpa.layers.attention import FirstPassageAttention, ForgettingAttention
from fpa.models import FPAForCausalLM


def build_model(cfg, vocab_size: int) -> FPAForCausalLM:
    """The model of a fpa.train.TrainConfig (``cfg.model_config(vocab_size)``), seeded with cfg.seed."""
    torch.manual_seed(cfg.seed)
    return FPAForCausalLM(cfg.model_config(vocab_size))


def set_training_eviction(model: nn.Module, threshold: float | None, straight_through: bool = False) -> int:
    """Eviction in the training loop: every FirstPassageAttention (ForgettingAttention) layer of
    ``model`` masks a key out once its penalty beta * dip (-sum log f) > ``threshold``, in every
    forward without a cache (``set_training_eviction``); None turns it off. ``straight_through``:
    the gradients of attention without the rule (fpa.layers.fpa_form.evicting_attention). Returns
    the number of layers set; ValueError if the model has none."""
    layers = [m for m in model.modules() if isinstance(m, (FirstPassageAttention, ForgettingAttention))]
    if not layers:
        raise ValueError("eviction in the training loop needs a model with FPA or FoX attention layers")
    for m in layers:
        m.set_training_eviction(threshold, straight_through)
    return len(layers)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Optimizer parameter groups of a model: weight decay on matrices (>= 2-D parameters) only,
    and each group's ``lr_multiplier`` (1.0, or a layer's own, e.g. FirstPassageAttention's
    ``field_lr_multiplier`` for its ``field_parameters()``). The trainer sets each group's lr to
    ``lr_multiplier * schedule(step)``; in your own loop, do the same."""
    multiplier = {}
    for m in model.modules():
        if isinstance(m, FirstPassageAttention):
            multiplier.update({id(p): m.field_lr_multiplier for p in m.field_parameters()})
    buckets: dict[tuple[bool, float], list] = {}
    for p in model.parameters():
        if p.requires_grad:
            buckets.setdefault((p.dim() >= 2, multiplier.get(id(p), 1.0)), []).append(p)
    return [
        {"params": ps, "weight_decay": weight_decay if decay else 0.0, "lr_multiplier": mult}
        for (decay, mult), ps in sorted(buckets.items(), key=lambda kv: (not kv[0][0], -kv[0][1]))
    ]


def build_optimizer(model: nn.Module, cfg) -> torch.optim.AdamW:
    """AdamW over ``parameter_groups(model, cfg.weight_decay)`` (per-group lr multipliers)."""
    return torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
