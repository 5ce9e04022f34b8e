import math

from fpa.eval.report import accuracy_at, targets


def _grid(lengths, acc):
    return {"lengths": lengths, "depths": [0.0, 1.0], "accuracy_by_length": acc, "kept_fraction_mean": 0.24}


def _results(fpa8, fox_loss, rope8, own8=1.0):
    L = 10
    full = lambda a8: _grid([10, 80], [1.0, a8])  # noqa: E731
    return {"train_len": L, "methods": {
        "fpa-free": {"attention": "fpa", "loss": {"loss": 2.0}, "passkey": full(fpa8),
                     "cache": {"0.25": {"fpa": _grid([80], [own8])}}},
        "fox": {"attention": "fox", "loss": {"loss": fox_loss}, "passkey": full(0.5), "cache": {}},
        "softmax-rope": {"attention": "softmax_rope", "loss": {"loss": 1.9}, "passkey": full(rope8), "cache": {}}}}


def test_targets_are_measured_not_assumed():
    t = targets(_results(1.0, 2.0, 0.0))
    assert t["fpa_passkey_8x_full"] == {"fpa-free": 1.0}
    assert t["fpa_passkey_8x_cache25"]["fpa-free"] == {"accuracy": 1.0, "kept_fraction": 0.24}
    assert t["fpa_loss_vs_fox"]["fpa-free"] == 0.0 and t["baselines_100_at_8x"] == []
    t = targets(_results(0.9, 1.9, 1.0, own8=0.5))
    assert t["fpa_passkey_8x_full"] == {"fpa-free": 0.9}
    assert t["fpa_loss_vs_fox"]["fpa-free"] > 0.01 and t["baselines_100_at_8x"] == ["softmax-rope"]
    assert math.isnan(accuracy_at(_grid([10], [1.0]), 80))
