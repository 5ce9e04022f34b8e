"""attention_mask / position_ids: a padded row computes what the row alone computes, in forward
and in (batched, greedy) generate, for every attention type, with and without eviction."""

import math

import pytest
import torch
from models_testing import MIN_GAP, scored

from fpa.cache import H2O, TOVA, FoXEviction, FPACache, FPAEviction, SlidingWindow, StreamingLLM, generate
from fpa.models import FPAConfig, FPAForCausalLM

TYPES = [
    ("fpa", "free"),
    ("fpa", "walk"),
    ("fox", "free"),
    ("softmax_rope", "free"),
    ("softmax_alibi", "free"),
    ("softmax_nope", "free"),
]
# Measured worst |padded - alone| over these tests: 1.7e-7 (float32 sums in another order);
# tolerance 1e-6, about 6x that.
ATOL = 1e-6


def forgetful(att, mode, seed=0, **kw):
    """A 2-layer random GQA model whose FPA field / FoX gate actually forget."""
    torch.manual_seed(seed)
    c = FPAConfig(
        vocab_size=37,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        attention=att,
        fpa={"mode": mode, **kw.pop("fpa", {})},
        pad_token_id=0,
        **kw,
    )
    m = FPAForCausalLM(c).eval()
    with torch.no_grad():
        for block in m.model.layers:
            a = block.attn
            for name in ("field_proj", "level_proj", "increment_proj"):
                if hasattr(a, name):
                    getattr(a, name).weight.normal_(0, 0.5)
            if hasattr(a, "beta_param"):
                a.beta_param.fill_(1.0)
            if hasattr(a, "fgate_proj"):
                a.fgate_proj.weight.normal_(0, 0.5)
                a.fgate_proj.bias.fill_(1.0)
    return m


def padded(rows, side, total=None, pad=0):
    """(ids, mask) (B, total) holding each row of ``rows`` (a list of 1-D tensors) padded on ``side``."""
    total = total or max(len(r) for r in rows)
    ids = torch.full((len(rows), total), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), total, dtype=torch.long)
    for b, r in enumerate(rows):
        sl = slice(total - len(r), total) if side == "left" else slice(0, len(r))
        ids[b, sl], mask[b, sl] = r, 1
    return ids, mask


def prefill_in_chunks(m, ids, mask, cache, step=3):
    """The logits (B, T, vocab) of ids (B, T) fed through ``cache`` ``step`` tokens at a time, with
    the attention mask of everything seen so far."""
    T = ids.shape[1]
    with torch.no_grad():
        parts = [
            m(ids[:, a : a + step], attention_mask=mask[:, : a + step], past_key_values=cache, use_cache=True).logits
            for a in range(0, T, step)
        ]
    return torch.cat(parts, 1)


def prompts(seed=1, lengths=(9, 5, 2)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 37, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("att,mode", TYPES)
def test_padded_rows_equal_rows_alone(att, mode, side):
    m = forgetful(att, mode, qk_norm=True)
    rows = prompts()
    ids, mask = padded(rows, side, total=12)
    with torch.no_grad():
        out = m(ids, attention_mask=mask).logits
        for b, r in enumerate(rows):
            sl = slice(12 - len(r), 12) if side == "left" else slice(0, len(r))
            torch.testing.assert_close(out[b, sl], m(r[None]).logits[0], atol=ATOL, rtol=0)
        # the mask matters: without it the padded rows differ
        assert not torch.allclose(m(ids).logits[1, -5:], out[1, -5:], atol=1e-3) or side == "right"


@pytest.mark.parametrize("att,mode", TYPES)
def test_mask_through_a_cache_in_chunks(att, mode):
    """Left-padded prompt prefilled in chunks through an FPACache, then decoded: equals alone."""
    m = forgetful(att, mode)
    rows = prompts(lengths=(8, 3))
    ids, mask = padded(rows, "left")
    cache = FPACache()
    got = prefill_in_chunks(m, ids, mask, cache)
    with torch.no_grad():
        assert cache.get_seq_length() == 8  # logical length, padding included
        assert cache.next_position().tolist() == [8, 3]
        for b, r in enumerate(rows):
            torch.testing.assert_close(got[b, 8 - len(r) :], m(r[None]).logits[0], atol=ATOL, rtol=0)


def _policies(att):
    own = [FPAEviction(1.0)] if att == "fpa" else [FoXEviction(1.0)] if att == "fox" else []
    return [None] + own + [SlidingWindow(4)]


@pytest.mark.parametrize("att,mode", TYPES)
def test_batched_generate_gives_each_prompt_its_own_tokens(att, mode):
    m = forgetful(att, mode)
    rows = prompts(lengths=(9, 4, 6))
    ids, mask = padded(rows, "left")
    for make in _policies(att):
        kw = {} if make is None else {"past_key_values": FPACache(type(make)(**_args(make)))}
        out = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, **_cache_kw(kw))
        for b, r in enumerate(rows):
            alone, gap = scored(
                m, r[None], None if make is None else FPACache(type(make)(**_args(make))), max_new_tokens=6
            )
            assert gap >= MIN_GAP, (make, b, gap)  # no near-tie: equal tokens are a tolerance claim
            assert torch.equal(out[b, -6:], alone[0, -6:]), (make, b)


