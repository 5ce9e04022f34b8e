"""The diagnosis inspects a rule-trained model as served: the keys its rule hid from the last query
carry no attention mass (fpa.experiments.lm.diagnosis._head_stats against the dense reference mask)."""

from types import SimpleNamespace

import numpy as np
import torch

from fpa.eval.example import _capture_inputs, fpa_head_maps
from fpa.experiments.lm.diagnosis import _head_stats
from fpa.layers.fpa_form import evicting_bias
from fpa.models import FPAConfig, FPAForCausalLM
from fpa.train.model_setup import set_training_eviction


def test_needle_mass_under_the_rule_is_the_masked_renormalised_attention():
    torch.manual_seed(0)
    model = FPAForCausalLM(
        FPAConfig.from_preset("tiny", num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=2)
    ).eval()
    for block in model.model.layers:
        with torch.no_grad():
            block.attn.increment_proj.weight.normal_(0.0, 0.5)  # a walk that dips, so the rule hides keys
        block.attn.set_beta_(2.0)
    ids = np.random.default_rng(0).integers(0, 256, 48)
    prompt = SimpleNamespace(ids=ids, needle_start=2, needle_len=6)
    plain = _head_stats(model, prompt)["mass"]
    set_training_eviction(model, 0.5)
    got = _head_stats(model, prompt)["mass"]
    with torch.no_grad():
        attn, x = model.model.layers[0].attn, _capture_inputs(model, torch.from_numpy(ids)[None])[0]
        field, level, w = fpa_head_maps(attn, x)
        hidden = torch.isinf(evicting_bias(field[None], level[None], attn.beta.float(), 0.5, 1))[0, :, -1]
    assert hidden[:, 2:8].any(), "the rule must hide part of the needle here"
    ref = w.masked_fill(hidden, 0.0)
    ref = (ref / ref.sum(-1, keepdim=True))[:, 2:8].sum(-1)
    np.testing.assert_allclose(got[0], ref.numpy(), rtol=1e-5, atol=1e-7)
    assert not np.allclose(got, plain)
