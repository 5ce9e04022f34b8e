"""Kept keys against context length: the fitted exponent and the streaming measurement."""

import math

import pytest
import torch

from fpa.eval.growth import fit_exponent, kept_keys_growth


def test_fit_exponent_recovers_power_laws():
    lens = [1024, 2048, 4096, 8192]
    assert fit_exponent(lens, [3 * x**0.5 for x in lens]) == pytest.approx(0.5)
    assert fit_exponent(lens, [40.0] * 4) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(fit_exponent([1024], [3.0]))


def _model():
    from fpa.models import FPAConfig, FPAForCausalLM

    torch.manual_seed(0)
    cfg = FPAConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        attention="fpa",
        fpa={"mode": "walk"},
    )
    return FPAForCausalLM(cfg).eval()


def test_a_window_stops_growing_and_a_full_cache_grows_linearly():
    from fpa.cache import FPACache, SlidingWindow

    model, ids = _model(), torch.randint(0, 256, (1, 512))
    lens = [128, 256, 512]

    def window():
        p = SlidingWindow(budget=64)
        return FPACache(p), p

    def keep_all():
        p = SlidingWindow(budget=10_000)
        return FPACache(p), p

    w = kept_keys_growth(model, ids, window, lens, chunk_size=64)
    f = kept_keys_growth(model, ids, keep_all, lens, chunk_size=64)
    assert w["kept_keys"] == pytest.approx([64, 64, 64], abs=1) and abs(w["exponent"]) < 0.02
    assert f["kept_keys"] == pytest.approx(lens) and f["exponent"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="multiples of chunk_size"):
        kept_keys_growth(model, ids, window, [100], chunk_size=64)
    with pytest.raises(ValueError, match="lengths must be in"):
        kept_keys_growth(model, ids, window, [1024], chunk_size=64)
