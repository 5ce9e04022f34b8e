"""FPAModel / FPAForCausalLM: Hugging Face models; decoding state lives in fpa.cache.FPACache.

Behaves like a transformers causal LM: ``attention_mask`` (left or right padding) and
``position_ids`` are honoured in forward and generate for every attention type (for FPA and FoX a
padding position is no key, moves no walk and adds no decay), ``output_attentions`` returns the
attention probabilities (FPA penalties included), ``output_hidden_states`` the hidden states,
gradient checkpointing works, and the cache is a transformers ``Cache`` (FPACache).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from fpa.cache import FPACache
from fpa.compat import CACHE_ARG, output_cache
from fpa.layers.attention import RMSNorm, TransformerBlock
from fpa.models.configuration_fpa import FPAConfig

__all__ = ["FPAForCausalLM", "FPAModel", "cache_signature"]

# What a cache remembers of the model that filled it (FPACache.bind).
_SIGNATURE_FIELDS = (
    "attention",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "qk_norm",
    "key_shift",
    "vocab_size",
)


def cache_signature(config) -> dict:
    """What a cache remembers of the model that filled it: the fields above, and for FPA the mode
    and the level offset."""
    sig = {k: getattr(config, k, None) for k in _SIGNATURE_FIELDS}
    fpa = getattr(config, "fpa", None)
    if sig["attention"] == "fpa" and fpa is not None:
        sig.update(fpa_mode=fpa.mode, fpa_level_offset=fpa.level_offset)
    return sig


class FPAPreTrainedModel(PreTrainedModel):
    """Base of the FPA models: the config class, weight initialisation and gradient checkpointing."""

    config_class = FPAConfig
    base_model_prefix = "model"
    _no_split_modules = ["TransformerBlock"]
    supports_gradient_checkpointing = True

    def _init_weights(self, module):
        # the embedding here; every other module initialises itself (nn.Linear's default, the
        # FPA and FoX scalar heads their own)
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.initializer_range)


def _resolve_cache(cache, use_cache: bool | None) -> FPACache | None:
    """The FPACache to use: the one given, a new one for an empty transformers Cache (e.g. the
    DynamicCache a pipeline creates), a new one if use_cache and none given."""
    if cache is None:
        return FPACache() if use_cache else None
    if isinstance(cache, FPACache):
        return cache
    if isinstance(cache, Cache) and cache.get_seq_length() == 0:
        return FPACache()
    raise ValueError(
        f"past_key_values / cache must be an fpa.cache.FPACache (or an empty transformers Cache), "
        f"got {type(cache).__name__}"
    )


class FPAModel(FPAPreTrainedModel):
    """The decoder: token embeddings, ``num_hidden_layers`` transformer blocks of the configured
    attention type, a final RMSNorm. Returns hidden states (no LM head)."""

    def __init__(self, config: FPAConfig):
        super().__init__(config)
        self.embed_tokens: nn.Module = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [
                TransformerBlock(
                    config.hidden_size,
                    config.intermediate_size,
                    config.attention,
                    config.num_attention_heads,
                    config.num_key_value_heads,
                    config.rms_norm_eps,
                    **config.attention_kwargs(),
                )
                for _ in range(config.num_hidden_layers)
            ]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding."""
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        """Replace the token embedding."""
        self.embed_tokens = value

    # Validate the token ids' values on every call, not only on a sequence's first one (a debug
    # switch: on an accelerator, each check is a host sync).
    check_ids_every_call = False

    def _check_input_ids(self, input_ids: Tensor) -> None:
        """Shape and dtype of input_ids (no host sync)."""
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}"
                + (" (use input_ids[None] for one sequence)" if input_ids.dim() == 1 else "")
            )
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")

    def _check_id_values(self, input_ids: Tensor, continuing: bool) -> None:
        """ValueError unless every id lies in [0, vocab_size). The check reads the values, a host
        sync on an accelerator, so it runs on a sequence's first call (no cache, or an empty one:
        training, prefill) and on the CPU; decode steps on an accelerator (``continuing``: the
        cache holds tokens) skip it unless ``check_ids_every_call``."""
        if torch.compiler.is_compiling() or not input_ids.numel():  # a host sync would break the graph
            return
        if continuing and input_ids.device.type != "cpu" and not self.check_ids_every_call:
            return
        lo, hi = torch.stack(list(torch.aminmax(input_ids))).tolist()  # one host sync for both
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(
                f"input_ids must lie in [0, vocab_size={self.config.vocab_size}), got values in [{lo}, {hi}]"
            )

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        past_key_values=None,
        inputs_embeds: Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        cache=None,
        return_dict: bool | None = None,
        **kwargs,
    ):
        """input_ids (B, T) or inputs_embeds (B, T, hidden); attention_mask (B, T) or (B, past + T)
        (1 = token, 0 = padding); position_ids (B, T). ``cache`` and ``past_key_values`` are the
        same argument: an FPACache. Returns last_hidden_state (B, T, hidden), the cache,
        hidden_states (layers + 1 tensors) and attentions (one (B, Hq, T, Tk) per layer) on request."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            self._check_input_ids(input_ids)
        cache = cache if cache is not None else past_key_values
        if self.gradient_checkpointing and self.training:
            use_cache, cache = False, None  # recomputation and a growing cache do not mix
        cache = _resolve_cache(cache, use_cache)
        if cache is not None:
            cache.bind(cache_signature(self.config))
        past = 0 if cache is None else cache.get_seq_length()
        if input_ids is not None:
            self._check_id_values(input_ids, continuing=past > 0)
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = x.shape[:2]
        mask = _new_token_mask(attention_mask, B, T, past, x.device)
        pos = None
        if position_ids is not None:
            pos = position_ids.to(x.device).long().expand(B, T)
        elif mask is not None and cache is None:
            pos = torch.cumsum(mask.long(), -1) - mask.long()
        want_attn = bool(output_attentions if output_attentions is not None else self.config.output_attentions)
        want_hidden = bool(
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        hidden, attentions = [], []
        for i, layer in enumerate(self.layers):
            if want_hidden:
                hidden.append(x)
            state = None if cache is None else cache.layer(i)
            if self.gradient_checkpointing and self.training:
                out = self._gradient_checkpointing_func(layer.__call__, x, state, mask, pos, want_attn)
            else:
                out = layer(x, state, mask, pos, want_attn)
            if want_attn:
                x, w = out
                attentions.append(w)
            else:
                x = out
        if cache is not None:
            cache.step_done()  # the eviction policy runs after every forward call
        x = self.norm(x)
        if want_hidden:
            hidden.append(x)
        return BaseModelOutputWithPast(
            last_hidden_state=x,
            **{CACHE_ARG: cache},
            hidden_states=tuple(hidden) if want_hidden else None,
            attentions=tuple(attentions) if want_attn else None,
        )


def _new_token_mask(attention_mask: Tensor | None, B: int, T: int, past: int, device) -> Tensor | None:
    """(B, T) bool mask of the T new tokens from a (B, T) or (B, past + T) mask, or None: no mask,
    or an all-ones mask on a sequence's first call (past == 0), where the layers' unmasked path is
    the faster one. Only that first call reads the mask's values (a host sync on an accelerator);
    a continuation call (decode step, later prefill chunk: the layers take the cached path, where
    a mask costs a few element-wise ops) keeps the mask as given, so decoding never syncs here."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape[0] != B or attention_mask.shape[1] not in (T, past + T):
        raise ValueError(
            f"attention_mask must have shape (batch, seq_len) = ({B}, {T}) or (batch, cached + new) = "
            f"({B}, {past + T}), got {tuple(attention_mask.shape)} (4-D masks are not supported)"
        )
    mask = attention_mask[:, -T:].to(device=device).bool()
    if past > 0:
        return mask
    return None if bool(mask.all()) else mask


