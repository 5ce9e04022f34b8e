"""Model-level decoding with FPACache: exactness without eviction, budgets, batches, chunking."""

import math

import pytest
import torch
from cache_testing import TYPES, forgetful_layer, full_penalty, full_qkv, kept_positions, tiny_model

from fpa.cache import H2O, TOVA, FoXEviction, FPACache, FPAEviction, SlidingWindow, StreamingLLM, generate, prefill
from fpa.compat import CACHE_ARG
from fpa.layers.attention import make_attention


def _keep_all_policy(att):
    if att == "fpa":
        return FPAEviction(math.inf)
    if att == "fox":
        return FoXEviction(math.inf)
    return SlidingWindow(budget=10_000)


def _calls(model, x, cache, chunks):
    """Logits of every call, concatenated (B, T, V); cache.keys_held() after each call."""
    out, held, a = [], [], 0
    with torch.no_grad():
        for n in chunks:
            out.append(model(x[:, a : a + n], cache=cache, use_cache=True).logits)
            held.append((a + n, cache.keys_held()))
            a += n
    return torch.cat(out, 1), held


# every type, and FPA walk with a per-token level offset (softplus(1) = 1.3 at init: it changes the outputs)
CASES = [pytest.param(a, m, {}, id=f"{a}-{m}") for a, m in TYPES] + [
    pytest.param("fpa", "walk", dict(fpa={"level_offset": "token", "level_offset_bias_init": 1.0}), id="fpa-walk-token")
]


@pytest.mark.parametrize("att,mode,kw", CASES)
def test_no_eviction_equals_full_forward(att, mode, kw):
    """tau = inf (or a budget above the length) decodes exactly as the full forward."""
    m = tiny_model(att, mode, qk_norm=True, **kw)
    x = torch.randint(0, 37, (2, 14))
    with torch.no_grad():
        full = m(x).logits
    got, held = _calls(m, x, FPACache(_keep_all_policy(att)), [5, 1, 1, 4, 1, 1, 1])
    assert torch.allclose(got, full, atol=1e-4)
    assert all((h == t).all() for t, hs in held for h in hs)


@pytest.mark.parametrize("att,mode,kw", CASES)
def test_chunked_prefill_equals_one_shot(att, mode, kw):
    m = tiny_model(att, mode, **kw)
    x = torch.randint(0, 37, (2, 17))
    results = []
    for chunk in (17, 4, 1):
        cache = FPACache()
        last = prefill(m, x[:, :13], cache, chunk_size=chunk)
        rest, _ = _calls(m, x[:, 13:], cache, [1, 1, 2])
        results.append((last, rest))
    for last, rest in results[1:]:
        assert torch.allclose(last, results[0][0], atol=1e-4)
        assert torch.allclose(rest, results[0][1], atol=1e-4)


def _budget_policies(budget):
    return [SlidingWindow(budget), StreamingLLM(budget, sinks=2), TOVA(budget), H2O(budget, recent=2)]


@pytest.mark.parametrize("att,mode", TYPES)
def test_budget_policies_hold_exactly_their_budget(att, mode):
    m = tiny_model(att, mode)
    x = torch.randint(0, 37, (2, 20))
    budget = 6
    for policy in _budget_policies(budget):
        cache = FPACache(policy)
        _, held = _calls(m, x, cache, [3, 4, 5] + [1] * 8)  # chunk of 5 > budget - held
        for t, hs in held:
            for h in hs:
                assert (h == min(t, budget)).all(), (policy.name, t, h)
        assert policy.kept_fraction == pytest.approx(budget / 20)
        pos = [kept_positions(lc, b, g) for lc in cache.layers for b in range(2) for g in range(2)]
        if isinstance(policy, SlidingWindow):
            assert all(p == list(range(14, 20)) for p in pos)
        if isinstance(policy, StreamingLLM):
            assert all(p == [0, 1, 16, 17, 18, 19] for p in pos)
        if isinstance(policy, H2O):
            assert all({18, 19} <= set(p) for p in pos)


