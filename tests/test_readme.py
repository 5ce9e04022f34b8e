"""Every ```python block of the README runs as pasted (in order, each in a fresh namespace)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_block_runs(i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[i], f"README.md block {i}", "exec"), {"__name__": f"readme_{i}"})


def test_nothing_points_outside_the_repository():
    root = README.parent
    for path in [README, *sorted((root / "docs").rglob("*.md"))]:
        assert "../shared" not in path.read_text(), path
