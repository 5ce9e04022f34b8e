"""FPAModel / FPAForCausalLM; decoding state lives in fpa.cache.FPACache (re-exported here)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from fpa.cache import FPACache
from fpa.layers.attention import RMSNorm, TransformerBlock
from fpa.models.configuration_fpa import FPAConfig


class FPAPreTrainedModel(PreTrainedModel):
    config_class = FPAConfig
    base_model_prefix = "model"
    _no_split_modules = ["TransformerBlock"]

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, nn.Linear) and not getattr(module, "_fpa_custom_init", False):
            pass  # layers initialise themselves (nn.Linear default; field/gate heads custom)


class FPAModel(FPAPreTrainedModel):
    def __init__(self, config: FPAConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([
            TransformerBlock(config.hidden_size, config.intermediate_size, config.attention,
                             config.num_attention_heads, config.num_key_value_heads, config.rms_norm_eps,
                             **config.attention_kwargs())
            for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, past_key_values=None, use_cache=None, inputs_embeds=None, cache=None, **kwargs):
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, FPACache):
            raise ValueError(f"past_key_values / cache must be an fpa.cache.FPACache, got {type(cache).__name__}")
        if cache is None and use_cache:
            cache = FPACache()
        for i, layer in enumerate(self.layers):
            x = layer(x, None if cache is None else cache.layer(i))
        if cache is not None:
            cache.step_done()  # the eviction policy runs after every forward call
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x), cache=cache)


class FPAForCausalLM(FPAPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: FPAConfig):
        super().__init__(config)
        self.model = FPAModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, cache=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if isinstance(cache, FPACache) and cache.get_seq_length() > 0:
            input_ids = input_ids[:, cache.get_seq_length():]
        return {"input_ids": input_ids, "cache": cache, "use_cache": True}

    @staticmethod
    def per_token_loss(logits, labels, ignore_index: int = -100):
        """(B, T-1) cross-entropy of logits[:, t] against labels[:, t+1] (0 where ignored)."""
        lg, lb = logits[:, :-1].float(), labels[:, 1:]
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lb.reshape(-1), ignore_index=ignore_index,
                               reduction="none").view(lb.shape)

    def forward(self, input_ids=None, past_key_values=None, labels=None, use_cache=None,
                inputs_embeds=None, return_per_token_loss=False, cache=None, **kwargs):
        """``cache`` (transformers 5.x's name) and ``past_key_values`` are the same argument: an FPACache."""
        cache = cache if cache is not None else past_key_values
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=use_cache,
                         inputs_embeds=inputs_embeds)
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        result = CausalLMOutputWithPast(logits=logits, cache=out.cache)
        if labels is not None:
            tok = self.per_token_loss(logits, labels)
            n = (labels[:, 1:] != -100).sum().clamp(min=1)
            loss = tok.sum() / n
            result.loss = loss
            if return_per_token_loss:
                result["per_token_loss"] = tok
        return result
