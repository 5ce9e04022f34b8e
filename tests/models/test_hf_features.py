"""transformers features: generate with an FPACache (no warnings), assisted and prompt-lookup
decoding, beam search, the generate helper, gradient checkpointing, output_attentions /
output_hidden_states, input checks, a cache bound to its model, Auto registration on import fpa."""

import logging
import subprocess
import sys
import warnings

import pytest
import torch
from models_testing import MIN_GAP, scored
from test_hf_padding import TYPES, forgetful, padded, prompts
from transformers import DynamicCache

from fpa.cache import TOVA, FoXEviction, FPACache, FPAEviction, SlidingWindow, StreamingLLM, generate
from fpa.compat import CACHE_ARG


def _gen(m, ids, cache=None, **kw):
    extra = {} if cache is None else {CACHE_ARG: cache}
    return m.generate(ids, do_sample=False, **extra, **kw)


def test_generate_with_fpacache_no_warnings(caplog):
    m = forgetful("fpa", "walk")
    ids = prompts(lengths=(6,))[0][None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.WARNING):
            out = _gen(m, ids, FPACache(FPAEviction(1.0)), max_new_tokens=4, attention_mask=torch.ones_like(ids))
            generate(m, ids, FPACache(), max_new_tokens=3, chunk_size=2)
    assert out.shape == (1, 10)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("att,mode", TYPES)
def test_prompt_lookup_and_assisted_equal_greedy(att, mode):
    """Both crop the cache after rejected draft tokens: FPA/FoX rebuild their running minima."""
    m = forgetful(att, mode)
    rows = prompts(seed=5, lengths=(12,))
    ids = torch.cat([rows[0], rows[0][:6]])[None]  # repeats give prompt lookup something to propose
    kw = dict(max_new_tokens=8, eos_token_id=36)  # transformers 5.2's prompt lookup needs an eos id
    ref, gap = scored(m, ids, **kw)
    assert gap >= MIN_GAP, gap  # no near-tie (measured gaps >= 9.7e-4): equal tokens are a tolerance claim
    assert torch.equal(_gen(m, ids, FPACache(), prompt_lookup_num_tokens=3, **kw), ref)
    assistant = forgetful(att, mode, seed=7)  # a different model: its drafts are often rejected
    assert torch.equal(_gen(m, ids, assistant_model=assistant, **kw), ref)


def test_crop_restores_the_state_exactly():  # name kept (docs/design.md cites it); a tolerance now, see below
    m = forgetful("fpa", "free")
    x = prompts(lengths=(10,))[0][None]
    a, b = FPACache(), FPACache()
    with torch.no_grad():
        m(x[:, :6], past_key_values=a, use_cache=True)
        m(x, past_key_values=b, use_cache=True)
        b.crop(6)
        assert b.get_seq_length() == 6
        nxt = torch.tensor([[3, 4]])
        # Not bit for bit: the cropped cache and the fresh one went through different float32 sums
        # (0 with one thread; with two, measured max 6e-8 for this model, 1.5e-7 over the six model
        # types, logits ~0.3). atol 1.5e-6: 10x margin; a wrong running minimum moves them by > 1e-3.
        torch.testing.assert_close(
            m(nxt, past_key_values=b, use_cache=True).logits,
            m(nxt, past_key_values=a, use_cache=True).logits,
            atol=1.5e-6,
            rtol=0,
        )
    with pytest.raises(ValueError, match="policy"):
        c = FPACache(FPAEviction(1.0))
        with torch.no_grad():
            m(x, past_key_values=c, use_cache=True)
        c.crop(-2)


def _beam_gap(scores, batch: int, beams: int) -> float:
    """Smallest gap, over the steps of a beam search without eos, between the last candidate kept and
    the first dropped (at the beams-th and at the 2 * beams-th place, where transformers cuts):
    ``scores`` are the per-step log-probabilities (batch * beams, vocab) of output_scores."""
    running = torch.full((batch, beams), -1e9, dtype=torch.float64)
    running[:, 0] = 0.0  # the first step expands one beam
    gap = float("inf")
    for s in scores:
        top = (running[:, :, None] + s.double().view(batch, beams, -1)).view(batch, -1).topk(2 * beams + 1).values
        gap = min(
            gap,
            (top[:, beams - 1] - top[:, beams]).min().item(),
            (top[:, 2 * beams - 1] - top[:, 2 * beams]).min().item(),
        )
        running = top[:, :beams]
    return gap