def _args(policy):
    if isinstance(policy, (FPAEviction, FoXEviction)):
        return {"threshold": policy.threshold}
    return {"budget": policy.budget}


def _cache_kw(kw):
    from fpa.compat import CACHE_ARG

    return {CACHE_ARG: kw["past_key_values"]} if kw else {}


@pytest.mark.parametrize("policy", [lambda: TOVA(5), lambda: H2O(6, recent=3), lambda: StreamingLLM(5, sinks=2)])
def test_batched_generate_with_score_policies(policy):
    """Score-based budgets and sinks count each row's own real tokens (padding is not a sink)."""
    m = forgetful("softmax_rope", "free")
    rows = prompts(seed=3, lengths=(10, 3, 7))
    ids, mask = padded(rows, "left")
    out = generate(m, ids, FPACache(policy()), max_new_tokens=5, chunk_size=4, attention_mask=mask)
    for b, r in enumerate(rows):
        # = generate(m, r[None], FPACache(policy()), max_new_tokens=5, chunk_size=4), with the scores
        alone, gap = scored(m, r[None], FPACache(policy()), max_new_tokens=5, prefill_chunk_size=4, pad_token_id=0)
        assert gap >= MIN_GAP, (b, gap)  # no near-tie: equal tokens are a tolerance claim
        assert torch.equal(out[b, -5:], alone[0, -5:]), b


def test_explicit_position_ids_shift_rope_only():
    """position_ids move RoPE (a constant shift leaves relative attention unchanged), not FPA."""
    m = forgetful("softmax_rope", "free")
    x = prompts(lengths=(7,))[0][None]
    with torch.no_grad():
        base = m(x).logits
        shifted = m(x, position_ids=torch.arange(7)[None] + 5).logits
        torch.testing.assert_close(shifted, base, atol=1e-5, rtol=0)
        scrambled = m(x, position_ids=torch.tensor([[0, 2, 4, 6, 8, 10, 12]])).logits
        assert not torch.allclose(scrambled[:, 1:], base[:, 1:], atol=1e-4)
    f = forgetful("fpa", "walk")
    with torch.no_grad():  # FPA never reads position_ids: the same operations on the same inputs, bit for bit
        assert torch.equal(f(x, position_ids=torch.arange(7)[None] + 5).logits, f(x).logits)


def test_kept_fraction_counts_real_tokens_only():
    m = forgetful("fpa", "free")
    rows = prompts(lengths=(8, 2))
    ids, mask = padded(rows, "left")
    cache = FPACache(FPAEviction(math.inf))
    with torch.no_grad():
        m(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    held, seen = cache.held_and_seen()
    assert seen == 2 * (8 + 2) * 2  # layers * real tokens * KV heads
    assert held == seen and cache.kept_fraction() == 1.0


@pytest.mark.parametrize("att,mode", TYPES)
def test_padded_training_gradients_equal_unpadded(att, mode):
    """Backward through padding (labels -100 there): the same gradients as the row alone, finite."""
    m = forgetful(att, mode).train()
    r = prompts(lengths=(7,))[0]
    ids, mask = padded([r], "left", total=11)
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, 11 - 7] = -100  # the first real token: alone it has no prediction either
    m(ids, attention_mask=mask, labels=labels).loss.backward()
    padded_grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    m(r[None], labels=r[None]).loss.backward()
    for n, p in m.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(padded_grads[n]).all(), n
            # measured worst |difference| 7.2e-7 (float32 reordering in FPA/FoX; 0 for softmax): atol 1e-5
            torch.testing.assert_close(padded_grads[n], p.grad, atol=1e-5, rtol=1e-4)
