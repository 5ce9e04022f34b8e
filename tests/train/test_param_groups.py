"""FPA's field learning-rate multiplier: the optimizer groups and the trainer's per-group lr."""

import json

import numpy as np
import pytest
import torch

from fpa.data import ByteTokenizer
from fpa.models import FPAConfig, FPAForCausalLM
from fpa.tasks.passkey import answer_loss
from fpa.train import parameter_groups, train


def _model(attention="fpa", mode="walk", **kw):
    cfg = FPAConfig.from_preset(
        "tiny",
        vocab_size=257,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        attention=attention,
        fpa={"mode": mode, **kw.pop("fpa", {})},
        **kw,
    )
    return FPAForCausalLM(cfg)


@pytest.mark.parametrize(
    "mode, heads", [("walk", ("increment_proj", "level_offset")), ("free", ("field_proj", "level_proj"))]
)
def test_field_parameters_get_the_multiplier(mode, heads):
    assert {g["lr_multiplier"] for g in parameter_groups(_model(mode=mode), 0.1)} == {1.0}  # the default
    model = _model(mode=mode, fpa={"field_lr_multiplier": 0.1})
    groups = parameter_groups(model, weight_decay=0.1)
    by_id = {id(p): g for g in groups for p in g["params"]}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    for name, p in model.named_parameters():
        g = by_id[id(p)]
        is_field = any(h in name for h in heads) or name.endswith("beta_param")
        assert g["lr_multiplier"] == (0.1 if is_field else 1.0), name
        assert g["weight_decay"] == (0.1 if p.dim() >= 2 else 0.0), name


def test_other_attention_types_and_an_explicit_multiplier():
    assert {g["lr_multiplier"] for g in parameter_groups(_model("fox"), 0.1)} == {1.0}
    assert {g["lr_multiplier"] for g in parameter_groups(_model(fpa={"field_lr_multiplier": 1.0}), 0.1)} == {1.0}
    assert {g["lr_multiplier"] for g in parameter_groups(_model(fpa={"field_lr_multiplier": 0.5}), 0.1)} == {0.5, 1.0}
    with pytest.raises(ValueError, match="field_lr_multiplier"):
        _model(fpa={"field_lr_multiplier": 0.0})


def test_trainer_applies_the_multiplier_per_group(tiny_cfg, monkeypatch):
    seen = []
    orig = torch.optim.AdamW.step

    def spy(self, *a, **kw):
        seen.append(sorted({(g["lr_multiplier"], g["lr"]) for g in self.param_groups}))
        return orig(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    cfg = tiny_cfg(attention="fpa", fpa_mode="walk", steps=3, warmup_steps=1, seq_len=128, eval_every=3)
    train(
        tiny_cfg(
            attention="fpa",
            fpa_mode="walk",
            steps=3,
            warmup_steps=1,
            seq_len=128,
            eval_every=3,
            model_overrides={**cfg.model_overrides, "fpa": {"field_lr_multiplier": 0.1}},
        )
    )
    for pairs in seen:
        (m_field, lr_field), (m_rest, lr_rest) = pairs
        assert (m_field, m_rest) == (0.1, 1.0) and lr_field == pytest.approx(0.1 * lr_rest)


def test_answer_loss_probe_is_logged_and_measures_the_answer(tiny_cfg):
    summary = train(tiny_cfg(steps=4, eval_every=2, seq_len=128, mix_task="passkey", mix_rate=0.5))
    recs = [json.loads(x) for x in open(summary["metrics"])]
    assert [r["step"] for r in recs if "task_loss" in r] == [2, 4]
    # a random model: the answer costs about ln(vocab) per token
    tok = ByteTokenizer()
    torch.manual_seed(0)
    loss = answer_loss(_model().eval(), tok, 128, n=4)
    assert abs(loss - np.log(257)) < 0.5
