"""Decode steps read no device value on the host (each read is a host sync on an accelerator):
none at all with the full cache; under a policy, only where a layer's store reclaims its evicted
slots, once every block_size tokens. Counted on the CPU with cache_testing.HostReads (item, bool,
int, tolist, and the ops whose output size depends on values)."""

import math

import pytest
import torch
from cache_testing import TYPES, HostReads, tiny_model

from fpa.cache import H2O, TOVA, FoXEviction, FPACache, FPAEviction, SlidingWindow, StreamingLLM
from fpa.cache.hybrid import RuleThenBudget

PROMPT, STEPS = 9, 12


def _decode(att, mode, policy, block_size, masked):
    """Prefill PROMPT tokens, then STEPS decode steps of batch 2 (GQA); the host reads of each step.
    The model is fed embeddings: on the CPU the model also checks the token ids on every call
    (fpa.models skips that check on an accelerator), which is not the cache's doing."""
    m = tiny_model(att, mode)
    if att in ("fpa", "fox"):  # fields that forget, so that the threshold rules evict
        with torch.no_grad():
            for block in m.model.layers:
                for name in ("field_proj", "level_proj", "increment_proj", "fgate_proj"):
                    if hasattr(block.attn, name):
                        getattr(block.attn, name).weight.normal_(0, 0.5)
    x = m.model.embed_tokens(torch.randint(1, 37, (2, PROMPT + STEPS))).detach()
    mask = torch.ones(2, PROMPT + STEPS, dtype=torch.long)
    mask[1, :3] = 0  # a left-padded row
    cache = FPACache(policy, block_size=block_size)

    def call(a, b):
        kw = {"attention_mask": mask[:, :b]} if masked else {}
        return m(inputs_embeds=x[:, a:b], cache=cache, use_cache=True, **kw).logits

    per_step = []
    with torch.no_grad():
        call(0, PROMPT)
        for t in range(PROMPT, PROMPT + STEPS):
            with HostReads() as reads:
                call(t, t + 1)
            per_step.append(reads.sites)
    return per_step, cache


@pytest.mark.parametrize("att,mode", TYPES)
@pytest.mark.parametrize("block_size", [4, 2], ids=["by-block", "by-row"])  # G * T >= P reads by row
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_full_cache_decode_steps_read_nothing(att, mode, block_size, masked):
    """No policy: no step reads a device value, blocks being allocated (every block_size steps) included."""
    per_step, cache = _decode(att, mode, None, block_size, masked)
    blocks = -(-(PROMPT + STEPS) // block_size)  # per row at the end, more than after the prompt
    assert all(lc.store.nblk_host == [blocks] * lc.store.R == lc.store.nblk.tolist() for lc in cache.layers)
    assert [s for s in per_step if s] == [], [s[-1] for reads in per_step for s in reads][:10]


def _policies(att):
    own = {"fpa": [FPAEviction(0.5)], "fox": [FoXEviction(0.5)]}.get(att, [])
    budget = [SlidingWindow(5), StreamingLLM(5, sinks=2), TOVA(5), H2O(5, recent=2)]
    return own + budget + [RuleThenBudget(type(p)(p.threshold), H2O(5)) for p in own]


@pytest.mark.parametrize("att,mode", [("fpa", "free"), ("fpa", "walk"), ("fox", "free"), ("softmax_alibi", "free")])
@pytest.mark.parametrize("block_size", [4, 2], ids=["by-block", "by-row"])
def test_policy_decode_steps_read_only_when_the_store_reclaims(att, mode, block_size):
    """Under every policy the keep masks are computed and applied on the device; the only reads are
    the stores' reclaims (compaction of rows with many holes), once every block_size steps."""
    for policy in _policies(att):
        per_step, cache = _decode(att, mode, policy, block_size, masked=True)
        reading = [i for i, s in enumerate(per_step) if s]
        assert len(reading) <= math.ceil(STEPS / block_size), (policy.name, reading)
        outside = [s[-1] for reads in per_step for s in reads if not any(" reclaim" in f for f in s)]
        assert outside == [], (policy.name, outside[:10])
        held, seen = cache.held_and_seen()
        assert policy.kept_fraction == held / seen < 1, policy.name  # it evicted; the count is exact
