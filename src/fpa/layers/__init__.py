"""Attention layers and the shared transformer block."""

from fpa.layers.attention import (
    ATTENTION_TYPES,
    FPA_CONFIG_FIELDS,
    FPA_MODES,
    LEVEL_OFFSETS,
    AttentionBase,
    FirstPassageAttention,
    ForgettingAttention,
    RMSNorm,
    SoftmaxAttention,
    SwiGLU,
    TransformerBlock,
    config_layer_kwargs,
    make_attention,
)

__all__ = [
    "ATTENTION_TYPES",
    "FPA_CONFIG_FIELDS",
    "FPA_MODES",
    "LEVEL_OFFSETS",
    "AttentionBase",
    "FirstPassageAttention",
    "ForgettingAttention",
    "RMSNorm",
    "SoftmaxAttention",
    "SwiGLU",
    "TransformerBlock",
    "config_layer_kwargs",
    "make_attention",
]
