"""The packed one-head models (fpa.models.packed): independence of the packed models, per-model
clipping, argument checks and the methods' FPA options."""

import pytest
import torch

from fpa.layers import FPAOptions
from fpa.models.packed import METHODS, PackedModels, method_options
from fpa.tasks.probe import attention_probs


@pytest.mark.parametrize("method", sorted(METHODS))
def test_packed_models_are_independent(method):
    """Model 0's prediction and attention do not depend on model 1's tokens; gradients stay in-block."""
    torch.manual_seed(1)
    model = PackedModels(method, 2, vocab_size=5, dim=2, embed_dim=4)
    tok = torch.randint(0, 5, (3, 2, 7))
    tok2 = tok.clone()
    tok2[:, 1] = torch.randint(0, 5, (3, 7))
    torch.testing.assert_close(model(tok)[:, 0], model(tok2)[:, 0])
    model(tok)[:, 0].sum().backward()
    w = model.attn.q_proj.weight
    assert w.grad[2:, :].abs().sum() == 0 and w[:2, 4:].abs().sum() == 0
    p, _ = attention_probs(model.attn, model.hidden(tok))
    p2, _ = attention_probs(model.attn, model.hidden(tok2))
    torch.testing.assert_close(p[:, 0], p2[:, 0])


def test_bad_arguments():
    with pytest.raises(ValueError, match="method must be one of"):
        PackedModels("softmax", 1, 4, 2)
    with pytest.raises(ValueError, match=r"dim must be a positive int \(head dimension d\)"):
        PackedModels("fox", 1, 4, 0)


@pytest.mark.parametrize("method", ["fpa-walk", "fox", "softmax-alibi"])
def test_readout_all_and_per_model_clipping(method):
    """readout_all's last column is forward(); clipping scales each model's gradient on its own."""
    torch.manual_seed(2)
    model = PackedModels(method, 2, vocab_size=5, dim=2, embed_dim=4)
    tok = torch.randint(0, 5, (3, 2, 7))
    torch.testing.assert_close(model.readout_all(model.attn(model.hidden(tok)))[..., -1], model(tok))
    out = model(tok)
    (out[:, 0].sum() * 1e3 + out[:, 1].sum() * 1e-3).backward()  # model 0 large, model 1 tiny gradient
    before = {n: p.grad.clone() for n, p in model.named_parameters()}
    norms = model.clip_grad_norm_(1.0)
    assert norms[0] > 1.0 > norms[1]
    after = model.clip_grad_norm_(1.0)  # norms after clipping
    assert after[0] == pytest.approx(1.0, rel=1e-4)
    assert after[1] == pytest.approx(float(norms[1]), rel=1e-5)  # untouched by model 0's large norm
    for n, p in model.named_parameters():
        g0 = before[n].reshape(2, -1)
        torch.testing.assert_close(p.grad.reshape(2, -1)[1], g0[1])


def test_the_walk_method_starts_with_a_head_offset_of_one():
    """fpa-walk's synthetic heads set a head offset explicitly: level = field + c_h, c_h = 1 at
    initialisation (not the library default, which has no offset)."""
    walk = PackedModels("fpa-walk", 3, 6, 2).attn
    assert walk.level_offset_kind == "head" and walk.level_offset.tolist() == [1.0, 1.0, 1.0]
    assert PackedModels("fpa-free", 3, 6, 2).attn.level_offset_kind is None


def test_method_options_are_the_method_s_with_overrides():
    assert method_options("fpa-walk") == FPAOptions(level_offset="head", level_offset_init=1.0)
    assert method_options("fpa-walk", {"level_offset": "none"}) == FPAOptions()
    assert method_options("fpa-free") == FPAOptions(mode="free")
    with pytest.raises(ValueError, match="did you mean 'level_offset'"):
        method_options("fpa-walk", {"fpa_level_offset": "none"})  # the former config name
    with pytest.raises(ValueError, match="no FPA layer"):
        method_options("fox")
    with pytest.raises(ValueError, match="did you mean 'fpa-walk'"):
        method_options("fpa_walk")