class FPAForCausalLM(FPAPreTrainedModel, GenerationMixin):
    """FPAModel with a language-model head (tied to the embedding by default): logits, the
    next-token loss, and transformers' ``generate`` with an FPACache."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: FPAConfig):
        super().__init__(config)
        self.model = FPAModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding."""
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        """Replace the token embedding."""
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        """The language-model head."""
        return self.lm_head

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # never a DynamicCache: generate below starts an FPACache

    def generate(self, *args, **kwargs):
        """transformers' generate, starting an ``FPACache()`` (no eviction) unless a cache is given
        (as ``past_key_values=`` / ``cache=``) or ``use_cache=False``: assisted decoding,
        prompt lookup and chunked prefill need the cache from the start."""
        cfg = kwargs.get("generation_config")
        use = kwargs.get("use_cache", getattr(cfg, "use_cache", True))
        managed = getattr(cfg, "cache_implementation", None) is not None  # e.g. an assistant's (5.2)
        if use is not False and not managed and kwargs.get("past_key_values") is None and kwargs.get("cache") is None:
            kwargs[CACHE_ARG] = FPACache()
        return super().generate(*args, **kwargs)

    def prepare_inputs_for_generation(
        self,
        input_ids,
        past_key_values=None,
        attention_mask=None,
        inputs_embeds=None,
        position_ids=None,
        use_cache=True,
        cache=None,
        next_sequence_length: int | None = None,
        **kwargs,
    ):
        """Feed the tokens the cache has not seen, with their mask and positions.

        The count of new tokens is ``next_sequence_length`` if generate gives it, else the mask's
        length (cached + new) minus the cached tokens; generate's chunked prefill
        (``prefill_chunk_size``) passes each chunk as ``input_ids`` with the mask up to its end."""
        cache = cache if cache is not None else past_key_values
        seen = cache.get_seq_length() if isinstance(cache, Cache) else 0
        if next_sequence_length is not None:
            new = next_sequence_length
        elif attention_mask is not None:
            new = attention_mask.shape[1] - seen
        else:
            new = input_ids.shape[1] - seen if input_ids.shape[1] > seen else input_ids.shape[1]
        inputs = {CACHE_ARG: cache, "use_cache": use_cache, "attention_mask": attention_mask}
        if inputs_embeds is not None and seen == 0:
            inputs["inputs_embeds"] = inputs_embeds[:, -new:]
        else:
            inputs["input_ids"] = input_ids[:, -new:]
        total = attention_mask.shape[1] if attention_mask is not None else seen + new
        if position_ids is not None and position_ids.shape[-1] in (new, total):
            # (transformers 5.2's chunked prefill passes the whole prompt's positions with every
            # chunk: those are dropped, and the positions follow from the mask and the cache)
            inputs["position_ids"] = position_ids[..., -new:]
        for key in ("output_attentions", "output_hidden_states"):
            if key in kwargs:
                inputs[key] = kwargs[key]
        return inputs

    @staticmethod
    def per_token_loss(logits, labels, ignore_index: int = -100):
        """(B, T-1) cross-entropy of logits[:, t] against labels[:, t+1] (0 where ignored)."""
        lg, lb = logits[:, :-1].float(), labels[:, 1:]
        return F.cross_entropy(
            lg.reshape(-1, lg.shape[-1]), lb.reshape(-1), ignore_index=ignore_index, reduction="none"
        ).view(lb.shape)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        labels=None,
        use_cache=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        return_per_token_loss=False,
        cache=None,
        return_dict=None,
        logits_to_keep: int = 0,
        **kwargs,
    ):
        """Logits (B, T, vocab) (the last ``logits_to_keep`` positions if > 0) and, with ``labels``
        (B, T), the mean next-token loss (-100 ignored; padding is not masked by itself: set its
        labels to -100). ``cache`` and ``past_key_values`` are the same argument: an FPACache."""
        cache = cache if cache is not None else past_key_values
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        h = out.last_hidden_state
        logits = self.lm_head(h[:, -logits_to_keep:] if logits_to_keep else h)
        result = CausalLMOutputWithPast(
            logits=logits, **{CACHE_ARG: output_cache(out)}, hidden_states=out.hidden_states, attentions=out.attentions
        )
        if labels is not None:
            tok = self.per_token_loss(logits, labels)
            n = (labels[:, 1:] != -100).sum().clamp(min=1)
            result.loss = tok.sum() / n
            if return_per_token_loss:
                result["per_token_loss"] = tok
        return result
