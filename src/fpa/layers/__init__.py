"""Attention layers and the shared transformer block; ``FPAOptions``, the options of FPA."""

from fpa.layers.attention import (
    ATTENTION_TYPES,
    AttentionBase,
    FirstPassageAttention,
    ForgettingAttention,
    RMSNorm,
    SoftmaxAttention,
    SwiGLU,
    TransformerBlock,
    make_attention,
)
from fpa.layers.options import BETA_ACTIVATIONS, FPA_MODES, LEVEL_OFFSETS, WALK_INCREMENTS, FPAOptions

__all__ = [
    "ATTENTION_TYPES",
    "BETA_ACTIVATIONS",
    "FPA_MODES",
    "LEVEL_OFFSETS",
    "WALK_INCREMENTS",
    "AttentionBase",
    "FPAOptions",
    "FirstPassageAttention",
    "ForgettingAttention",
    "RMSNorm",
    "SoftmaxAttention",
    "SwiGLU",
    "TransformerBlock",
    "make_attention",
]
