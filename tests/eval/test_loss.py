import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fpa.eval.loss import loss_summary, per_position_loss


def test_per_position_loss_matches_a_direct_cross_entropy(tiny_model):
    model = tiny_model("fox")
    w = np.random.default_rng(0).integers(0, 256, size=(3, 41))
    curve = per_position_loss(model, w, batch_size=2, progress=False)
    with torch.no_grad():
        x = torch.from_numpy(w)
        logits = model(input_ids=x[:, :-1]).logits
        ref = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none").mean(0).double().numpy()
    assert curve.shape == (40,)
    np.testing.assert_allclose(curve, ref, rtol=1e-5, atol=1e-6)


def test_loss_summary_buckets_by_doublings():
    curve = np.array([1.0] * 4 + [2.0] * 4 + [4.0] * 8)
    s = loss_summary(curve, 4)
    assert s["by_multiple"] == {"1": 1.0, "2": 2.0, "4": 4.0}
    assert s["loss"] == 1.0 and s["ppl"] == pytest.approx(math.e)
    with pytest.raises(ValueError, match="train_len"):
        loss_summary(curve, 0)


def test_per_position_loss_rejects_bad_windows(tiny_model):
    with pytest.raises(ValueError, match="windows"):
        per_position_loss(tiny_model(), np.zeros((2, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="batch_size"):
        per_position_loss(tiny_model(), np.zeros((2, 5), dtype=np.int64), batch_size=0)
