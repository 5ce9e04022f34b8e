from fpa.experiments.plots import plot_cache_curves


def _pt(setting, kept, acc, lo, hi):
    return {"setting": setting, "kept_fraction": kept, "kept_fraction_min": kept, "kept_fraction_max": kept,
            "accuracy_by_multiple": {"8": acc}, "accuracy_min_by_multiple": {"8": lo},
            "accuracy_max_by_multiple": {"8": hi}}


def test_cache_curve_plot_accepts_a_mean_an_ulp_outside_min_max(tmp_path):
    third = (0.1 + 0.1 + 0.1) / 3  # 0.10000000000000002, above the max of three 0.1s
    curves = {"fpa-walk": {"full": [_pt(None, 1.0, 1.0, 1.0, 1.0)],
                           "fpa": [_pt(2.0, 0.2, third, 0.1, 0.1), _pt(8.0, 0.3, 0.5, 0.2, 0.9)]}}
    out = tmp_path / "kept-8x.png"
    plot_cache_curves(curves, "8", out, "title")
    assert out.stat().st_size > 1000
