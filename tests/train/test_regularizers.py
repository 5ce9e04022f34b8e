import pytest
import torch

from fpa.models import FPAConfig, FPAForCausalLM
from fpa.ops.field import dip
from fpa.train import train
from fpa.train.regularizers import LiveFractionRegularizer


def _model(attention="fpa"):
    torch.manual_seed(0)
    cfg = FPAConfig.from_preset(
        "tiny",
        vocab_size=257,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        attention=attention,
        fpa={"mode": "walk"},
    )
    return FPAForCausalLM(cfg)


def test_penalty_is_the_soft_live_fraction_and_has_gradients():
    model = _model().train()
    for layer in model.model.layers:
        layer.attn.increment_proj.weight.data.normal_(0, 0.5)
    reg = LiveFractionRegularizer(model, weight=2.0, threshold=1.0, temperature=0.1)
    x = torch.randint(0, 257, (2, 24))
    model(input_ids=x)
    pen = reg.penalty()
    # recompute from the definition on layer 0 and 1 inputs captured by a second hook
    seen = []
    hs = [
        m.model.layers[i].attn.register_forward_hook(lambda mod, a, o: seen.append((mod, a[0])))
        for m in (model,)
        for i in range(2)
    ]
    model(input_ids=x)
    reg.penalty()
    for h in hs:
        h.remove()
    vals = []
    for mod, inp in seen:
        f, lv = mod.field_level(inp)
        p = mod.beta[None, :, None, None] * dip(f, lv)
        i, j = torch.tril_indices(24, 24, -1)
        vals.append(torch.sigmoid((1.0 - p[..., i, j]) / 0.1).mean())
    assert pen.item() == pytest.approx(2.0 * torch.stack(vals).mean().item(), rel=1e-5)
    assert 0 < pen.item() < 2.0
    model(input_ids=x)
    reg.penalty().backward()
    assert model.model.layers[0].attn.increment_proj.weight.grad.abs().sum() > 0
    model.eval()
    model(input_ids=x)
    assert reg.penalty().item() == 0.0  # nothing recorded outside training
    reg.close()


def test_bad_arguments_and_models():
    with pytest.raises(ValueError, match="threshold must be a finite number > 0"):
        LiveFractionRegularizer(_model(), weight=1.0, threshold=0.0)
    with pytest.raises(ValueError, match="FPA attention"):
        LiveFractionRegularizer(_model("fox"), weight=1.0, threshold=1.0)


def test_trainer_uses_it(tiny_cfg):
    summary = train(tiny_cfg(attention="fpa", fpa_mode="walk", steps=2, live_reg=0.5, live_reg_threshold=4.0))
    assert summary["steps"] == 2
    with pytest.raises(ValueError, match="live_reg needs attention='fpa'"):
        tiny_cfg(attention="fox", live_reg=0.5)


def test_inactive_regularizer_computes_nothing():
    model = _model().train()
    reg = LiveFractionRegularizer(model, weight=1.0, threshold=1.0)
    reg.active = False
    model(input_ids=torch.randint(0, 257, (1, 8)))
    assert reg.penalty().item() == 0.0
    reg.active = True
    model(input_ids=torch.randint(0, 257, (1, 8)))
    assert reg.penalty().item() > 0
    reg.close()


def test_trainer_starts_it_at_live_reg_from_step(tiny_cfg, monkeypatch):
    seen = []
    original = LiveFractionRegularizer.penalty

    def spy(self):
        out = original(self)
        seen.append(out.item())
        return out

    monkeypatch.setattr(LiveFractionRegularizer, "penalty", spy)
    train(tiny_cfg(attention="fpa", fpa_mode="walk", steps=4, live_reg=0.5, live_reg_from_step=2))
    assert len(seen) == 4 and seen[:2] == [0.0, 0.0] and min(seen[2:]) > 0
    with pytest.raises(ValueError, match="live_reg_from_step is 2 but live_reg is 0"):
        tiny_cfg(attention="fpa", live_reg_from_step=2)
    with pytest.raises(ValueError, match="live_reg_from_step must be a non-negative int"):
        tiny_cfg(attention="fpa", live_reg=0.5, live_reg_from_step=-1)
