"""Presets of ``fpa agent``: validation names the argument, the time estimate grows with the work and
keeps the cpu preset within the hour on 2 cores, ``fpa agent --help`` lists every preset's time."""

import dataclasses
import math

import pytest

from fpa.cli import build_parser
from fpa.experiments.agent.preset import PRESETS, RATES, AgentPreset, estimate_minutes, get_preset

SMOKE = PRESETS["smoke"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("steps", 0),
        ("batch_size", -1),
        ("seq_len", 1.5),
        ("control_sessions", True),
        ("chunk_size", 0),
        ("depth", 0),
        ("seeds", ()),
        ("seeds", (1, 1)),
        ("seeds", (-1,)),
        ("lengths", ()),
        ("lengths", (1200, 600, 2400)),
        ("lengths", (100, 1200, 2400)),  # shorter than a session of depth 4 can be
        ("sessions", (1, 1)),
        ("sessions", (1, 0, 1)),
        ("control_min", 0),
        ("control_min", 1.5),
        ("threshold", -1.0),
        ("threshold", math.nan),
        ("fox_threshold", True),
        ("seq_len", 64),  # too short for a session and its question
        ("evict_from_step", -1),
        ("evict_from_step", 3),  # SMOKE trains 3 steps: the rule would never switch on
        ("evict_from_step", 1.5),
        ("mix_task", "passkey"),  # not a session mixer
        ("threshold_start", 8.0),  # without ramp_steps
        ("ramp_steps", 2),  # without threshold_start
        ("straight_through", 1),
    ],
)
def test_a_bad_field_is_named(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(SMOKE, **{field: value})


def test_get_preset_and_the_dict_round_trip():
    with pytest.raises(ValueError, match="--preset must be one of"):
        get_preset("nope")
    for p in PRESETS.values():
        assert AgentPreset.from_dict(p.to_dict()) == p
        for L in p.lengths:
            assert len(p.session_seeds(L)) == p.sessions[p.lengths.index(L)]


def test_estimate_grows_with_steps_lengths_sessions_and_seeds():
    p = PRESETS["cpu"]
    base = estimate_minutes(p)
    no_ramp = dict(evict_from_step=0, threshold_start=None, ramp_steps=0)
    by_steps = [estimate_minutes(dataclasses.replace(p, steps=n, **no_ramp)) for n in (1, 10, 100, 1000)]
    assert by_steps == sorted(by_steps) and len(set(by_steps)) == len(by_steps)
    by_length = [estimate_minutes(dataclasses.replace(p, lengths=(L, 3 * L, 10 * L))) for L in (1000, 10_000, 30_000)]
    assert by_length == sorted(by_length) and len(set(by_length)) == len(by_length)
    assert estimate_minutes(dataclasses.replace(p, sessions=(8, 2, 1))) > base
    assert estimate_minutes(dataclasses.replace(p, seeds=(10, 11, 12, 13))) > base
    assert estimate_minutes(p, jobs=1) == pytest.approx(2 * base / RATES["parallel_slowdown"])
    # FPA's steps before its rule switches on are plain steps, cheaper than steps under the rule
    assert estimate_minutes(dataclasses.replace(p, **no_ramp)) > base
    with pytest.raises(ValueError, match="jobs"):
        estimate_minutes(p, jobs=0)


def test_cpu_preset_stays_near_the_hour_at_the_lengths_it_reports():
    # the hour is the target; the recipe closest to the 1x control takes 1500 steps and misses it
    # by the estimate's ~42 min (docs/design.md): this bounds the miss, so that a change that makes
    # it worse fails here
    p = PRESETS["cpu"]
    assert estimate_minutes(p, jobs=2) <= 105
    assert len(p.seeds) >= 3 and p.lengths == (10_000, 30_000, 100_000) and p.seq_len <= 1024
    assert estimate_minutes(SMOKE, jobs=1) < 1


def test_help_lists_every_preset_with_its_time(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser("agent").parse_args(["agent", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for name in PRESETS:
        assert f"  {name}: " in text
    assert f"~{estimate_minutes(PRESETS['cpu']):.0f} min" in text and "smoke: < 1 min" in text


def test_the_mix_task_reaches_the_trainer():
    from fpa.experiments.agent.workers import train_config

    p = dataclasses.replace(SMOKE, mix_task="agent-sessions+copy")
    assert train_config(p, "fox", 0, "/tmp/x", "/tmp/d", progress=False).mix_task == "agent-sessions+copy"


def test_live_reg_reaches_the_fpa_arm_from_the_rule_switch():
    from fpa.experiments.agent.preset import FOX_ARM, FPA_ARM
    from fpa.experiments.agent.workers import train_config

    p = dataclasses.replace(SMOKE, live_reg=0.1, evict_from_step=1)
    fpa = train_config(p, FPA_ARM, 0, "/tmp/x", "/tmp/d", progress=False)
    assert (fpa.live_reg, fpa.live_reg_threshold, fpa.live_reg_from_step) == (0.1, p.threshold, 1)
    assert train_config(p, FOX_ARM, 0, "/tmp/x", "/tmp/d", progress=False).live_reg == 0.0
    with pytest.raises(ValueError, match="live_reg must be a finite number >= 0"):
        dataclasses.replace(SMOKE, live_reg=-1.0)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(threshold_start=8.0, ramp_steps=3, evict_from_step=1), "the ramp must end by the last step"),
        (dict(threshold_start=1.0, ramp_steps=1), "threshold_start must be finite and > threshold=2.0"),
        (dict(threshold_start=math.inf, ramp_steps=1), "threshold_start must be finite"),
        (dict(threshold_start=8.0, ramp_steps=1, threshold=0.0), "a ramp needs"),
    ],
)
def test_a_bad_ramp_is_named(kw, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(SMOKE, **kw)


def test_the_ramp_reaches_the_fpa_arm_only():
    from fpa.experiments.agent.preset import FOX_ARM, FPA_ARM
    from fpa.experiments.agent.report import _ramp
    from fpa.experiments.agent.workers import train_config

    p = dataclasses.replace(SMOKE, threshold_start=8.0, ramp_steps=2, evict_from_step=1, straight_through=True)
    fpa = train_config(p, FPA_ARM, 0, "/tmp/x", "/tmp/d", progress=False)
    assert (fpa.evict_threshold_start, fpa.evict_ramp_steps, fpa.evict_from_step) == (8.0, 2, 1)
    assert fpa.evict_straight_through is True
    fox = train_config(p, FOX_ARM, 0, "/tmp/x", "/tmp/d", progress=False)
    assert (fox.evict_threshold_start, fox.evict_ramp_steps, fox.evict_straight_through) == (None, 0, False)
    assert _ramp(p) == ", its threshold falling from 8 to 2 over 2 steps, with straight-through gradients"
    assert _ramp(SMOKE) == ""
