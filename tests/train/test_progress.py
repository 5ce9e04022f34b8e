"""Console output of training: plain progress lines where there is no bar, no transformers bars
under --no-progress, and [stage] lines that go through tqdm.write."""

from __future__ import annotations

import re
import sys

import pytest
import tqdm
from transformers.utils import logging as hf_logging

from fpa.train import train
from fpa.train.progress import StepProgress

LINE = re.compile(r"^\[train run\] step (\d+)/8 loss \d+\.\d{4} tok/s [\d,]+ eta \d+m\d\ds$")


def test_no_progress_prints_a_line_every_log_every_steps_and_no_transformers_bar(tiny_cfg, capsys):
    assert hf_logging.is_progress_bar_enabled()
    train(tiny_cfg(progress=False, log_every=3))
    out, err = capsys.readouterr()
    lines = [ln for ln in out.splitlines() if ln.startswith("[train")]
    assert [int(LINE.match(ln).group(1)) for ln in lines if LINE.match(ln)] == [3, 6, 8], out
    assert len(lines) == 3
    assert "Writing model shards" not in err and "%|" not in err
    assert hf_logging.is_progress_bar_enabled()  # the switch is restored


def test_transformers_bar_is_visible_without_the_switch(tiny_cfg, tmp_path, capsys):
    """The check above can fail: the same save with transformers' bars on writes its bar."""
    from fpa.train.model_setup import build_model

    model = build_model(tiny_cfg(), 256)
    model.save_pretrained(tmp_path / "m")
    assert "Writing model shards" in capsys.readouterr().err


def test_redirected_stdout_gets_lines_even_with_progress_on(tiny_cfg, capsys):
    train(tiny_cfg(progress=True, steps=4, log_every=2))  # capsys: stdout is not a terminal
    out, err = capsys.readouterr()
    assert [ln.split()[3] for ln in out.splitlines() if ln.startswith("[train")] == ["2/4", "4/4"], out
    assert "Writing model shards" not in err


def test_a_terminal_gets_a_bar_and_no_lines(monkeypatch, capsys):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    shown = StepProgress("train x", 0, 4, 1, bar=True)
    assert shown.is_bar
    for step in range(1, 5):
        shown.update(step, 2.0, 100.0)
    shown.close()
    out, err = capsys.readouterr()
    assert "[train x] step" not in out and "4/4" in err


def test_lines_go_through_tqdm_write(monkeypatch):
    written: list[str] = []
    monkeypatch.setattr(tqdm.tqdm, "write", classmethod(lambda cls, s, *a, **k: written.append(s)))
    StepProgress("train x", 0, 2, 1, bar=False).update(1, 1.5, 10.0)
    assert written and written[0].startswith("[train x] step 1/2 loss 1.5000 tok/s 10 eta ")


@pytest.mark.parametrize("every", [0, True, 1.5])
def test_bad_interval(every):
    with pytest.raises(ValueError, match="every must be a positive int"):
        StepProgress("x", 0, 2, every)
