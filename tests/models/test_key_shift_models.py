"""Models with a key shift (FPAConfig key_shift=True): the cache carries each row's last key, so
padded rows, chunked prefill, cropping (prompt lookup, assisted decoding) and beam search compute
what the plain forward pass computes; the setting round-trips config.json."""

import pytest
import torch
from models_testing import MIN_GAP, scored
from test_hf_padding import ATOL, forgetful, padded, prefill_in_chunks, prompts

from fpa.cache import FPACache, FPAEviction
from fpa.compat import CACHE_ARG
from fpa.models import FPAConfig, FPAForCausalLM

TYPES = [("fpa", "walk"), ("fpa", "free"), ("fox", "free"), ("softmax_rope", "free")]


def shifted(att, mode, seed=0):
    """``forgetful`` with a key shift whose gates spread over (0, 1)."""
    m = forgetful(att, mode, seed=seed, key_shift=True)
    with torch.no_grad():
        for block in m.model.layers:
            block.attn.key_shift_proj.weight.normal_(0, 0.5)
    return m


@pytest.mark.parametrize("att,mode", TYPES)
def test_padded_prefill_in_chunks_equals_each_row_alone(att, mode):
    m = shifted(att, mode)
    rows = prompts(lengths=(8, 3))
    ids, mask = padded(rows, "left")
    got = prefill_in_chunks(m, ids, mask, FPACache())
    with torch.no_grad():
        for b, r in enumerate(rows):
            torch.testing.assert_close(got[b, 8 - len(r) :], m(r[None]).logits[0], atol=ATOL, rtol=0)
        right, rmask = padded(rows, "right")
        out = m(right, attention_mask=rmask).logits
        for b, r in enumerate(rows):
            torch.testing.assert_close(out[b, : len(r)], m(r[None]).logits[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("att,mode", TYPES)
def test_batched_generate_with_and_without_eviction(att, mode):
    m = shifted(att, mode)
    rows = prompts(lengths=(9, 4))
    ids, mask = padded(rows, "left")
    for policy in (None, FPAEviction(1.0)) if att == "fpa" else (None,):
        kw = {} if policy is None else {CACHE_ARG: FPACache(FPAEviction(1.0))}
        out = m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, **kw)
        for b, r in enumerate(rows):
            alone, gap = scored(m, r[None], None if policy is None else FPACache(FPAEviction(1.0)), max_new_tokens=5)
            assert gap >= MIN_GAP, (policy, b, gap)  # no near-tie: equal tokens are a tolerance claim
            assert torch.equal(out[b, -5:], alone[0, -5:]), (policy, b)


@pytest.mark.parametrize("att,mode", [("fpa", "walk"), ("softmax_rope", "free")])
def test_crop_rebuilds_the_carry(att, mode):
    m = shifted(att, mode)
    x = prompts(lengths=(10,))[0][None]
    a, b = FPACache(), FPACache()
    nxt = torch.tensor([[3, 4]])
    with torch.no_grad():
        m(x[:, :6], past_key_values=a, use_cache=True)
        m(x, past_key_values=b, use_cache=True)
        b.crop(6)
        # measured max |difference| <= 1.5e-7 for the unshifted models (tests/models/test_hf_features.py)
        want = m(nxt, past_key_values=a, use_cache=True).logits
        torch.testing.assert_close(m(nxt, past_key_values=b, use_cache=True).logits, want, atol=1.5e-6, rtol=0)
        c = FPACache()
        m(x, past_key_values=c, use_cache=True)
        stale = [layer.key_carry for layer in c.layer_caches]  # token 9's key, not token 5's
        c.crop(6)
        for layer, carry in zip(c.layer_caches, stale):  # a crop that did not rebuild the carry is caught
            layer.key_carry = carry
        assert (m(nxt, past_key_values=c, use_cache=True).logits - want).abs().max() > 1e-3


@pytest.mark.parametrize("att,mode", [("fpa", "walk"), ("fox", "free")])
def test_prompt_lookup_and_beam_search_equal_the_plain_paths(att, mode):
    m = shifted(att, mode)
    rows = prompts(seed=5, lengths=(12,))
    ids = torch.cat([rows[0], rows[0][:6]])[None]
    kw = dict(max_new_tokens=8, eos_token_id=36)
    ref, gap = scored(m, ids, **kw)
    assert gap >= MIN_GAP, gap
    got = m.generate(ids, do_sample=False, prompt_lookup_num_tokens=3, **{CACHE_ARG: FPACache()}, **kw)
    # transformers 5.2's prompt lookup can return tokens past max_new_tokens when the last draft is
    # accepted (huggingface/transformers#47195; here 9 for fox, with or without an FPACache; 5.24
    # returns 8): the tokens up to the limit are the claim
    assert got.shape[1] >= ref.shape[1] and torch.equal(got[:, : ref.shape[1]], ref)
    beams = dict(num_beams=3, max_new_tokens=4, output_scores=True, return_dict_in_generate=True)
    x = prompts(seed=2, lengths=(7,))[0][None]
    a, b = m.generate(x, **beams), m.generate(x, use_cache=False, **beams)
    for sa, sb in zip(a.scores, b.scores):  # measured max 4.8e-7 unshifted; 10x margin
        torch.testing.assert_close(sa, sb, atol=5e-6, rtol=0)


def test_key_shift_round_trips_and_the_cache_knows_it(tmp_path):
    m = shifted("fpa", "walk")
    m.save_pretrained(tmp_path)
    back = FPAForCausalLM.from_pretrained(tmp_path)
    assert back.config.key_shift is True
    x = prompts(lengths=(6,))[0][None]
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, m(x).logits, atol=0, rtol=0)
    assert FPAConfig().key_shift is False
    cache = FPACache()
    with torch.no_grad():
        m(x, past_key_values=cache, use_cache=True)
        plain = forgetful("fpa", "walk")
        with pytest.raises(ValueError):
            plain(x, past_key_values=cache, use_cache=True)


@pytest.mark.parametrize("key_shift", [False, True])
@pytest.mark.parametrize("att,mode", [("fpa", "walk"), ("fox", "free"), ("softmax_rope", "free")])
def test_crop_to_nothing_is_a_new_cache(att, mode, key_shift):
    m = shifted(att, mode) if key_shift else forgetful(att, mode)
    x = prompts(lengths=(10,))[0][None]
    c = FPACache()
    with torch.no_grad():
        m(x, past_key_values=c, use_cache=True)
        c.crop(-10)
        assert c.get_seq_length() == 0
        got = m(x[:, :3], past_key_values=c, use_cache=True).logits
        torch.testing.assert_close(got, m(x[:, :3]).logits, atol=ATOL, rtol=0)


def test_gate_bias_init_reaches_every_layer_and_round_trips():
    cfg = FPAConfig.from_preset("tiny", num_hidden_layers=2, key_shift=True, key_shift_bias_init=1.5)
    m = FPAForCausalLM(cfg)
    for block in m.model.layers:
        assert torch.equal(block.attn.key_shift_proj.bias, torch.full_like(block.attn.key_shift_proj.bias, 1.5))
    assert FPAConfig.from_dict(cfg.to_dict()).key_shift_bias_init == 1.5
    assert FPAConfig().key_shift_bias_init == 0.0
    with pytest.raises(ValueError, match="key_shift_bias_init=1.5 needs key_shift=True"):
        FPAConfig(key_shift_bias_init=1.5)
    with pytest.raises(ValueError, match="key_shift_bias_init"):
        FPAConfig(key_shift=True, key_shift_bias_init="open")
