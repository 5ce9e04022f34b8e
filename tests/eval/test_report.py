import math

from fpa.experiments.report import (at_multiple, control_table, control_verdicts, lossless_point,
                              served_as_trained_table, verdicts)


def _method(attention, acc8_by_seed, loss_by_seed, curve=None):
    L = 10
    seeds = [{"seed": i, "loss": {"loss": lo},
              "passkey": {"lengths": [10, 80], "accuracy_by_length": [1.0, a]}} for i, (a, lo) in
             enumerate(zip(acc8_by_seed, loss_by_seed))]
    acc8 = [s["passkey"]["accuracy_by_length"][1] for s in seeds]
    return {"attention": attention, "ablation": False, "seeds": seeds,
            "loss": {"loss": sum(loss_by_seed) / len(loss_by_seed)},
            "passkey": {"lengths": [10, 8 * L], "accuracy_by_length": [1.0, sum(acc8) / len(acc8)],
                        "accuracy_by_length_min": [1.0, min(acc8)], "accuracy_by_length_max": [1.0, max(acc8)]},
            "cache_curve": curve or {}}


def _pt(setting, kept, accs):
    return {"setting": setting, "kept_fraction": kept, "kept_fraction_min": kept, "kept_fraction_max": kept,
            "accuracy_by_multiple": {"8": sum(accs) / len(accs)},
            "seeds": [{"seed": i, "accuracy_by_multiple": {"8": a}} for i, a in enumerate(accs)]}


def _results(fpa8, fox_loss, curve=None):
    return {"train_len": 10, "preset": {"cache_multiples": [8]}, "methods": {
        "fpa-walk": _method("fpa", fpa8, [2.0, 2.0], curve),
        "fox": _method("fox", [0.5, 0.5], [fox_loss, fox_loss])}}


def test_lossless_point_needs_every_seed_to_match_the_full_cache():
    curve = {"full": [_pt(None, 1.0, [1.0, 0.5])],
             "fpa": [_pt(2.0, 0.10, [1.0, 0.0]), _pt(8.0, 0.20, [1.0, 0.5]), _pt(32.0, 0.30, [1.0, 0.5])]}
    m = _method("fpa", [1.0, 0.5], [2.0, 2.0], curve)
    assert lossless_point(m, "fpa", "8")["setting"] == 8.0
    curve["fpa"] = [_pt(2.0, 0.10, [1.0, 0.0])]
    assert lossless_point(m, "fpa", "8") is None
    curve["fpa"] = [_pt(2.0, 0.10, [1.0, 0.6])]  # above the full cache on seed 1: nothing lost
    assert lossless_point(m, "fpa", "8")["setting"] == 2.0
    assert lossless_point(m, "fox", "8") is None


def test_verdicts_are_measured_not_assumed():
    curve = {"full": [_pt(None, 1.0, [1.0, 1.0])], "fpa": [_pt(4.0, 0.24, [1.0, 1.0])]}
    v = "\n".join(verdicts(_results([1.0, 1.0], 2.0, curve)))
    assert "+0.00% vs FoX" in v and "reproduced (bar" in v
    assert "Perfect passkey at 8x** (fpa-walk, full cache): 100% over seeds: reproduced" in v
    assert "keeps 24.0%" in v and "24.0 kept" not in v and ": reproduced." in v
    v = "\n".join(verdicts(_results([1.0, 0.9], 1.9)))
    assert "not reproduced (bar" in v and "reproduced on some seeds" in v
    assert "at 100% on every seed: none" in v
    assert math.isnan(at_multiple(_method("fox", [1.0], [1.0]), 16, 10)[0])


def test_control_flags_every_seed_below_the_bar_and_conditions_extrapolation_on_it():
    r = _results([1.0, 0.5], 2.0)
    r["preset"]["passkey_multiples"] = [1, 8]
    r["methods"]["fox"]["seeds"][1]["passkey"]["accuracy_by_length"] = [0.2, 0.0]
    r["methods"]["fox"]["seeds"][1]["train"] = {"task_loss_curve": [{"step": 10, "task_loss": 1.9}]}
    v = "\n".join(control_verdicts(r))
    assert "missed by fox seed 1 (20%)" in v
    assert "fpa-walk, on the 2 of 2 seeds that passed the control: 8x 75% [50-100]" in v
    assert "fox, on the 1 of 2 seeds that passed the control: 8x 50%" in v
    table = control_table(r)
    assert "| fox | 1 | 1.900 | 20% | 0% | failed: never learned to copy |" in table
    assert table.count("| passed |") == 3
    r["methods"]["fox"]["seeds"][1]["passkey"]["accuracy_by_length"] = [0.95, 0.0]
    assert "Positive control" in control_verdicts(r)[0] and control_verdicts(r)[0].endswith("met.")


def test_verdicts_of_a_run_with_ablations_only_say_so():
    """`fpa reproduce --methods fpa-walk-legacy` runs no main method: the report says the claims
    need them instead of failing."""
    r = _results([1.0, 1.0], 2.0)
    r["methods"] = {"fpa-walk-legacy": {**r["methods"]["fpa-walk"], "ablation": True}}
    assert verdicts(r)[-1] == "- The claims compare the main methods; this run has ablations only."


def test_served_as_trained_table_pairs_each_tau_after_and_within_chunks():
    def pt(tau, acc, kept):
        return {"setting": tau, "accuracy_by_multiple": {"8": acc}, "kept_by_multiple": {"8": kept}}

    r = _results([1.0, 1.0], 2.0)
    assert served_as_trained_table(r) == "(no run trained with the rule in the loop)"
    r["methods"]["fpa-walk-evict2"] = {"attention": "fpa", "ablation": True, "cache_curve": {"fpa-within": []},
                                       "seeds": [{"seed": 0, "cache_curve": {"fpa": [pt(2.0, 0.1, 0.3)],
                                                                             "fpa-within": [pt(2.0, 0.9, 0.3)]}}]}
    assert "| fpa-walk-evict2 | 0 | 2 | 10% (30.0%) | 90% (30.0%) |" in served_as_trained_table(r)