def _alibi_layer():
    torch.manual_seed(5)
    return make_attention("softmax_alibi", 32, 4, 2).eval()


def _alibi_penalty(layer, x):
    T = x.shape[1]
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp(min=0).float()
    return layer.slopes[None, :, None, None] * dist


@pytest.mark.parametrize("kind", ["free", "fox", "alibi"])
def test_attention_weights_recorded_for_h2o_and_tova(kind):
    """Without eviction, H2O's accumulated score = column sums of the dense attention weights over
    all queries and the group's query heads; TOVA's last weights = the last query's row (mean)."""
    layer = _alibi_layer() if kind == "alibi" else forgetful_layer(kind, seed=5, num_kv_heads=2)
    penalty = _alibi_penalty if kind == "alibi" else full_penalty
    x = torch.randn(2, 12, 32)
    cache = FPACache(H2O(budget=100))
    lc = cache.layer(0)
    with torch.no_grad():
        for a, b in ((0, 5), (5, 6), (6, 12)):
            layer(x[:, a:b], lc)
            cache.step_done()
        q, k, v = full_qkv(layer, x)
        s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * layer.scale - penalty(layer, x)
        s = s.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
        w = torch.softmax(s, -1).view(2, 2, 2, 12, 12)
    assert torch.allclose(lc.store["score"], w.sum((2, 3)), atol=1e-5)
    assert torch.allclose(lc.store["last"], w[:, :, :, -1].mean(2), atol=1e-6)


@pytest.mark.parametrize("policy_fn", [TOVA, H2O])
def test_score_policies_drop_the_lowest(policy_fn):
    """After each step, every kept key (outside H2O's recent window) scores >= every dropped one."""
    m = tiny_model("softmax_rope", "free")
    x = torch.randint(0, 37, (1, 16))
    policy = policy_fn(5)
    cache = FPACache(policy)
    orig = cache.step_done
    checked = []

    def checking_step():
        snaps = [(lc.store["pos"].clone(), policy.score(lc).clone()) for lc in cache.layers]
        orig()
        for lc, (pos, score) in zip(cache.layers, snaps):
            for g in range(pos.shape[1]):
                kept = set(kept_positions(lc, 0, g))
                ks = [float(score[0, g, i]) for i, p in enumerate(pos[0, g].tolist()) if p in kept]
                ds = [float(score[0, g, i]) for i, p in enumerate(pos[0, g].tolist()) if p >= 0 and p not in kept]
                if ds:
                    checked.append(1)
                    assert min(ks) >= max(ds)

    cache.step_done = checking_step
    _calls(m, x, cache, [4] + [1] * 12)
    assert checked


def _forgetful_model(seed=0):
    m = tiny_model("fpa", "free", seed=seed)
    with torch.no_grad():
        for layer in m.model.layers:
            layer.attn.field_proj.weight.normal_(0, 0.5)
            layer.attn.level_proj.weight.normal_(0, 0.5)
            layer.attn.beta_param.fill_(1.0)
    return m


def test_batch_rows_evict_differently_and_match_alone():
    """B = 3 with different evictions per row and per head equals each row decoded alone
    (so the per-head padding changes nothing), and bytes_held shrinks with the kept keys."""
    m = _forgetful_model()
    x = torch.randint(0, 37, (3, 24))
    chunks = [6] + [1] * 18
    batched, _ = _calls(m, x, cache := FPACache(FPAEviction(1.0)), chunks)
    counts = cache.keys_held()[0]
    assert len(set(counts.flatten().tolist())) > 1 and (counts < 24).all()
    for b in range(3):
        alone, _ = _calls(m, x[b : b + 1], FPACache(FPAEviction(1.0)), chunks)
        assert torch.allclose(batched[b : b + 1], alone, atol=1e-4)
    full_cache = FPACache()
    _calls(m, x, full_cache, chunks)
    held, seen = cache.held_and_seen()
    assert cache.kept_fraction() == pytest.approx(held / seen) == pytest.approx(cache.policy.kept_fraction)
    assert seen == 2 * 3 * 2 * 24  # layers * rows * KV heads * tokens
    for lc in cache.layers:  # paged storage: bytes follow the kept keys (fpa.cache.store.storage)
        st = lc.store
        assert st.bytes_live() == int(lc.counts().sum()) * st.slot_bytes()
        assert st.bytes_held() <= 1.15 * st.bytes_live() + st.overhead_bound()
    assert cache.bytes_held() < full_cache.bytes_held()
    # without a policy the cache also keeps the field history (B, Hq, T) float32 for crop()
    store_bytes = sum(lc.store.bytes_held() for lc in full_cache.layers)
    assert full_cache.bytes_held() == store_bytes + 2 * 3 * 4 * 24 * 4
    assert full_cache.bytes_live() == sum(lc.store.slot_bytes() for lc in full_cache.layers) * 3 * 2 * 24


