"""FPAConfig: a decoder-only language model config with a switchable attention type."""

from __future__ import annotations

from transformers import PretrainedConfig

from fpa.layers.attention import ATTENTION_TYPES, FPA_MODES

PRESETS = {
    "tiny": dict(vocab_size=1024, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=4, intermediate_size=352),
    "small": dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=8, intermediate_size=1408),
    "110m": dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=12, intermediate_size=2048),
}


class FPAConfig(PretrainedConfig):
    model_type = "fpa"

    def __init__(self, vocab_size=1024, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=None, intermediate_size=352, attention="fpa", fpa_mode="free",
                 qk_norm=False, output_gate=False, fpa_level_offset=False, fpa_beta_init=0.0,
                 fpa_field_lr_multiplier=0.1,
                 fox_fgate_bias_init=5.0, rope_theta=10000.0, rms_norm_eps=1e-6, initializer_range=0.02,
                 tie_word_embeddings=True, **kwargs):
        if num_key_value_heads is None:
            num_key_value_heads = num_attention_heads
        for name, val in (("vocab_size", vocab_size), ("hidden_size", hidden_size),
                          ("num_hidden_layers", num_hidden_layers), ("num_attention_heads", num_attention_heads),
                          ("num_key_value_heads", num_key_value_heads), ("intermediate_size", intermediate_size)):
            if not isinstance(val, int) or val <= 0:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})")
        if num_attention_heads % num_key_value_heads:
            raise ValueError(f"num_attention_heads ({num_attention_heads}) must be a multiple of num_key_value_heads ({num_key_value_heads})")
        if attention not in ATTENTION_TYPES:
            raise ValueError(f"attention must be one of {ATTENTION_TYPES}, got {attention!r}")
        if fpa_mode not in FPA_MODES:
            raise ValueError(f"fpa_mode must be one of {FPA_MODES}, got {fpa_mode!r}")
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        self.num_attention_heads, self.num_key_value_heads = num_attention_heads, num_key_value_heads
        self.intermediate_size, self.attention, self.fpa_mode = intermediate_size, attention, fpa_mode
        self.qk_norm, self.output_gate, self.fpa_level_offset = qk_norm, output_gate, fpa_level_offset
        self.fpa_beta_init, self.fox_fgate_bias_init, self.rope_theta = fpa_beta_init, fox_fgate_bias_init, rope_theta
        self.fpa_field_lr_multiplier = fpa_field_lr_multiplier
        self.rms_norm_eps, self.initializer_range = rms_norm_eps, initializer_range
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "FPAConfig":
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})

    def attention_kwargs(self) -> dict:
        kw = dict(qk_norm=self.qk_norm, output_gate=self.output_gate)
        if self.attention == "fpa":
            kw.update(fpa_mode=self.fpa_mode, level_offset=self.fpa_level_offset, beta_init=self.fpa_beta_init,
                      field_lr_multiplier=self.fpa_field_lr_multiplier)
        elif self.attention == "fox":
            kw.update(fgate_bias_init=self.fox_fgate_bias_init)
        elif self.attention.startswith("softmax"):
            kw.update(rope_theta=self.rope_theta)
        return kw
