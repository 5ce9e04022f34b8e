import math

import numpy as np
import pytest
import torch

from fpa.eval.decode import greedy_decode
from fpa.eval.kv import budget_for, make_policy
from fpa.eval.passkey import cell_prompts, passkey_grid


def test_oracle_given_the_answer_scores_100_percent(oracle, tok):
    g = passkey_grid(oracle, tok, [150, 400], [0.0, 0.5, 1.0], trials=4, chunk_size=64, progress=False)
    assert g["accuracy"] == [[1.0] * 3] * 2 and g["correct"] == [[4] * 3] * 2
    assert g["kept_fraction_mean"] == 1.0
    assert g["examples"][0]["generated"].startswith(" ")


def test_oracle_one_digit_off_scores_0(oracle, tok, monkeypatch):
    """The scorer fails an answer that is wrong by one (extra) digit."""
    orig = oracle._next

    def extra_digit(ids):
        text = tok.decode(ids)
        return ord("7") if text.endswith(tuple(f"{d}" for d in range(10))) and text[-6] == " " else orig(ids)

    monkeypatch.setattr(oracle, "_next", extra_digit)
    g = passkey_grid(oracle, tok, [200], [0.5], trials=3, progress=False)
    assert g["accuracy"] == [[0.0]]
    assert all(len(e["generated"].strip(" .")) == 6 for e in g["examples"])


def test_random_model_scores_about_0(tok, tiny_model):
    g = passkey_grid(tiny_model(), tok, [200], [0.0, 1.0], trials=5, progress=False)
    assert np.mean(g["accuracy"]) <= 0.1


def test_same_prompts_for_every_grid(tok):
    a = cell_prompts(tok, 300, 0.5, 2, 3, seed=1)
    b = cell_prompts(tok, 300, 0.5, 2, 3, seed=1)
    c = cell_prompts(tok, 300, 0.5, 2, 3, seed=2)
    assert all((x.ids == y.ids).all() for x, y in zip(a, b))
    assert any((x.ids != y.ids).any() for x, y in zip(a, c))


def test_chunked_decoding_matches_one_shot_with_full_cache(tok, tiny_model):
    model = tiny_model("fpa", "walk")
    ids = torch.from_numpy(np.stack([p.ids for p in cell_prompts(tok, 200, 0.3, 0, 2, 0)]))
    one, _ = greedy_decode(model, ids, 5)
    chunked, _ = greedy_decode(model, ids, 5, chunk_size=48)
    assert torch.equal(one, chunked)
    with torch.no_grad():  # the first new token is the argmax of a plain forward
        assert torch.equal(one[:, 0], model(input_ids=ids).logits[:, -1].argmax(-1))


def test_grid_reports_achieved_kept_fraction_of_a_budget_policy(tok, tiny_model):
    from fpa.cache import FPACache

    def make(length):
        p = make_policy("window", budget=budget_for(0.25, length))
        return FPACache(p), p

    g = passkey_grid(
        tiny_model("softmax_rope"), tok, [256], [0.5], trials=2, make_cache=make, chunk_size=64, progress=False
    )
    n_new = 7
    assert g["kept_fraction_mean"] == pytest.approx(64 / (256 + n_new - 1), rel=1e-6)


def test_grid_rejects_bad_arguments(oracle, tok):
    with pytest.raises(ValueError, match="trials"):
        passkey_grid(oracle, tok, [200], [0.5], trials=0)
    with pytest.raises(ValueError, match="lengths"):
        passkey_grid(oracle, tok, [], [0.5], trials=1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(oracle, torch.zeros(1, 3, dtype=torch.long), 0)
    assert math.isfinite(budget_for(0.5, 3))
    with pytest.raises(ValueError, match="fraction"):
        budget_for(0.0, 100)