@pytest.mark.parametrize("att", ["fpa", "softmax_alibi"])
def test_beam_search_with_cache_equals_without(att):
    m = forgetful(att, "walk")
    assert m.generation_config.eos_token_id is None  # _beam_gap assumes no beam finishes early
    rows = prompts(seed=2, lengths=(7, 4))
    ids, mask = padded(rows, "left")
    kw = dict(
        num_beams=3,
        max_new_tokens=5,
        attention_mask=mask,
        num_return_sequences=2,
        output_scores=True,
        return_dict_in_generate=True,
    )
    a, b = _gen(m, ids, **kw), _gen(m, ids, use_cache=False, **kw)
    # The two paths' log-probabilities: measured max |difference| 4.8e-7; 10x margin.
    for sa, sb in zip(a.scores, b.scores):
        torch.testing.assert_close(sa, sb, atol=5e-6, rtol=0)
    # Beams agree when no kept / dropped candidate pair is closer than the cumulative score difference
    # (5 steps x 5e-6): measured gaps >= 1.8e-4.
    gap = _beam_gap(b.scores, batch=2, beams=3)
    assert gap >= 2 * 5 * 5e-6, gap
    assert torch.equal(a.sequences, b.sequences)


@pytest.mark.parametrize(
    "policy",
    [
        lambda: None,
        lambda: FPAEviction(1.0),
        lambda: SlidingWindow(5),
        lambda: StreamingLLM(5, sinks=2),
        lambda: TOVA(5),
    ],
)
def test_helper_and_model_generate_agree(policy):
    m = forgetful("fpa", "free")
    rows = prompts(seed=4, lengths=(11, 6))
    ids, mask = padded(rows, "left")
    a = generate(m, ids, FPACache(policy()), max_new_tokens=5, chunk_size=4, attention_mask=mask)
    b = _gen(m, ids, FPACache(policy()), max_new_tokens=5, attention_mask=mask, prefill_chunk_size=4)
    assert torch.equal(a, b)  # the helper is this very call: the same kernels on the same inputs


def test_fox_eviction_batched_helper():
    m = forgetful("fox", "free")
    rows = prompts(seed=6, lengths=(9, 5))
    ids, mask = padded(rows, "left")
    out = generate(m, ids, FPACache(FoXEviction(1.0)), max_new_tokens=4, chunk_size=3, attention_mask=mask)
    for b, r in enumerate(rows):
        # = generate(m, r[None], FPACache(FoXEviction(1.0)), max_new_tokens=4, chunk_size=3), with the scores
        alone, gap = scored(
            m, r[None], FPACache(FoXEviction(1.0)), max_new_tokens=4, prefill_chunk_size=3, pad_token_id=0
        )
        assert gap >= MIN_GAP, gap  # no near-tie: equal tokens are a tolerance claim
        assert torch.equal(out[b, -4:], alone[0, -4:])


@pytest.mark.parametrize("att,mode", [("fpa", "walk"), ("fox", "free"), ("softmax_rope", "free")])
def test_gradient_checkpointing_same_gradients(att, mode):
    m = forgetful(att, mode).train()
    x = prompts(lengths=(9,))[0][None].repeat(2, 1)
    m(x, labels=x).loss.backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    # transformers >= 5.x renamed it activation_checkpointing_enable (the old name warns)
    (getattr(m, "activation_checkpointing_enable", None) or m.gradient_checkpointing_enable)()
    assert m.model.gradient_checkpointing
    m(x, labels=x).loss.backward()
    for n, p in m.named_parameters():
        # bit for bit on purpose: recomputation repeats the same float32 operations on the same
        # inputs (measured difference 0), and the one parameter used twice (the tied embedding) sums
        # two terms, which is exact in either order
        if n in ref:
            assert torch.equal(p.grad, ref[n]), n


@pytest.mark.parametrize("att,mode", TYPES)
@pytest.mark.parametrize("cached", [False, True])
def test_output_attentions_reproduce_the_layer_output(att, mode, cached):
    """The returned probabilities (FPA penalties included) times the values give the attention
    output the layer computed (captured before o_proj), so they are the ones actually used."""
    m = forgetful(att, mode)
    rows = prompts(lengths=(8, 5))
    ids, mask = padded(rows, "left")
    attn = m.model.layers[1].attn
    seen = {}
    h1 = attn.v_proj.register_forward_hook(lambda mod, a, out: seen.__setitem__("v", out))
    h2 = attn.o_proj.register_forward_pre_hook(lambda mod, a: seen.__setitem__("o", a[0]))
    kw = dict(past_key_values=FPACache(), use_cache=True) if cached else {}
    with torch.no_grad():
        out = m(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True, **kw)
    h1.remove(), h2.remove()
    w = out.attentions[1]  # (B, Hq, T, T)
    B, T = ids.shape
    assert len(out.attentions) == 2 and w.shape == (B, 4, T, T)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, 4, T), atol=1e-5, rtol=0)
    assert (w.triu(1) == 0).all()
    v = seen["v"].view(B, T, 2, 8).transpose(1, 2).repeat_interleave(2, 1)
    o = (w @ v).transpose(1, 2).reshape(B, T, 32)
    real = mask.bool()
    # measured worst |difference| 1.2e-7 over every type, cached or not: atol 1e-6
    torch.testing.assert_close(o[real], seen["o"][real], atol=1e-6, rtol=0)
    assert len(out.hidden_states) == 3
    torch.testing.assert_close(out.hidden_states[-1], m.model(ids, attention_mask=mask).last_hidden_state)


