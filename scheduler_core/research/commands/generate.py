"""`budgethub generate`: write a generated scenario (docs/architecture.md) to stdout.

``budgethub generate seed-like --gpus 1024 --days 30 --seed 7 > scenario.json``
builds a month on a cluster shaped like the seed's (see scheduler_core.research.generator
for the knobs and the load arithmetic); ``--stats`` adds the offered-load
figures on stderr. Every knob value is parsed here, so a bad one is reported as
one line naming its flag (exit status 2), like any other InputError.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from scheduler_core.errors import InputError
from scheduler_core.research import generator
from scheduler_core.research.generator import SeedLikeOptions
from scheduler_core.settings import parse_duration


def register(subparsers: Any) -> None:
    """Add ``generate`` and its ``seed-like`` subcommand to the budgethub parser."""
    parser = subparsers.add_parser(
        "generate",
        help="write a generated scenario JSON to stdout",
        description="Write a generated scenario (scenario JSON (docs/architecture.md)) to stdout.",
    )
    kinds = parser.add_subparsers(dest="generator", metavar="GENERATOR", required=True)
    seed_like = kinds.add_parser(
        "seed-like",
        help="a month on a shared H100 cluster shaped like the seed's",
        description=(
            "A month on a shared H100 cluster shaped like the seed's: unequal team shares, "
            "a standing batch backlog, notebooks in working hours, debug sessions, "
            "data preparation on a CPU pool. Same arguments, byte-identical output."
        ),
    )
    defaults = SeedLikeOptions()
    for knob in dataclasses.fields(SeedLikeOptions):
        flag = generator.knob_flag(knob.name)
        default = getattr(defaults, knob.name)
        help_text = str(knob.metadata["help"])
        if isinstance(default, bool):
            seed_like.add_argument(
                flag,
                dest=knob.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{help_text} (default: {'on' if default else 'off'})",
            )
            continue
        shown = ",".join(default) if isinstance(default, tuple) else default
        if default is None and knob.name != "name":
            shown = "not set"
        seed_like.add_argument(
            flag,
            dest=knob.name,
            metavar="VALUE",
            default=None,
            help=f"{help_text} (default: {shown})",
        )
    seed_like.add_argument(
        "--stats",
        action="store_true",
        help="print the offered-load figures to stderr",
    )
    seed_like.set_defaults(func=run_seed_like)


OPTIONAL_NUMBERS = ("load", "interactive_share", "debug_rate", "idle_share", "burst")
"""Knobs whose default is None (not set) and whose value is a number."""


def _parse(name: str, text: str, default: Any) -> Any:
    """A knob's value from its command-line text, typed like its default."""
    flag = generator.knob_flag(name)
    if name in OPTIONAL_NUMBERS:
        default = 0.0
    if name in ("lookback", "max_min_runtime"):
        try:
            return parse_duration(text)
        except ValueError as error:
            raise InputError(flag, str(error)) from None
    if name == "storages":
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise InputError(flag, f"{text!r} is not a whole number") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise InputError(flag, f"{text!r} is not a number") from None
    return text


def options_from_args(args: argparse.Namespace) -> SeedLikeOptions:
    """The generator's options from parsed arguments; a bad value raises InputError."""
    defaults = SeedLikeOptions()
    changes: dict[str, Any] = {}
    for knob in dataclasses.fields(SeedLikeOptions):
        value = getattr(args, knob.name)
        if value is None:
            continue
        default = getattr(defaults, knob.name)
        changes[knob.name] = value if isinstance(value, bool) else _parse(knob.name, value, default)
    options = dataclasses.replace(defaults, **changes)
    generator.validate(options)
    return options


def run_seed_like(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    scenario = generator.seed_like(options)
    sys.stdout.write(generator.dumps(scenario))
    sys.stdout.flush()
    if args.stats:
        report = generator.load_report(scenario)
        for line in generator.format_report(report).splitlines():
            print(f"budgethub generate seed-like: {line}", file=sys.stderr)
    return 0
