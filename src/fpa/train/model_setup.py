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


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (>= 2-D parameters) only, not on norms, biases or scalars."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
