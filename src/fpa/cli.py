"""The one command-line entry point: ``fpa <command> ...``.

Each command lives in the module that owns its job and exposes ``add_parser(subparsers)``,
which registers a subparser whose ``func(args) -> int`` runs it. Modules are imported only
when listed here, so ``fpa --help`` stays fast enough; a command's heavy imports belong inside
its ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (command module, in the order shown by --help). Each has add_parser(subparsers).
COMMAND_MODULES = (
    "fpa.models.cli",  # model-info
    "fpa.tasks.cli",  # synth
    "fpa.train.cli",  # train, prepare-data
    "fpa.eval.cli",  # eval, reproduce
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fpa", description="First Passage Attention: models, experiments, evaluations.")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a real missing dependency inside the module
                raise
            continue  # command not built yet
        mod.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
