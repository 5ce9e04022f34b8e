import math

import numpy as np
import pytest
import torch

from fpa.eval.decode import greedy_decode
from fpa.eval.kv import budget_for, make_policy
from fpa.eval.passkey import cell_prompts, passkey_grid

# Greedy decoding along two computation paths (one-shot / chunked prefill, the full cache / a
# policy that evicts nothing, the FPA model / its Llama export): the logits each new token is
# picked from differ by <= 2e-7 on the tiny random models of these tests (logits ~0.4; measured
# over fpa free and walk, fox and softmax_rope, seeds 0-2, chunks of 17, 48 and 64 tokens).
# CROSS_PATH_ATOL is 10x that. Greedy picks the same token on both paths at a step whose
# best logit leads the second-best by more than twice the logits' difference, so tokens are
# compared only at such steps, never bit for bit.
CROSS_PATH_ATOL = 2e-6


class LogitRecorder:
    """Wraps a model for ``greedy_decode`` and keeps the last-position logits (B, V) of every call."""

    def __init__(self, model):
        self.model, self.logits = model, []

    def __call__(self, **kw):
        out = self.model(**kw)
        self.logits.append(out.logits[:, -1].detach())
        return out


def decode_logits(model, ids, n_new, cache=None, chunk_size=None):
    """``greedy_decode`` -> (new ids (B, n_new), the logits (n_new, B, V) each new token was picked from)."""
    rec = LogitRecorder(model)
    new, _ = greedy_decode(rec, ids, n_new, cache=cache, chunk_size=chunk_size)
    prefill_calls = 1 if chunk_size is None else -(-ids.shape[1] // chunk_size)
    return new, torch.stack(rec.logits[prefill_calls - 1 :])


def top2_gap(logits):
    """Best minus second-best logit, (n_new, B) from (n_new, B, V)."""
    top = logits.double().topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def assert_same_greedy_decoding(ref, ref_logits, new, logits, atol=CROSS_PATH_ATOL):
    """Two greedy decodings of the same prompts agree within ``atol``.

    Per row, in step order: the logits agree within ``atol`` at every step both paths reached by
    the same tokens, and the tokens agree at every step whose reference top-2 gap exceeds
    ``2 * atol``, up to the first step where it does not (from there the paths may feed different
    tokens). Returns the (n_new, B) mask of the steps whose tokens were compared.
    """
    clear = top2_gap(ref_logits) > 2 * atol
    scored = clear.long().cumprod(0).bool()  # every step so far clear of a near-tie
    same_input = torch.cat([torch.ones_like(scored[:1]), scored[:-1]])
    for i, b in same_input.nonzero().tolist():
        torch.testing.assert_close(logits[i, b], ref_logits[i, b], atol=atol, rtol=0, msg=f"step {i}, row {b}")
    assert torch.equal(new.T[scored], ref.T[scored])
    return scored


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
    one, one_logits = decode_logits(model, ids, 5)
    chunked, chunked_logits = decode_logits(model, ids, 5, chunk_size=48)
    scored = assert_same_greedy_decoding(one, one_logits, chunked, chunked_logits)
    assert scored.all()  # no near-tie anywhere (measured smallest gap 2.9e-4): every token compared
    with torch.no_grad():  # the first new token is picked from the logits of a plain forward
        plain = model(input_ids=ids).logits[:, -1]
    torch.testing.assert_close(one_logits[0], plain, atol=CROSS_PATH_ATOL, rtol=0)
    assert torch.equal(one[:, 0], plain.argmax(-1))  # a tolerance claim: the first step is scored


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
