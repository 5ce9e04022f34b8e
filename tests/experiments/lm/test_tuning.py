"""The tuning stage's selection rules on hand-made validation figures."""

import pytest

from fpa.experiments.lm.tuning import config_rows, select_config, select_threshold


def _val(seed, loss, acc):
    return {"seed": seed, "loss": {"loss": loss}, "passkey": {"accuracy_by_length": acc}}


def _rows():
    specs = [
        {"name": "m[a]", "base": "m", "model": {}, "train": {}},
        {"name": "m[b]", "base": "m", "model": {}, "train": {}},
        {"name": "m[c]", "base": "m", "model": {}, "train": {}},
        {"name": "n[a]", "base": "n", "model": {}, "train": {}},
    ]
    val = {
        "m[a]": [_val(0, 1.5, [1.0, 0.5]), _val(1, 1.6, [1.0, 0.3])],  # score 0.7
        "m[b]": [_val(0, 1.4, [1.0, 0.2]), _val(1, 1.4, [1.0, 0.4])],  # score 0.65
        "m[c]": [_val(0, 1.3, [1.0, 0.48]), _val(1, 1.3, [1.0, 0.3])],  # score 0.695: within 0.01, lower loss
        "n[a]": [_val(0, 2.0, [0.0, 0.0]), _val(1, 2.0, [0.0, 0.0])],
    }
    return config_rows(specs, val)


def test_rows_average_over_seeds():
    r = {x["name"]: x for x in _rows()}
    assert r["m[a]"]["score"] == pytest.approx(0.7) and r["m[a]"]["val_loss"] == pytest.approx(1.55)
    assert r["m[a]"]["val_passkey_by_length"] == pytest.approx([1.0, 0.4]) and r["m[a]"]["seeds"] == [0, 1]


def test_best_score_then_lowest_loss_within_the_tie_band():
    assert select_config(_rows(), "m")["name"] == "m[c]"
    assert select_config(_rows(), "n")["name"] == "n[a]"
    rows = _rows() + [{**_rows()[0], "name": "m-rule[a]", "arm": "m-rule", "score": 0.0}]
    assert select_config(rows, "m")["name"] == "m[c]" and select_config(rows, "m-rule")["name"] == "m-rule[a]"
    with pytest.raises(ValueError, match="no tuning configuration"):
        select_config(_rows(), "zzz")


def test_threshold_is_the_smallest_within_tolerance_of_the_full_cache():
    full = [1.0, 0.8]  # mean 0.9
    sweeps = [
        {"threshold": 2.0, "accuracy_by_length": [0.5, 0.3], "kept_by_length": [0.1, 0.1]},
        {"threshold": 8.0, "accuracy_by_length": [1.0, 0.77], "kept_by_length": [0.3, 0.2]},  # 0.885: within 0.02
        {"threshold": 4.0, "accuracy_by_length": [0.9, 0.6], "kept_by_length": [0.2, 0.15]},
    ]
    pick = select_threshold(full, sweeps, 0.02)
    assert pick["threshold"] == 8.0 and pick["within"] and pick["kept"] == pytest.approx(0.25)
    none = select_threshold(full, sweeps[:1], 0.02)
    assert none["threshold"] == 2.0 and not none["within"]
