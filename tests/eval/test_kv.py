import math

import numpy as np
import pytest

from fpa.eval.kv import calibrate_threshold, make_policy, matched_policy_factories, policies_for
from fpa.eval.passkey import cell_prompts


def test_policies_for_each_attention_type():
    assert policies_for("fpa")[0] == "fpa" and "fox" not in policies_for("fpa")
    assert policies_for("fox")[0] == "fox"
    assert policies_for("softmax_rope") == ["window", "streamingllm", "tova", "h2o"]
    with pytest.raises(ValueError, match="policy"):
        make_policy("lru", budget=3)
    with pytest.raises(ValueError, match="budget"):
        make_policy("tova")
    with pytest.raises(ValueError, match="threshold"):
        make_policy("fpa")


@pytest.mark.parametrize("attention, name", [("fpa", "fpa"), ("fox", "fox")])
def test_threshold_calibration_reaches_the_target_fraction(tiny_model, tok, attention, name):
    model = tiny_model(attention, "walk" if attention == "fpa" else "free", seed=1)
    if attention == "fpa":  # a random model barely dips; make the penalties matter
        for layer in model.model.layers:
            layer.attn.increment_proj.weight.data *= 20
    ids = np.stack([p.ids for p in cell_prompts(tok, 256, 0.5, 0, 2, seed=5)])
    c = calibrate_threshold(model, name, ids, 0.25, chunk_size=64)
    assert math.isfinite(c["threshold"]) and abs(c["calibrated_kept_fraction"] - 0.25) < 0.05


def test_matched_factories_give_budget_and_calibrated_policies(tiny_model, tok):
    model = tiny_model("fox")
    fac = matched_policy_factories(model, "fox", tok, [256], 0.5, chunk_size=64, calib_prompts=1, seed=0)
    assert list(fac) == ["fox", "window", "streamingllm", "tova", "h2o"]
    cache, policy = fac["window"][0](256)
    assert policy.budget == 128 and fac["window"][1] == {"256": {"budget": 128}}
    cache, policy = fac["fox"][0](256)
    assert policy.threshold == fac["fox"][1]["256"]["threshold"]
