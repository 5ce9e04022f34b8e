"""Corpus sources: turn a ``source`` spec into a deterministic stream of named text documents.

A source is ``"stdlib"`` (the running interpreter's standard-library ``.py`` files, one document
per file), a file, a folder (every ``.txt``, ``.md``, ``.py``, ``.json``/``.jsonl`` file in it,
recursively), a glob, a list of those, or ``"hf:NAME[:CONFIG]"`` (a Hugging Face dataset,
streamed, its ``text`` column). ``.jsonl`` files give one document per line (its ``text`` field);
text files larger than ``CHUNK_BYTES`` are cut into documents at line boundaries so a
single-file corpus still has a held-out split.
"""

from __future__ import annotations

import glob as globlib
import json
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".json", ".jsonl")
CHUNK_BYTES = 1 << 16


@dataclass(frozen=True)
class Document:
    """One document of a corpus: a name locating it (file, line or chunk) and its text."""

    name: str
    text: str


def stdlib_files() -> list[Path]:
    """The standard library's .py files (site-packages excluded), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)


def resolve_files(source: str | Path) -> list[Path]:
    """A file, a folder (recursive, TEXT_SUFFIXES) or a glob -> sorted list of files."""
    path = Path(source)
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    matches = sorted(Path(p) for p in globlib.glob(str(source), recursive=True) if Path(p).is_file())
    if not matches:
        raise ValueError(
            f"source must be 'stdlib', 'hf:NAME[:CONFIG]', an existing file, folder or a glob "
            f"matching files; {str(source)!r} matches nothing"
        )
    return matches


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None  # not UTF-8 text (the stdlib has a few deliberately broken test files)


def _chunks(name: str, text: str) -> Iterator[Document]:
    """Cut text into ~CHUNK_BYTES documents at line boundaries."""
    if len(text) <= CHUNK_BYTES:
        yield Document(name, text)
        return
    start, k = 0, 0
    while start < len(text):
        end = text.find("\n", start + CHUNK_BYTES)
        end = len(text) if end < 0 else end + 1
        yield Document(f"{name}#{k}", text[start:end])
        start, k = end, k + 1


def file_documents(path: Path) -> Iterator[Document]:
    """The documents of one file: one per non-empty line of a ``.jsonl`` (its ``text`` field),
    else the file's text in chunks of about ``CHUNK_BYTES`` cut at line boundaries.

    Raises:
        ValueError: If a ``.jsonl`` line is not a JSON object with a ``text`` field.
    """
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f):
                if line.strip():
                    try:
                        yield Document(f"{path}:{i}", json.loads(line)["text"])
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        raise ValueError(
                            f"{path} line {i + 1}: expected a JSON object with a 'text' field ({e})"
                        ) from None
        return
    text = _read_text(path)
    if text:
        yield from _chunks(str(path), text)


def hf_documents(spec: str) -> Iterator[Document]:
    """``hf:NAME[:CONFIG]``: stream split 'train' of a Hugging Face dataset (its 'text' column)."""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"source {spec!r} needs the 'datasets' package: pip install 'fpa[hf]'") from None
    name, _, config = spec[len("hf:") :].partition(":")
    if not name:
        raise ValueError(f"source must be 'hf:NAME[:CONFIG]', got {spec!r}")
    ds = datasets.load_dataset(name, config or None, split="train", streaming=True)
    for i, row in enumerate(ds):
        if "text" not in row:
            raise ValueError(f"dataset {name!r} has no 'text' column (columns: {sorted(row)})")
        yield Document(f"{spec}/{i}", row["text"])


def iter_documents(source) -> Iterator[Document]:
    """Every document of ``source`` in a fixed order (see the module docstring for the forms)."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("source must not be an empty list")
        for s in source:
            yield from iter_documents(s)
        return
    if not isinstance(source, (str, Path)):
        raise ValueError(f"source must be a str, a Path or a list of them, got {type(source).__name__}")
    if str(source) == "stdlib":
        for p in stdlib_files():
            text = _read_text(p)
            if text:
                yield Document(str(p), text)
    elif str(source).startswith("hf:"):
        yield from hf_documents(str(source))
    else:
        for p in resolve_files(source):
            yield from file_documents(p)
