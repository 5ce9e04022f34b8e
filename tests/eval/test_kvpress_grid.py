"""kvpress presses as passkey baselines (runs where kvpress is installed: the low-transformers CI env)."""

import importlib.util

import numpy as np
import pytest
import torch
from test_passkey_eval import decode_logits, top2_gap

from fpa.data.tokenizer import ByteTokenizer
from fpa.eval.kvpress_grid import KvpressUnavailable, kvpress_passkey_grid
from fpa.eval.passkey import cell_prompts, passkey_grid
from fpa.models import FPAConfig, FPAForCausalLM
from fpa.tasks.passkey import max_answer_tokens

HAVE_KVPRESS = importlib.util.find_spec("kvpress") is not None

# The Llama export's logits differ from the FPA model's by <= 1.7e-7 on rope_model's prompts below
# (measured, decoding as fpa.eval.kvpress_grid does, without a press) and by < 5e-5 on the larger
# weights of tests/models/test_export_llama. Greedy tokens are equal on both where the FPA model's
# best logit leads the second-best by more than twice that bound at every step.
EXPORT_ATOL = 5e-5


def rope_model():
    torch.manual_seed(0)
    c = FPAConfig(
        vocab_size=257,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=48,
        attention="softmax_rope",
    )
    return FPAForCausalLM(c).eval()


@pytest.mark.skipif(HAVE_KVPRESS, reason="kvpress installed: the grid runs (next test)")
def test_clear_error_without_kvpress():
    with pytest.raises(KvpressUnavailable, match=r"kvpress.*pip install -e '.\[kvpress\]'"):
        kvpress_passkey_grid(rope_model(), ByteTokenizer(), [256], [0.5], 1, [0.5])


@pytest.mark.skipif(not HAVE_KVPRESS, reason="needs the kvpress extra (transformers < 5.3)")
def test_three_presses_run_through_kvpress():
    tok, m = ByteTokenizer(), rope_model()
    g = kvpress_passkey_grid(m, tok, [256], [0.25, 0.75], 2, [0.0, 0.5], presses=("knorm", "snapkv", "streaming_llm"))
    assert [(x["press"], x["compression_ratio"]) for x in g["grids"]] == [
        (p, r) for p in ("knorm", "snapkv", "streaming_llm") for r in (0.0, 0.5)
    ]
    for x in g["grids"]:
        assert len(x["accuracy"]) == 1 and len(x["accuracy"][0]) == 2
        target = 1.0 - x["compression_ratio"]
        assert abs(x["kept_fraction_mean"] - target) < 0.01, x["kept_fraction_mean"]
    # compression 0: the exported Llama decodes what the FPA model decodes (same prompts), a
    # tolerance claim: no step of the FPA model's decoding of these prompts is a near-tie
    ref = passkey_grid(m, tok, [256], [0.25, 0.75], 2, progress=False)
    for j, depth in enumerate((0.25, 0.75)):
        ids = torch.from_numpy(np.stack([p.ids for p in cell_prompts(tok, 256, depth, j, 2, 0)]))
        _, logits = decode_logits(m, ids, max_answer_tokens(tok))
        assert top2_gap(logits).min() > 2 * EXPORT_ATOL  # measured smallest gap 8.0e-3
    for x in g["grids"]:
        if x["compression_ratio"] == 0.0:
            assert x["examples"][0]["generated"] == ref["examples"][0]["generated"]
            assert x["correct"] == ref["correct"]


def test_clear_error_on_a_transformers_kvpress_cannot_hook(monkeypatch):
    """Where transformers renamed the cache kwarg (>= 5.3), an importable kvpress still cannot run."""
    import sys
    import types

    from fpa.compat import CACHE_ARG

    if CACHE_ARG == "past_key_values":
        pytest.skip("transformers < 5.3: kvpress can hook")
    monkeypatch.setitem(sys.modules, "kvpress", types.ModuleType("kvpress"))
    with pytest.raises(KvpressUnavailable, match="renamed 'cache'"):
        kvpress_passkey_grid(rope_model(), ByteTokenizer(), [256], [0.5], 1, [0.5])
