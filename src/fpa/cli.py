"""The one command-line entry point: ``fpa <command> ...``.

Each command lives in the module that owns its job and exposes ``add_parser(subparsers)``,
which registers a subparser whose ``func(args) -> int`` runs it. ``fpa --help`` imports none of
them (nor torch): the command table below is all it needs, so it answers at once and works on a
core install. ``fpa CMD ...`` imports only CMD's module; a missing optional dependency gives one
line naming the extra to install.

Every expected failure (bad arguments, missing or corrupt files, unwritable outputs, a missing
extra) ends as ONE line on stderr, ``error: ...``, and exit code 2; never a traceback.
Commands check their inputs and outputs before any work (see ``writable_file`` / ``writable_dir``)
and remove partial outputs of a failed run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

# command: (module with add_parser, one-line help, extras it needs), in the order --help shows them
COMMANDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "model-info": ("fpa.models.cli", "parameter count and layout of a preset", ("models",)),
    "synth": (
        "fpa.experiments.synthetic.cli",
        "nested-structure tasks: capacity experiment and constructive check",
        ("train",),
    ),
    "train": ("fpa.train.cli", "train a language model (one process, or torchrun for DDP/FSDP2)", ("models", "train")),
    "prepare-data": ("fpa.train.cli", "tokenize a corpus into memory-mapped token shards", ("train",)),
    "eval": (
        "fpa.eval.cli",
        "evaluate a trained model: per-position loss, passkey grid, cache policies",
        ("models", "train"),
    ),
    "reproduce": (
        "fpa.experiments.lm.cli",
        "train a preset's methods, run every evaluation, write the report",
        ("models", "train"),
    ),
    "agent": (
        "fpa.experiments.agent.cli",
        "language models on short agent sessions, long sessions decoded with the evicting cache",
        ("models", "train"),
    ),
}

# top-level module of an optional dependency -> the extra of pyproject.toml that provides it
EXTRA_OF = {
    "transformers": "models",
    "safetensors": "models",
    "tokenizers": "train",
    "tqdm": "train",
    "matplotlib": "train",
    "triton": "triton",
    "datasets": "hf",
    "yaml": "train",
}


class UsageError(Exception):
    """A bad command line (raised by the parsers instead of argparse's exit)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises UsageError (one line, exit 2 in main) instead of
    printing the usage block and exiting."""

    def error(self, message: str) -> NoReturn:
        """Raise UsageError with ``message`` and a pointer to ``--help``."""
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def writable_file(path: str | Path, flag: str) -> Path:
    """Check, before any work, that ``path`` can be written as a file; returns it as a Path.

    It must not be a folder, and its nearest existing ancestor must be a writable folder
    (probed by creating and deleting a temporary file there). Nothing is left behind.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} must name a file, but {p} is a folder")
    _probe(p, flag)
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{flag}: {p} exists and is not writable")
    return p


def seed_list(text: str) -> tuple[int, ...]:
    """``--seeds`` text ("10,11,12") as distinct non-negative ints, checked before any work.

    Raises:
        ValueError: Not a comma list of ints, a repeated seed, or a negative one.
    """
    try:
        seeds = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--seeds must be a comma list of ints, e.g. 10,11,12, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"--seeds must list distinct non-negative ints, got {text!r}")
    return seeds


def writable_dir(path: str | Path, flag: str) -> Path:
    """Check, before any work, that ``path`` is (or can be created as) a writable folder."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} must name a folder, but {p} is a file")
    _probe(p / "x", flag)
    return p


def _probe(p: Path, flag: str) -> None:
    """The nearest existing ancestor of p's parent must be a folder we can create files in."""
    anc = p.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise ValueError(f"{flag}: cannot create {p}: {anc} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=anc):
            pass
    except OSError as e:
        raise ValueError(f"{flag}: cannot write into {anc} ({e.strerror or e})") from None


def _top_parser() -> Parser:
    p = Parser(
        prog="fpa",
        description="First Passage Attention: models, experiments, evaluations. "
        "`fpa COMMAND --help` lists a command's options.",
    )
    return p


def build_parser(command: str | None = None) -> Parser:
    """The parser of ``command`` (importing its module), or, with None, the top-level one
    listing every command (importing nothing)."""
    p = _top_parser()
    sub = p.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser, help="one of: " + ", ".join(COMMANDS)
    )
    if command is None:
        for name, (_, help_, extras) in COMMANDS.items():
            sub.add_parser(name, help=f"{help_} [needs fpa[{','.join(extras)}]]")
        return p
    importlib.import_module(COMMANDS[command][0]).add_parser(sub)
    return p


def _missing_extra(e: ModuleNotFoundError, command: str | None) -> str | None:
    top = (e.name or "").split(".")[0]
    extra = EXTRA_OF.get(top)
    if extra is None:
        return None
    what = f"fpa {command}" if command else "this"
    if top == "yaml":
        return f"{what} needs PyYAML for .yaml files: pip install pyyaml (or use a .json config)"
    return f"{what} needs the optional dependency {top!r}: pip install 'fpa[{extra}]'"


def main(argv: list[str] | None = None) -> int:
    """Run ``fpa``; returns the exit code (0 ok, 2 for every expected failure)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        command = None
    try:
        args = build_parser(command).parse_args(argv)
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
    except ModuleNotFoundError as e:
        msg = _missing_extra(e, command)
        if msg is None:
            raise
        print(f"error: {msg}", file=sys.stderr)
    except (ValueError, OSError) as e:  # bad values, missing / corrupt / unwritable files
        text = str(e) or type(e).__name__
        if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in text:
            text = f"{text}: {e.filename}"
        print(f"error: {' '.join(text.split())}", file=sys.stderr)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
