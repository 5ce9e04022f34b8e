import re
from types import SimpleNamespace

import pytest
import torch

from fpa.compat import CACHE_ARG
from fpa.data import ByteTokenizer
from fpa.tasks.passkey import QUESTION


class OracleModel(torch.nn.Module):
    """A "model" given the answer: reads the pass key from the prompt it has seen (through its own
    cache object, fed in chunks like any model) and predicts " KEY." after the question."""

    def __init__(self, vocab_size: int = 257):
        super().__init__()
        self.vocab_size, self.tok = vocab_size, ByteTokenizer()
        self.device = torch.device("cpu")

    def _next(self, ids: list[int]) -> int:
        text = self.tok.decode(ids)
        m = re.search(r"The pass key is (\d+)\.", text)
        if m is None or QUESTION not in text:
            return ord(" ")
        answer = f" {m.group(1)}."
        done = text.rsplit(QUESTION, 1)[1]
        return ord(answer[len(done)]) if len(done) < len(answer) else ord(" ")

    def forward(self, input_ids, use_cache=True, **kw):
        """The cache comes and goes under the installed transformers' name (fpa.compat.CACHE_ARG),
        as with a real model."""
        cache = kw.get(CACHE_ARG)
        seen = input_ids if cache is None else torch.cat([cache["ids"], input_ids], 1)
        logits = torch.zeros(input_ids.shape + (self.vocab_size,))
        for b, row in enumerate(seen.tolist()):
            logits[b, -1, self._next(row)] = 1.0
        return SimpleNamespace(logits=logits, **{CACHE_ARG: {"ids": seen}})


@pytest.fixture
def oracle():
    return OracleModel()


@pytest.fixture
def tok():
    return ByteTokenizer()


def _tiny_model(attention="fpa", mode="free", seed=0, **overrides):
    from fpa.models import FPAConfig, FPAForCausalLM

    torch.manual_seed(seed)
    cfg = FPAConfig.from_preset(
        "tiny",
        vocab_size=257,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        attention=attention,
        fpa={"mode": mode, **overrides.pop("fpa", {})},
        **overrides,
    )
    return FPAForCausalLM(cfg).eval()


@pytest.fixture
def tiny_model():
    """tiny_model(attention="fpa", mode="free", seed=0, **config overrides): a small random
    FPAForCausalLM (byte vocab)."""
    return _tiny_model
