"""`budgethub compare SCENARIO [--policies a,b,...] [--report DIR] [--json] [--jobs N]`.

Runs the scenario once per policy (in parallel worker processes), prints a
headline table (or, with ``--json``, the report object and nothing else on
stdout) and, with ``--report``, writes DIR/report.json and DIR/report.html.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from scheduler_core.errors import InputError
from scheduler_core.registry import POLICIES
from scheduler_core.research.evaluation import (
    RunSpec,
    headline,
    headline_table,
    report_object,
    run_all,
)
from scheduler_core.scenario import load_scenario

DEFAULT_POLICIES = ("budget", "legacy", "fairshare", "quota", "fifo")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="run a scenario under several policies and compare them",
        description="Simulate a scenario under each policy and report the metrics side by side.",
    )
    parser.add_argument("scenario", help="scenario JSON file")
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help="comma-separated policy names (default: %(default)s)",
    )
    parser.add_argument("--report", metavar="DIR", help="write DIR/report.json and report.html")
    parser.add_argument("--json", action="store_true", help="print the report object only")
    parser.add_argument(
        "--jobs", type=int, default=None, help="worker processes (default: one per CPU)"
    )
    parser.set_defaults(func=run)


def parse_policies(text: str) -> list[str]:
    """Policy names from ``a,b,c``; InputError names ``--policies`` for a bad list."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise InputError("--policies", "name at least one policy")
    for name in names:
        if name not in POLICIES:
            known = ", ".join(sorted(POLICIES))
            raise InputError("--policies", f"unknown policy {name!r} (known: {known})")
    if len(set(names)) != len(names):
        raise InputError("--policies", "a policy is named twice")
    return names


def run(args: argparse.Namespace) -> int:
    policies = parse_policies(args.policies)
    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs", f"must be at least 1, not {args.jobs}")
    scenario = load_scenario(args.scenario)
    started = time.perf_counter()
    runs = run_all(args.scenario, [RunSpec(name, name) for name in policies], args.jobs)
    wall = time.perf_counter() - started
    if args.report:
        # matplotlib loads only when a report is drawn: every other command stays quick.
        from scheduler_core.research.report import write_report

        report = write_report(args.report, scenario.name, runs, wall)
    else:
        report = report_object(scenario.name, runs, wall)
    if args.json:
        json.dump(report, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
        return 0
    print(
        f"scenario {scenario.name}: {len(scenario.requests)} requests, "
        f"{len(policies)} policies in {wall:.1f} s"
    )
    print()
    print(headline_table([(run.label, headline(run)) for run in runs]))
    if args.report:
        print()
        print(f"report: {args.report}/report.html, {args.report}/report.json")
    return 0
