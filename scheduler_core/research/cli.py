"""The `budgethub` command line.

Each subcommand lives in its own module that exposes ``register(subparsers)``;
the parser it adds sets ``func`` to a callable taking the parsed arguments and
returning an exit status. Bad input raises InputError, printed here as one line
with exit status 2 (never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from scheduler_core.errors import InputError

COMMAND_MODULES = (
    "scheduler_core.research.commands.sim",
    "scheduler_core.research.commands.generate",
    "scheduler_core.research.commands.trace",
    "scheduler_core.research.commands.bench",
    "scheduler_core.research.commands.compare",
    "scheduler_core.research.commands.sweep",
    "scheduler_core.research.commands.replay",
)
"""Modules that add subcommands; a module that is not there yet is skipped."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="budgethub",
        description="budgethub: the budget scheduler's simulator and tools.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name == name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except InputError as error:
        print(f"budgethub {args.command}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return status


if __name__ == "__main__":
    sys.exit(main())
