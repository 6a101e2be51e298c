"""`budgethub sim SCENARIO.json [--json] [--policy NAME]`: run a scenario through the scheduler."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from scheduler_core.errors import InputError
from scheduler_core.metrics import result
from scheduler_core.registry import POLICIES
from scheduler_core.research.evaluation import fmt_wait
from scheduler_core.scenario import Scenario, load_scenario
from scheduler_core.simulator import Simulation


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="simulate a scenario and print its result",
        description="Replay a scenario (docs/architecture.md) through the budget scheduler.",
    )
    parser.add_argument("scenario", help="scenario JSON file")
    parser.add_argument("--json", action="store_true", help="print the result object")
    parser.add_argument("--policy", help="run this policy instead of the scenario's")
    parser.set_defaults(func=run)


def with_policy(scenario: Scenario, name: str | None) -> Scenario:
    if name is None:
        return scenario
    if name not in POLICIES:
        known = ", ".join(sorted(POLICIES))
        raise InputError("--policy", f"unknown policy {name!r} (known: {known})")
    return replace(scenario, settings=scenario.settings.replace(name=name))


def simulate(scenario: Scenario) -> dict[str, Any]:
    """The result of one run."""
    return result(Simulation(scenario).run())


def run(args: argparse.Namespace) -> int:
    scenario = with_policy(load_scenario(args.scenario), args.policy)
    outcome = simulate(scenario)
    if args.json:
        json.dump(outcome, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        print_summary(outcome)
    return 0


def print_summary(outcome: dict[str, Any]) -> None:
    metrics = outcome["metrics"]
    print(
        f"scenario {outcome['scenario']}  policy {outcome['policy']}  "
        f"simulated in {outcome['sim_wall_s']:.2f}s ({metrics['cycles']} cycles)"
    )
    print()
    print(f"{'class':<12}{'n':>7}{'p50':>9}{'p90':>9}{'p99':>9}")
    for klass, waits in metrics["wait_s"].items():
        print(
            f"{klass:<12}{waits['n']:>7}{fmt_wait(waits['p50']):>9}"
            f"{fmt_wait(waits['p90']):>9}{fmt_wait(waits['p99']):>9}"
        )
    print()
    occupancy = metrics["occupancy"]
    print(f"occupancy          {'-' if occupancy is None else f'{occupancy:.1%}'}")
    print(f"unallocated share  {metrics['unallocated_share']:.1%}")
    print(f"preemptions        {metrics['preemptions']}")
    by_class = ", ".join(
        f"{klass} {hours:,.1f}" for klass, hours in metrics["lost_gpu_h_by_class"].items()
    )
    print(f"lost GPU-hours     {metrics['lost_gpu_seconds'] / 3600:.1f} ({by_class})")
    if metrics["goodput"] is not None:
        print(
            f"goodput            {metrics['goodput']:.1%} (occupancy less the"
            f" {metrics['lost_share']:.1%} lost to preemption)"
        )
    print(
        f"finished           {metrics['finished']} of {len(outcome['requests'])}"
        f" ({metrics['never_started']} never started)"
    )
    if metrics["fulfilment"] is not None:
        print(f"fulfilment         {metrics['fulfilment']:.1%}")
    print()
    print(f"{'team':<16}{'share':>7}{'owed h':>10}{'deliv. h':>10}{'used h':>10}{'fulfil':>8}")
    for name, team in metrics["teams"].items():
        fulfilment = team["fulfilment"]
        print(
            f"{name:<16}{team['share']:>7.3f}{team['owed_gpu_h']:>10.1f}"
            f"{team['delivered_gpu_h']:>10.1f}{team['used_gpu_h']:>10.1f}"
            f"{'-' if fulfilment is None else f'{fulfilment:.1%}':>8}"
        )
