"""``fpa train --evict-threshold``: the trainer trains FPA under its eviction rule, and its evaluations
(held-out loss, the passkey probe) measure the model under it too."""

import pytest
import torch

import fpa.layers.first_passage as first_passage
from fpa.cli import main
from fpa.train import train


def test_trainer_trains_through_the_evicting_attention(tiny_cfg, monkeypatch):
    calls = []
    real = first_passage.evicting_attention

    def counting(*args, **kw):
        calls.append(args[3].shape)  # the field (B, H, T)
        return real(*args, **kw)

    monkeypatch.setattr(first_passage, "evicting_attention", counting)
    summary = train(tiny_cfg(attention="fpa", fpa_mode="walk", steps=2, eval_every=2, evict_threshold=2.0))
    assert summary["steps"] == 2 and summary["final_train_loss"] is not None
    # 2 layers x 2 steps in training, then the held-out evaluation at step 2 (eval mode) under the rule too
    assert len(calls) > 4 and calls[0] == (4, 2, 65)  # a window is seq_len + 1 tokens (labels = inputs)


def test_eviction_starts_at_evict_from_step_also_after_a_resume(tiny_cfg, monkeypatch):
    calls = []
    real = first_passage.evicting_attention
    # count the training forwards (with grad); the evaluations (no grad) run under the rule too once it is on
    monkeypatch.setattr(
        first_passage,
        "evicting_attention",
        lambda *a, **k: (torch.is_grad_enabled() and calls.append(1), real(*a, **k))[1],
    )
    train(
        tiny_cfg(
            attention="fpa",
            fpa_mode="walk",
            steps=4,
            ckpt_every=2,
            eval_every=4,
            evict_threshold=2.0,
            evict_from_step=3,
        )
    )
    assert len(calls) == 2  # step 3 only, 2 layers
    calls.clear()
    train(
        tiny_cfg(
            attention="fpa",
            fpa_mode="walk",
            steps=6,
            ckpt_every=2,
            eval_every=4,
            evict_threshold=2.0,
            evict_from_step=3,
        )
    )  # resumes at step 4: eviction on from the start
    assert len(calls) == 4
    with pytest.raises(ValueError, match="evict_from_step is 3 but evict_threshold is not set"):
        tiny_cfg(attention="fpa", evict_from_step=3)


def test_resume_with_another_threshold_is_refused(tiny_cfg):
    train(tiny_cfg(attention="fpa", fpa_mode="walk", steps=4, evict_threshold=2.0))
    with pytest.raises(ValueError, match=r"settings differ.*'evict_threshold': \(2.0, 4.0\)"):
        train(tiny_cfg(attention="fpa", fpa_mode="walk", steps=6, evict_threshold=4.0))


def test_cli_flag_is_a_float_and_bad_values_are_clean_errors(tmp_path, capsys):
    args = ["train", "--out-dir", str(tmp_path / "r"), "--attention", "softmax_rope", "--evict-threshold", "2"]
    assert main(args) == 2
    assert "evict_threshold needs attention='fpa' or 'fox'" in capsys.readouterr().err
    assert main(["train", "--out-dir", str(tmp_path / "r"), "--attention", "fpa", "--evict-threshold", "-1"]) == 2
    assert "evict_threshold must be a finite number >= 0" in capsys.readouterr().err


def test_the_ramp_falls_geometrically_from_its_start(tiny_cfg):
    cfg = tiny_cfg(
        attention="fpa",
        fpa_mode="walk",
        steps=8,
        evict_threshold=2.0,
        evict_from_step=2,
        evict_threshold_start=32.0,
        evict_ramp_steps=4,
    )
    # 32 * (2 / 32) ** (k / 4): 32, 16, 8, 4 on the ramp's steps, then 2
    assert [cfg.evict_threshold_at(s) for s in range(8)] == [None, None, 32.0, 16.0, 8.0, 4.0, 2.0, 2.0]
    plain = tiny_cfg(attention="fpa", fpa_mode="walk", steps=8, evict_threshold=2.0, evict_from_step=2)
    assert [plain.evict_threshold_at(s) for s in range(4)] == [None, None, 2.0, 2.0]
    assert tiny_cfg(attention="fpa").evict_threshold_at(5) is None


def test_the_trainer_follows_the_ramp_also_after_a_resume(tiny_cfg, monkeypatch):
    import fpa.train.loop as loop

    seen = []
    real = loop.set_training_eviction
    monkeypatch.setattr(loop, "set_training_eviction", lambda m, t, st: (seen.append(t), real(m, t, st))[1])
    kw = dict(
        attention="fpa",
        fpa_mode="walk",
        ckpt_every=3,
        eval_every=100,
        evict_threshold=2.0,
        evict_from_step=1,
        evict_threshold_start=8.0,
        evict_ramp_steps=2,
    )
    train(tiny_cfg(steps=3, **kw))
    assert seen == [None, 8.0, 4.0]  # step 0 plain, then the ramp
    seen.clear()
    train(tiny_cfg(steps=5, **kw))  # resumes at step 3: the ramp is over
    assert seen == [2.0]


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            dict(evict_threshold=2.0, evict_threshold_start=8.0),
            "evict_threshold_start and evict_ramp_steps go together",
        ),
        (dict(evict_threshold=2.0, evict_ramp_steps=3), "evict_threshold_start and evict_ramp_steps go together"),
        (dict(evict_threshold_start=8.0, evict_ramp_steps=3), "a ramp needs evict_threshold > 0"),
        (dict(evict_threshold=0.0, evict_threshold_start=8.0, evict_ramp_steps=3), "a ramp needs evict_threshold > 0"),
        (dict(evict_threshold=2.0, evict_threshold_start=1.0, evict_ramp_steps=3), "evict_threshold_start must be"),
        (dict(evict_threshold=2.0, evict_threshold_start=8.0, evict_ramp_steps=-1), "evict_ramp_steps"),
    ],
)
def test_a_bad_ramp_is_refused(tiny_cfg, kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_cfg(attention="fpa", **kw)


def test_cli_takes_the_ramp(tmp_path, capsys):
    args = ["train", "--out-dir", str(tmp_path / "r"), "--attention", "fpa", "--evict-threshold", "2"]
    assert main([*args, "--evict-threshold-start", "1", "--evict-ramp-steps", "3"]) == 2
    assert "evict_threshold_start must be" in capsys.readouterr().err


def test_straight_through_reaches_every_layer_from_the_trainer_and_the_cli(tiny_cfg, tmp_path, monkeypatch):
    import fpa.train.loop as loop

    seen = []
    real = loop.set_training_eviction
    monkeypatch.setattr(loop, "set_training_eviction", lambda m, t, st: (seen.append((t, st)), real(m, t, st))[1])
    train(tiny_cfg(attention="fpa", fpa_mode="walk", steps=2, evict_threshold=2.0, evict_straight_through=True))
    assert seen == [(2.0, True)]
    with pytest.raises(ValueError, match="evict_straight_through is set but evict_threshold is not"):
        tiny_cfg(attention="fpa", evict_straight_through=True)
    with pytest.raises(ValueError, match="evict_straight_through must be true or false"):
        tiny_cfg(attention="fpa", evict_threshold=2.0, evict_straight_through="yes")
    from fpa.cli import build_parser

    args = build_parser("train").parse_args(
        ["train", "--out-dir", "x", "--evict-threshold", "2", "--evict-straight-through"]
    )
    assert args.evict_straight_through is True
