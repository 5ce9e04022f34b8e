"""Hugging Face-compatible FPA language models.

Importing this package registers them with the transformers Auto classes: after
``import fpa.models``, ``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM.from_pretrained(folder)``
load a saved FPA model.
"""

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from fpa.cache import FPACache  # re-exported: the cache lives in fpa.cache
from fpa.models.configuration_fpa import PRESETS, FPAConfig
from fpa.models.modeling_fpa import FPAForCausalLM, FPAModel

AutoConfig.register("fpa", FPAConfig, exist_ok=True)
AutoModel.register(FPAConfig, FPAModel, exist_ok=True)
AutoModelForCausalLM.register(FPAConfig, FPAForCausalLM, exist_ok=True)


def count_parameters(config: FPAConfig) -> int:
    """Parameter count without allocating (meta device); tied embeddings counted once."""
    with torch.device("meta"):
        m = FPAForCausalLM(config)
    return sum(p.numel() for p in m.parameters())


__all__ = ["PRESETS", "FPACache", "FPAConfig", "FPAForCausalLM", "FPAModel", "count_parameters"]
