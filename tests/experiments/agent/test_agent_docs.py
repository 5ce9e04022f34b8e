"""Every ```python block of docs/agent.md runs as pasted, and the command it documents exists."""

import re
from pathlib import Path

import pytest

from fpa.cli import COMMANDS
from fpa.experiments.agent.preset import PRESETS

DOC = Path(__file__).resolve().parents[3] / "docs" / "agent.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_a_snippet_and_names_every_preset():
    text = DOC.read_text()
    assert BLOCKS and "agent" in COMMANDS
    for name in PRESETS:
        assert f"`{name}`" in text


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_snippet_runs(i, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[i], f"docs/agent.md block {i}", "exec"), {"__name__": f"agent_doc_{i}"})
    printed = capsys.readouterr().out.split()
    assert printed[0] in ("True", "False")  # the answer was scored
