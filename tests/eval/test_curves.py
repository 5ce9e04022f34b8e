import numpy as np
import pytest
import torch
from test_passkey_eval import assert_same_greedy_decoding, decode_logits

from fpa.cache import FPACache
from fpa.eval.curves import policy_curve
from fpa.eval.kv import make_policy
from fpa.eval.passkey import cell_prompts


def _curve(model, tok, policy, thresholds=(0.5, 1e9), fractions=(0.25, 1.0)):
    return policy_curve(model, tok, policy, 64, (2,), (0.0, 1.0), 2, thresholds, fractions, chunk_size=32, seed=3)


def test_threshold_points_report_the_fraction_they_achieve(tiny_model, tok):
    model = tiny_model("fpa", "walk", seed=1)
    for layer in model.model.layers:  # a random model barely dips; make the penalties matter
        layer.attn.increment_proj.weight.data *= 20
    strict, loose = _curve(model, tok, "fpa")
    assert [strict["setting"], loose["setting"]] == [0.5, 1e9]
    assert loose["kept_fraction"] == pytest.approx(1.0)  # a threshold no penalty reaches evicts nothing
    assert strict["kept_fraction"] < 0.9
    (full,) = _curve(model, tok, "full")
    assert full["setting"] is None and full["kept_fraction"] == 1.0
    # nothing evicted: on the curve's prompts, the loose rule decodes as the full cache does
    ids = torch.from_numpy(
        np.stack([p.ids for j, d in enumerate((0.0, 1.0)) for p in cell_prompts(tok, 128, d, j, 2, 3)])
    )
    ref, ref_logits = decode_logits(model, ids, 7, chunk_size=32)
    new, logits = decode_logits(model, ids, 7, cache=FPACache(make_policy("fpa", threshold=1e9)), chunk_size=32)
    assert assert_same_greedy_decoding(ref, ref_logits, new, logits).all()  # measured smallest gap 2.8e-2


def test_budget_points_keep_their_budget(tiny_model, tok):
    quarter, everything = _curve(tiny_model("fox"), tok, "window")
    assert quarter["kept_fraction"] == pytest.approx(0.25, abs=0.05)
    # budget = the prompt's 128 tokens; the 6 answer tokens fed back while decoding push the oldest out
    assert everything["kept_fraction"] == pytest.approx(128 / 134)
    assert set(quarter["accuracy_by_multiple"]) == {"2"}


def test_unknown_policy_or_nothing_to_sweep(tiny_model, tok):
    with pytest.raises(ValueError, match="policy"):
        _curve(tiny_model("fox"), tok, "lru")
    with pytest.raises(ValueError, match="no settings"):
        _curve(tiny_model("fox"), tok, "fox", thresholds=())


def test_hybrid_keeps_what_the_rule_keeps_within_the_budget(tiny_model, tok):
    model = tiny_model("fpa", "walk", seed=1)
    for layer in model.model.layers:
        layer.attn.increment_proj.weight.data *= 20
    (rule,) = _curve(model, tok, "fpa", thresholds=(0.5,))
    capped, loose = policy_curve(
        model, tok, "fpa+h2o", 64, (2,), (0.0, 1.0), 2, (), (0.1, 1.0), chunk_size=32, seed=3, hybrid_threshold=0.5
    )
    assert capped["kept_fraction"] <= 0.1 + 1e-9 and capped["kept_fraction"] <= rule["kept_fraction"]
    # a budget as large as the prompt: the rule decides alone... except that a budget counts the
    # prompt's tokens only, so the answer tokens fed back may push a few out
    assert rule["kept_fraction"] - 0.05 <= loose["kept_fraction"] <= rule["kept_fraction"] + 1e-9
