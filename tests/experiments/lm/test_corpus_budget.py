"""fpa reproduce refuses a corpus too small for its preset's token budget, before anything else."""

from __future__ import annotations

import inspect

import pytest

from fpa.cli import main
from fpa.data.prepare import prepare_corpus
from fpa.experiments.lm import corpus_budget as cb
from fpa.experiments.lm.presets import PRESETS


def test_110m_budget_arithmetic():
    p = PRESETS["110m"]
    tokens = p.steps * p.batch_size * p.train_len * (1 - p.mix_rate)
    assert cb.text_tokens_per_run(p) == round(tokens)
    assert cb.bytes_needed(p) == round(tokens * 4.5 / 0.95)
    assert inspect.signature(prepare_corpus).parameters["val_fraction"].default == cb.VAL_FRACTION


def test_110m_refuses_its_default_corpus_before_any_stage(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["reproduce", "--preset", "110m", "--out", str(out)]) != 0
    err = capsys.readouterr().err
    need = f"{cb.bytes_needed(PRESETS['110m']):,} bytes"
    assert "--data-source" in err and need in err and "no --data-source" in err, err
    assert not out.exists() or not any(out.iterdir()), "nothing may be written before the check"


def test_small_local_corpus_and_small_cap_are_refused(tmp_path):
    p = PRESETS["110m"]
    small = tmp_path / "c.txt"
    small.write_text("some text\n" * 1000)
    with pytest.raises(ValueError, match=r"--data-source '.*c\.txt' holds 0\.0 MB of text, too little"):
        cb.check_corpus_budget(p, str(small), None)
    with pytest.raises(ValueError, match="--max-bytes caps the corpus at 1.0 GB, too little"):
        cb.check_corpus_budget(p, "hf:HuggingFaceFW/fineweb-edu:sample-100BT", 10**9)
    with pytest.raises(ValueError, match="--data-source 'nowhere/at/all'"):
        cb.check_corpus_budget(p, "nowhere/at/all", None)
    # streamed: the size is not known here, only a cap below the need is refused
    cb.check_corpus_budget(p, cb.SUGGESTED, None)
    cb.check_corpus_budget(p, cb.SUGGESTED, cb.bytes_needed(p))


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "110m"])
def test_cpu_presets_fit_their_corpus(name):
    cb.check_corpus_budget(PRESETS[name], None, None)
