"""`budgethub trace import SOURCE --pods PODS.csv --nodes NODES.csv > scenario.json`.

Turns a public cluster trace into a scenario on stdout; a one-line summary of
what was imported and skipped goes to stderr. The rules (pools, teams, classes,
which tasks) are documented in scheduler_core/research/traces.py.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scheduler_core.research.traces import TRACE_IMPORTERS, ImportOptions, dump_scenario

_DEFAULTS = ImportOptions()


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    trace = subparsers.add_parser(
        "trace", help="turn public cluster traces into scenarios", description=__doc__
    )
    commands = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    importer = commands.add_parser(
        "import",
        help="print a scenario made from a trace",
        description="Print a scenario made from a public trace "
        "(rules: scheduler_core/research/traces.py).",
    )
    importer.add_argument("source", choices=sorted(TRACE_IMPORTERS), help="the trace's format")
    importer.add_argument("--pods", required=True, metavar="PODS.csv", help="the task list")
    importer.add_argument(
        "--nodes",
        required=True,
        metavar="NODES.csv",
        help="the node list (GPU nodes only, or all nodes for a cpu pool too)",
    )
    importer.add_argument(
        "--teams", type=int, default=_DEFAULTS.teams, help="teams to spread tasks over (15)"
    )
    importer.add_argument(
        "--team-skew",
        type=float,
        default=_DEFAULTS.skew,
        help="team k gets a share proportional to 1/k**SKEW (1; 0 = equal shares)",
    )
    importer.add_argument(
        "--users-per-team",
        type=int,
        default=_DEFAULTS.users_per_team,
        help="users per team (10)",
    )
    importer.add_argument(
        "--time-scale",
        type=float,
        default=_DEFAULTS.time_scale,
        help="divide arrival times by this, keeping run lengths (1; 10 = ten times the load)",
    )
    importer.add_argument("--name", default=None, help="the scenario's name (the source's)")
    importer.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    options = ImportOptions(
        teams=args.teams,
        skew=args.team_skew,
        users_per_team=args.users_per_team,
        name=args.name or args.source,
        time_scale=args.time_scale,
    )
    scenario, report = TRACE_IMPORTERS[args.source](args.pods, args.nodes, options)
    sys.stdout.write(dump_scenario(scenario))
    print(f"budgethub trace import: {report.summary()}", file=sys.stderr)
    return 0