def test_generate_returns_attentions_and_hidden_states():
    m = forgetful("fpa", "walk")
    ids = prompts(lengths=(5,))[0][None]
    out = _gen(
        m, ids, max_new_tokens=3, output_attentions=True, output_hidden_states=True, return_dict_in_generate=True
    )
    assert len(out.attentions) == 3 and out.attentions[0][0].shape == (1, 4, 5, 5)
    assert out.attentions[1][0].shape[-2] == 1 and len(out.hidden_states[0]) == 3


def test_input_checks():
    m = forgetful("fpa", "free")
    with pytest.raises(ValueError, match=r"input_ids\[None\]"):
        m(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="vocab_size=37"):
        m(torch.tensor([[1, 37]]))
    with pytest.raises(ValueError, match="vocab_size=37"):
        m(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="attention_mask"):
        m(torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 5))


def test_cache_refuses_another_model():
    fpa, fox = forgetful("fpa", "free"), forgetful("fox", "free")
    cache = FPACache()
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        fpa(x, past_key_values=cache, use_cache=True)
        with pytest.raises(ValueError, match="attention"):
            fox(x, past_key_values=cache, use_cache=True)
        fpa(x, past_key_values=cache, use_cache=True)  # the filling model still works


def test_a_saved_head_offset_model_shares_its_cache_and_a_token_one_does_not(tmp_path):
    """A saved and reloaded "head" offset model is the same model, so a cache filled by one serves
    the other (and gives the same logits); a "token" model is another model."""
    from fpa.models import FPAForCausalLM

    head = forgetful("fpa", "walk", fpa={"level_offset": "head"})
    head.save_pretrained(tmp_path)
    old = FPAForCausalLM.from_pretrained(tmp_path).eval()
    assert old.config.fpa == head.config.fpa and old.config.fpa.level_offset == "head"
    token = forgetful("fpa", "walk", fpa={"level_offset": "token"})
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        a, b = FPACache(), FPACache()
        old(x[:, :3], past_key_values=a, use_cache=True)
        head(x[:, :3], past_key_values=b, use_cache=True)
        la = head(x[:, 3:], past_key_values=a, use_cache=True).logits
        lb = head(x[:, 3:], past_key_values=b, use_cache=True).logits
        torch.testing.assert_close(la, lb, rtol=0, atol=0)  # one model, one code path: the same bits
        with pytest.raises(ValueError, match="fpa_level_offset"):
            token(x[:, 3:], past_key_values=a, use_cache=True)


def test_empty_transformers_cache_is_replaced_and_full_one_refused():
    m = forgetful("fpa", "free")
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        out = m(x, past_key_values=DynamicCache(), use_cache=True)
    assert isinstance(out[CACHE_ARG], FPACache) and out[CACHE_ARG].get_seq_length() == 3
    full = DynamicCache()
    full.update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8), 0)
    with pytest.raises(ValueError, match="FPACache"):
        m(x, past_key_values=full, use_cache=True)


def test_import_fpa_models_registers_auto_classes(tmp_path):
    forgetful("fpa", "walk").save_pretrained(tmp_path)
    code = (
        "import fpa.models\nfrom transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\nprint(type(m).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("FPAForCausalLM")


def test_cache_layer_reports_sizes_for_both_transformers_conventions():
    m = forgetful("fpa", "free")
    cache = FPACache()
    with torch.no_grad():
        m(torch.tensor([[1, 2, 3, 4]]), past_key_values=cache, use_cache=True)
    lc = cache.layers[0]
    assert lc.get_mask_sizes(2) == (6, 0) == lc.get_mask_sizes(torch.arange(4, 6))
    assert cache.get_seq_length() == 4 and len(cache) == 2 and not cache.is_compileable
    assert lc.keys.shape == (1, 2, 4, 8) and lc.values.shape == (1, 2, 4, 8)
