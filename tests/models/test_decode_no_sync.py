"""On an accelerator, a decode step (the cache holds tokens) makes no host sync in fpa.models (the
token-id check and the all-ones-mask fast path read values only on a sequence's first call), nor
in fpa.cache (its paged store included): the paged store sizes its appends from host copies of its fills,
and a policy's evictions are applied on the device, the store reclaiming the evicted slots only
once every block_size (16) tokens, which these 8 steps after a 32-token prompt never reach.
Needs CUDA (skipped otherwise); tests/cache/test_host_syncs.py counts the same on the CPU. The
syncs elsewhere (the attention layers) are printed, not asserted."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch

from fpa.cache import FPACache, FPAEviction
from fpa.models import FPAConfig, FPAForCausalLM

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TYPES = [("fpa", "walk"), ("fpa", "free"), ("fox", "free"), ("softmax_rope", "free"), ("softmax_alibi", "free")]


@pytest.mark.parametrize("att,mode", TYPES)
@pytest.mark.parametrize("policy", [None, "evict"])
def test_decode_steps_make_no_host_sync_in_the_model(att, mode, policy):
    if policy and att != "fpa":
        pytest.skip("FPAEviction serves FPA models only")
    torch.manual_seed(0)
    m = FPAForCausalLM(FPAConfig(attention=att, fpa={"mode": mode}, num_key_value_heads=2)).cuda().eval()
    x = torch.randint(0, 257, (2, 40), device="cuda")
    mask = torch.ones(2, 40, dtype=torch.long, device="cuda")
    cache = FPACache(FPAEviction(4.0) if policy else None)
    sites = collections.Counter()
    outs = []
    with torch.no_grad():
        full = m(x).logits
        m(x[:, :32], past_key_values=cache, use_cache=True, attention_mask=mask[:, :32])
        for t in range(32, 40):
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    outs.append(
                        m(
                            x[:, t : t + 1], past_key_values=cache, use_cache=True, attention_mask=mask[:, : t + 1]
                        ).logits
                    )
            finally:
                torch.cuda.set_sync_debug_mode(0)
            sites.update(
                f"{w.filename.rsplit('/src/', 1)[-1]}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)
            )
    print(f"{att}/{mode} policy={policy}: host syncs per site over 8 decode steps: {dict(sites)}")
    assert not [s for s in sites if s.startswith(("fpa/models/", "fpa/cache/"))], sites
    if policy is None:
        torch.testing.assert_close(torch.cat(outs, 1), full[:, 32:], atol=1e-4, rtol=1e-4)


def test_a_bad_id_still_fails_clearly_on_the_first_call():
    m = FPAForCausalLM(FPAConfig()).cuda().eval()
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, vocab_size=257\), got values in \[1, 300\]"):
        m(torch.tensor([[1, 300]], device="cuda"))
