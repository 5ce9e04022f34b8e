"""Export a softmax-RoPE FPA model to transformers' own ``LlamaForCausalLM`` (same weights).

The softmax_rope baseline is a Llama architecture: pre-norm RMSNorm blocks, RoPE with the
half-split pairing (Llama's ``rotate_half``) and inverse frequencies theta^(-2i/d), SwiGLU MLP,
optional tied embeddings. The export copies the weights unchanged, so the logits agree to float
rounding (tested to 1e-5): an independent check of our RoPE baseline, and the route by which
Llama-only tools (kvpress) run on it unchanged.
"""

from __future__ import annotations

import torch


def llama_config(config):
    """A ``LlamaConfig`` equal to the FPAConfig of a softmax_rope model (ValueError otherwise)."""
    from transformers import LlamaConfig

    if config.attention != "softmax_rope":
        raise ValueError(f"only attention='softmax_rope' models are Llama models, got {config.attention!r}")
    if config.qk_norm or config.output_gate or config.key_shift:
        raise ValueError("qk_norm / output_gate / key_shift have no Llama counterpart: export needs all three False")
    head_dim = config.hidden_size // config.num_attention_heads
    if head_dim % 2:
        raise ValueError(f"Llama's RoPE needs an even head dimension, got {head_dim}")
    kw = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=head_dim,
        hidden_act="silu",
        rms_norm_eps=config.rms_norm_eps,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=config.tie_word_embeddings,
        max_position_embeddings=1 << 20,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        eos_token_id=getattr(config, "eos_token_id", None),
        pad_token_id=getattr(config, "pad_token_id", None),
    )
    return LlamaConfig(**kw)


def _state_dict_map(num_layers: int) -> dict[str, str]:
    """FPA parameter name -> Llama parameter name."""
    m = {
        "model.embed_tokens.weight": "model.embed_tokens.weight",
        "model.norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    for i in range(num_layers):
        a, b = f"model.layers.{i}.", f"model.layers.{i}."
        m[a + "attn_norm.weight"] = b + "input_layernorm.weight"
        m[a + "mlp_norm.weight"] = b + "post_attention_layernorm.weight"
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            m[f"{a}attn.{p}.weight"] = f"{b}self_attn.{p}.weight"
        for p in ("gate_proj", "up_proj", "down_proj"):
            m[f"{a}mlp.{p}.weight"] = f"{b}mlp.{p}.weight"
    return m


@torch.no_grad()
def to_llama(model):
    """``LlamaForCausalLM`` with the weights of ``model`` (an FPAForCausalLM, softmax_rope, or a
    saved folder of one), in eval mode, on the model's device and dtype."""
    from transformers import LlamaForCausalLM

    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        from fpa.models import FPAForCausalLM

        model = FPAForCausalLM.from_pretrained(model)
    cfg = llama_config(model.config)
    # transformers wraps Module.to with functools.wraps; the stub then wants self as the first argument
    llama = LlamaForCausalLM(cfg).to(device=model.device, dtype=model.dtype)  # type: ignore[call-arg]
    mapping = _state_dict_map(cfg.num_hidden_layers)
    src = model.state_dict()
    dst = llama.state_dict()
    missing = [k for k in src if k not in mapping]
    if missing:
        raise ValueError(f"parameters without a Llama counterpart: {missing[:5]}")
    for k, v in src.items():
        dst[mapping[k]].copy_(v)
    if cfg.tie_word_embeddings:
        llama.tie_weights()
    return llama.eval()