def test_generate_helper_equals_manual_greedy_with_eviction():
    """The helper (model.generate, prompt in chunks, an all-ones mask) against prefill and greedy
    steps by hand (no mask: another path through the layers on continuation calls)."""
    m = _forgetful_model(seed=1)
    x = torch.randint(0, 37, (2, 15))
    out = generate(m, x, FPACache(FPAEviction(1.0)), max_new_tokens=4, chunk_size=4)
    kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=4, do_sample=False, prefill_chunk_size=4)
    res = m.generate(
        x,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
        **kw,
        **{CACHE_ARG: FPACache(FPAEviction(1.0))},
    )
    assert torch.equal(out, res.sequences)  # the helper is this very call: the same kernels on the same inputs
    cache = FPACache(FPAEviction(1.0))
    logits = prefill(m, x, cache, chunk_size=4)
    seq, steps = x, []
    with torch.no_grad():
        for _ in range(4):
            steps.append(logits)
            nxt = logits.argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            logits = m(nxt, cache=cache, use_cache=True).logits[:, -1]
    # measured max |difference| of the two paths' logits 0 (here and on 4 other models); tolerance 1e-5, the
    # bar for cached attention (test_paged.py)
    torch.testing.assert_close(torch.stack(res.scores), torch.stack(steps), atol=1e-5, rtol=0)
    top = torch.stack(steps).double().topk(2, dim=-1).values
    assert (top[..., 0] - top[..., 1]).min() > 2e-5  # no near-tie (measured 4.6e-3): equal tokens follow
    assert torch.equal(out, seq)


def test_reset_keeps_what_the_cache_set_on_its_layers():
    """Cache.reset (transformers) empties every layer but keeps the settings FPACache gave it (here
    TOVA's weight recording): the emptied cache serves the prompt again."""
    m = tiny_model("softmax_rope")
    x = torch.randint(0, 37, (1, 12))
    cache = FPACache(TOVA(5))
    with torch.no_grad():
        first = m(x, cache=cache, use_cache=True).logits
        cache.reset()
        assert cache.get_seq_length() == 0
        again = m(x, cache=cache, use_cache=True).logits
    assert torch.equal(first, again)  # an empty cache both times: the same kernels on the same inputs
    assert all((h == 5).all() for h in cache.keys_held())


def test_bad_arguments():
    m = tiny_model()
    x = torch.randint(0, 37, (1, 5))
    with pytest.raises(ValueError, match="policy"):
        FPACache("window")
    with pytest.raises(ValueError, match="chunk_size"):
        prefill(m, x, FPACache(), chunk_size=0)
    with pytest.raises(ValueError, match="cache"):
        prefill(m, x, {}, chunk_size=2)
    with pytest.raises(ValueError, match="input_ids"):
        prefill(m, x[0], FPACache())
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(m, x, FPACache(), max_new_tokens=0)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="budget"):
            SlidingWindow(bad)
    with pytest.raises(ValueError, match="sinks"):
        StreamingLLM(4, sinks=5)
    with pytest.raises(ValueError, match="recent"):
        H2O(4, recent=9)
    with pytest.raises(ValueError, match="attention='fox'"):
        _calls(m, x, FPACache(FoXEviction(1.0)), [5])
