import math

import pytest
import torch
from models_testing import MIN_GAP, scored
from transformers import AutoConfig, AutoModelForCausalLM

from fpa.layers import FPAOptions
from fpa.models import FPACache, FPAConfig, FPAForCausalLM, count_parameters

TYPES = [
    ("fpa", "free"),
    ("fpa", "walk"),
    ("fox", "free"),
    ("softmax_rope", "free"),
    ("softmax_alibi", "free"),
    ("softmax_nope", "free"),
]


def tiny(att, mode, **kw):
    torch.manual_seed(0)
    c = FPAConfig(
        vocab_size=37,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        attention=att,
        fpa={"mode": mode, **kw.pop("fpa", {})},
        **kw,
    )
    return FPAForCausalLM(c).eval()


@pytest.mark.parametrize("att,mode", TYPES)
def test_causal_cache_generate(att, mode):
    m = tiny(att, mode, qk_norm=True)
    x = torch.randint(0, 37, (2, 10))
    with torch.no_grad():
        full = m(x).logits
        x2 = x.clone()
        x2[:, 7] = (x2[:, 7] + 1) % 37
        assert torch.allclose(m(x2).logits[:, :7], full[:, :7], atol=1e-5)
        assert not torch.allclose(m(x2).logits[:, 7:], full[:, 7:], atol=1e-5)
        cache = FPACache()
        parts = []
        for a, b in ((0, 4), (4, 5), (5, 6), (6, 10)):  # chunked prefill + single steps
            parts.append(m(x[:, a:b], past_key_values=cache, use_cache=True).logits)
        assert cache.get_seq_length() == 10
        assert torch.allclose(torch.cat(parts, 1), full, atol=1e-4)
        g, gap = scored(m, x[:, :5], max_new_tokens=4)  # cached greedy, and its smallest top-2 gap
        assert g.shape == (2, 9)
        ref, steps = x[:, :5], []
        for _ in range(4):  # greedy via full forwards
            steps.append(m(ref).logits[:, -1])
            ref = torch.cat([ref, steps[-1].argmax(-1, keepdim=True)], 1)
        # the two paths' logits at the tokens they chose: measured max |difference| 1.8e-7 over
        # the six types; tolerance 2e-6 (11x)
        out = m.generate(x[:, :5], max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True)
        torch.testing.assert_close(torch.stack(out.scores), torch.stack(steps), atol=2e-6, rtol=0)
        assert gap >= MIN_GAP, gap  # no near-tie (measured gaps >= 1.5e-3): equal tokens are a tolerance claim
        assert torch.equal(g, ref)


def test_cache_reexport_and_type_check():
    import fpa.cache

    assert FPACache is fpa.cache.FPACache
    m = tiny("fpa", "free")
    with pytest.raises(ValueError, match="FPACache"):
        m(torch.randint(0, 37, (1, 3)), past_key_values=[], use_cache=True)


@pytest.mark.parametrize("att,mode", TYPES)
def test_save_load(tmp_path, att, mode):
    m = tiny(
        att, mode, output_gate=True, **({"fpa": {"level_offset": "head"}} if (att, mode) == ("fpa", "walk") else {})
    )
    x = torch.randint(0, 37, (1, 6))
    m.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).attention == att
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(m2, FPAForCausalLM)
    with torch.no_grad():
        assert torch.equal(m(x).logits, m2(x).logits)
    assert m2.lm_head.weight.data_ptr() == m2.model.embed_tokens.weight.data_ptr()


def test_head_level_offset_init_reaches_the_layers_and_survives_save_load(tmp_path):
    m = tiny("fpa", "walk", fpa={"level_offset": "head", "level_offset_init": 1.0})
    assert all(b.attn.level_offset.tolist() == [1.0] * 4 for b in m.model.layers)  # not re-initialised
    with torch.no_grad():
        m.model.layers[0].attn.level_offset.fill_(0.25)  # a trained value, not the init, must load
    m.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).fpa.level_offset_init == 1.0
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert m2.model.layers[0].attn.level_offset.tolist() == [0.25] * 4
    with pytest.raises(ValueError, match="FPAOptions.level_offset_init must be a finite number"):
        FPAConfig(fpa={"level_offset_init": math.nan})


def test_save_load_keeps_a_token_level_offset(tmp_path):
    m = tiny("fpa", "walk", fpa={"level_offset": "token", "level_offset_bias_init": -1.0})
    assert all(b.attn.level_offset_kind == "token" for b in m.model.layers)
    assert m.model.layers[0].attn.level_offset_proj.bias.tolist() == [-1.0] * 4
    with torch.no_grad():  # offsets far from their initial values, so a re-initialised one shows
        for b in m.model.layers:
            b.attn.level_offset_proj.weight.normal_(0, 1.0)
            b.attn.increment_proj.weight.normal_(0, 1.0)
    x = torch.randint(0, 37, (2, 12))
    m.save_pretrained(tmp_path)
    c = AutoConfig.from_pretrained(tmp_path)
    assert (c.fpa.level_offset, c.fpa.level_offset_bias_init) == ("token", -1.0)
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(m(x).logits, m2(x).logits)
        for b in m2.model.layers:  # the offset is part of the computation
            b.attn.level_offset_proj.weight.zero_()
        assert not torch.allclose(m(x).logits, m2(x).logits, atol=1e-3)


def test_config_json_with_a_flat_fpa_key_is_refused_naming_the_nested_spelling(tmp_path):
    """FPA options live under "fpa" in config.json; a flat ``fpa_level_offset`` (an older
    spelling) fails on load with a did-you-mean, instead of loading another model."""
    import json

    tiny("fpa", "walk").save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    d = json.loads(path.read_text())
    assert d["fpa"] == FPAOptions().to_dict()
    path.write_text(json.dumps({**d, "fpa_level_offset": "head"}))
    with pytest.raises(ValueError, match=r"'fpa_level_offset' \(did you mean \{\"fpa\": \{\"level_offset\""):
        AutoModelForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(hidden_size=30, num_attention_heads=4), "hidden_size"),
        (dict(attention="linear"), "attention"),
        (dict(fpa={"mode": "bogus"}), "FPAOptions.mode"),
        (dict(fpa_mode="walk"), "fpa_mode"),
        (dict(vocab_size=-1), "vocab_size"),
        (dict(num_hidden_layers=0), "num_hidden_layers"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads"),
    ],
)
def test_bad_config(kw, field):
    with pytest.raises(ValueError, match=field):
        FPAConfig(**kw)


def test_presets():
    n = count_parameters(FPAConfig.from_preset("110m"))
    assert 100e6 <= n <= 130e6
    assert count_parameters(FPAConfig.from_preset("tiny")) < 5e6
    assert FPAConfig.from_preset("small", attention="fox").attention == "fox"
    with pytest.raises(ValueError, match="preset"):
        FPAConfig.from_preset("huge")
