"""`budgethub sweep SCENARIO --set KEY=V1,V2,... [--set ...] [--policy NAME] [--plot PNG] [--json]`.

Runs every combination of the values given (the cartesian product, in the
order written), in parallel worker processes, and prints one headline row per
combination; ``--plot`` draws debug p90 wait and worst-team fulfilment over
the combinations (heat maps for two settings, lines for one, bars otherwise).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from scheduler_core.errors import InputError
from scheduler_core.research.commands.sim import with_policy
from scheduler_core.research.evaluation import (
    Axis,
    RunOutcome,
    RunSpec,
    headline,
    headline_table,
    run_all,
)
from scheduler_core.scenario import load_scenario
from scheduler_core.settings import SettingError, setting_from_text


def add_set_flag(parser: Any, help: str) -> None:
    """``--set KEY=V1,V2,...``, repeatable, into ``args.sets`` (read by `parse_axes`)."""
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=V1,V2,...", help=help
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="run a scenario over a grid of settings",
        description="Simulate a scenario once per combination of setting values.",
    )
    parser.add_argument("scenario", help="scenario JSON file")
    add_set_flag(parser, "a setting and the values to try (repeat for more settings)")
    parser.add_argument("--policy", help="run this policy instead of the scenario's")
    parser.add_argument("--plot", metavar="FILE.png", help="write a plot of the sweep")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument(
        "--jobs", type=int, default=None, help="worker processes (default: one per CPU)"
    )
    parser.set_defaults(func=run)


def parse_axis(text: str) -> Axis:
    """``lookback=1d,3d`` → ("lookback", ["1d", "3d"], [86400.0, 259200.0])."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError("--set", f"{text!r} is not KEY=V1,V2,...")
    written = [v.strip() for v in values.split(",") if v.strip()]
    if not written:
        raise InputError(f"--set {key}", "give at least one value")
    if key == "name":
        raise InputError("--set name", "choose the policy with --policy")
    parsed = []
    for value in written:
        try:
            parsed.append(setting_from_text(key, value))
        except SettingError as error:
            raise InputError(f"--set {error.key}", error.reason) from None
    return key, written, parsed


def parse_axes(texts: Sequence[str]) -> list[Axis]:
    if not texts:
        raise InputError("--set", "give at least one setting to sweep, e.g. --set lookback=1d,7d")
    axes = [parse_axis(text) for text in texts]
    names = [name for name, _, _ in axes]
    for name in names:
        if names.count(name) > 1:
            raise InputError(f"--set {name}", "is given twice")
    return axes


def grid(axes: Sequence[Axis]) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """Every combination, first setting slowest: its label, values as written, values parsed."""
    names = [name for name, _, _ in axes]
    choices = [list(zip(written, parsed, strict=True)) for _, written, parsed in axes]
    out = []
    for combo in itertools.product(*choices):
        written = {name: text for name, (text, _) in zip(names, combo, strict=True)}
        parsed = {name: value for name, (_, value) in zip(names, combo, strict=True)}
        out.append((" ".join(f"{k}={v}" for k, v in written.items()), written, parsed))
    return out


def run(args: argparse.Namespace) -> int:
    axes = parse_axes(args.sets)
    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs", f"must be at least 1, not {args.jobs}")
    scenario = with_policy(load_scenario(args.scenario), args.policy)
    combos = grid(axes)
    specs = [RunSpec(label, scenario.settings.name, parsed) for label, _, parsed in combos]
    started = time.perf_counter()
    runs = run_all(args.scenario, specs, args.jobs)
    wall = time.perf_counter() - started
    if args.plot:
        # matplotlib loads only when a plot is drawn: every other command stays quick.
        from scheduler_core.research.sweepplot import plot_sweep

        plot_sweep(args.plot, axes, runs, f"{scenario.name}, policy {scenario.settings.name}")
    if args.json:
        out = {
            "scenario": scenario.name,
            "policy": scenario.settings.name,
            "settings": [name for name, _, _ in axes],
            "wall_s": round(wall, 2),
            "runs": [
                {"settings": written, "headline": headline(outcome), "metrics": outcome.metrics}
                for (_, written, _), outcome in zip(combos, runs, strict=True)
            ],
        }
        json.dump(out, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
        return 0
    print_table(scenario.name, scenario.settings.name, runs, wall)
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def print_table(scenario: str, policy: str, runs: Sequence[RunOutcome], wall: float) -> None:
    print(f"scenario {scenario}  policy {policy}: {len(runs)} runs in {wall:.1f} s")
    print()
    print(headline_table([(outcome.label, headline(outcome)) for outcome in runs]))
