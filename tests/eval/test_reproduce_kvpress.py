"""kvpress rows in `fpa reproduce` (runs where the kvpress extra imports: CI's low-transformers env)."""

import json

import pytest

from fpa.experiments.presets import get_preset
from fpa.experiments.reproduce import kvpress_available, reproduce


def test_without_kvpress_the_report_says_how_to_add_it(tmp_path, monkeypatch):
    import fpa.experiments.reproduce as R

    monkeypatch.setattr(R, "kvpress_available", lambda: "ImportError: no kvpress")
    logs = []
    res = reproduce(get_preset("smoke"), tmp_path, progress=False, methods=("softmax-rope",), seeds=(0,),
                    log=logs.append)
    assert res["kvpress"] == {} and any("kvpress stages skipped" in m for m in logs)
    assert "Rerun `fpa reproduce`" in (tmp_path / "report.md").read_text()


@pytest.mark.skipif(kvpress_available() is not None, reason="kvpress not importable here (pins transformers<5.3)")
def test_kvpress_rows_beside_the_full_cache(tmp_path):
    res = reproduce(get_preset("smoke"), tmp_path, progress=False, methods=("softmax-rope",), seeds=(0,),
                    log=lambda m: None)
    rows = res["kvpress"]["softmax-rope"]
    assert [(r["press"], r["compression_ratio"]) for r in rows] == [("knorm", 0.5), ("snapkv", 0.5),
                                                                   ("streaming_llm", 0.5)]
    for r in rows:
        assert r["lengths"] == [128, 256] and 0.3 < r["kept_fraction"] < 0.7
    assert "| softmax-rope | knorm | 0.5 |" in (tmp_path / "report.md").read_text()
    assert "kvpress" in json.loads((tmp_path / "results.json").read_text())
