"""`budgethub bench BENCHMARK ...`: benchmarks of the scheduler's parts.

Each benchmark is one entry of :data:`BENCHMARKS`, a function that adds its
subparser to ``bench`` and sets ``func``; add another (``bench cycle``) by
writing its adder and listing it there.

``bench placement --pods PODS.csv --nodes NODES.csv [--seeds 5] [--json]``
runs the fragmentation experiment of fragbench.py. With ``--json`` stdout is
one JSON object, ``{"capacity_gpus": N, "results": {STRATEGY: {"100": mean
unallocated GPUs, "130": ...}}, ...}`` plus per-seed detail; without it, a
table. A progress bar goes to stderr only when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from scheduler_core.errors import InputError
from scheduler_core.research.fragbench import (
    POINTS,
    STRATEGIES,
    BenchResult,
    Cluster,
    run_benchmark,
)
from scheduler_core.research.traces import read_nodes, read_pod_shapes

BASELINE = "best-fit"
"""The strategy the table compares the others with."""


def add_placement(benchmarks: argparse._SubParsersAction[Any]) -> None:
    parser = benchmarks.add_parser(
        "placement",
        help="unallocated GPUs of placement strategies on a trace (fragmentation)",
        description="Tasks from a trace arrive without departures until their GPU demand "
        "reaches 100%% and 130%% of capacity; report the unallocated GPUs of every "
        "placement strategy (see scheduler_core/research/fragbench.py).",
    )
    parser.add_argument("--pods", required=True, metavar="PODS.csv", help="the task population")
    parser.add_argument("--nodes", required=True, metavar="NODES.csv", help="the cluster")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 to average (5)")
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated subset of {', '.join(STRATEGIES)} (all)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run_placement)


BENCHMARKS: Sequence[Callable[[argparse._SubParsersAction[Any]], None]] = (add_placement,)
"""Adders of the ``bench`` subcommands, one per benchmark."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    bench = subparsers.add_parser(
        "bench", help="benchmarks of the scheduler's parts", description=__doc__
    )
    benchmarks = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for add in BENCHMARKS:
        add(benchmarks)


def run_placement(args: argparse.Namespace) -> int:
    if args.seeds < 1:
        raise InputError("--seeds", f"{args.seeds} is not a number of seeds >= 1")
    strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    for name in strategies:
        if name not in STRATEGIES:
            raise InputError("--strategies", f"unknown strategy {name!r}")
    if not strategies:
        raise InputError("--strategies", "names no strategy")
    population = read_pod_shapes(args.pods)
    nodes = read_nodes(args.nodes)
    cluster = Cluster.build((n.name, n.cpu_milli, n.memory_mib, n.gpus) for n in nodes)
    if cluster.capacity_gpus == 0:
        raise InputError(f"{args.nodes}:2:gpu", "the cluster has no GPUs")
    if not any(shape.gpu_demand_milli for shape in population):
        raise InputError(f"{args.pods}:2:num_gpu", "no task asks for a GPU")

    started = time.perf_counter()
    with tqdm(
        total=args.seeds * len(strategies),
        desc="placement runs",
        unit="run",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
    ) as bar:
        result = run_benchmark(
            cluster, population, range(args.seeds), strategies, progress=bar.update
        )
    result.wall_s = time.perf_counter() - started
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(format_table(result))
    return 0


def format_table(result: BenchResult) -> str:
    """A readable table: mean unallocated GPUs and failed tasks per strategy and point."""
    data = result.to_json()
    points = [str(p) for p in POINTS]
    lines = [
        f"placement benchmark: {result.nodes} nodes, {result.capacity_gpus} GPUs, "
        f"{len(result.seeds)} seed(s), population of {result.population} tasks, "
        f"{result.wall_s:.1f} s",
        "",
        f"{'strategy':<12}"
        + "".join(f"{'unalloc@' + p + '%':>16}" for p in points)
        + "".join(f"{'failed@' + p + '%':>14}" for p in points)
        + (f"{'vs ' + BASELINE + '@100%':>20}" if BASELINE in result.runs else ""),
    ]
    failed = data["failed_tasks_per_seed"]
    for name, means in data["results"].items():
        row = f"{name:<12}" + "".join(f"{means[p]:>16.1f}" for p in points)
        row += "".join(f"{sum(failed[name][p]) / len(failed[name][p]):>14.1f}" for p in points)
        if BASELINE in result.runs:
            base = data["results"][BASELINE]["100"]
            change = (means["100"] - base) / base * 100 if base else 0.0
            row += f"{change:>+19.1f}%"
        lines.append(row)
    lines.append("")
    lines.append("unalloc: mean unallocated GPUs when arrived GPU demand reaches the point")
    return "\n".join(lines)
