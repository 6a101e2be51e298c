"""The five policies on a generated seed-like month (1,024 GPUs, 30 days, 15 teams).

Run: `.venv/bin/python -m bench.compare [SEED] [--report DIR]`. Generates the
month with `budgethub generate seed-like --seed SEED` (default 1), writes it to
a temporary file and times `budgethub compare` of budget, legacy, fairshare,
quota and fifo on it (worker processes, one per CPU; the issue's bar is 5
minutes on a 2-core machine). Then it prints budget against legacy: debug p90
wait, occupancy, goodput and the work lost to preemption (by request class; see
``scheduler_core.metrics`` for what counts as lost), every team's fulfilment, and
(untimed) legacy under its other reading, ``legacy_preemption=limit`` (the default
is ``priority``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scheduler_core.research.evaluation import (
    RunSpec,
    headline,
    headline_table,
    run_all,
    worst_team,
)
from scheduler_core.research.generator import SeedLikeOptions, dumps, seed_like
from scheduler_core.settings import LegacyPreemption

POLICIES = ("budget", "legacy", "fairshare", "quota", "fifo")
BAR_S = 300.0
"""Five policies on the month within 5 minutes on 2 cores."""
FIGURES = ("compare.wall_s", "compare.legacy_debug_p90_s", "compare.budget_debug_p90_s")
"""The figures ``collect`` returns (bench/bars.toml)."""


def lost_classes(metrics: dict[str, Any]) -> str:
    """The lost GPU-h by request class, largest first, or that nothing was lost."""
    lost = sorted(metrics["lost_gpu_h_by_class"].items(), key=lambda item: -item[1])
    named = [f"{klass} {hours:,.0f}" for klass, hours in lost if hours >= 0.5]
    return "by class: " + ", ".join(named) if named else "none by class"


def main(argv: list[str] | None = None) -> int:
    collect(argv)
    return 0


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Print as ``main`` does; the figures (FIGURES)."""
    parser = argparse.ArgumentParser(prog="python -m bench.compare")
    parser.add_argument("seed", nargs="?", type=int, default=1)
    parser.add_argument("--report", metavar="DIR", help="also write the compare report here")
    args = parser.parse_args(argv)
    scenario = seed_like(SeedLikeOptions(seed=args.seed))
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "month.json"
        path.write_text(dumps(scenario), encoding="utf-8")
        started = time.perf_counter()
        runs = run_all(str(path), [RunSpec(name, name) for name in POLICIES])
        wall = time.perf_counter() - started
        # The other reading of the legacy rules (see baselines/legacy.py), outside the timing.
        by_limit = RunSpec("legacy/limit", "legacy", {"legacy_preemption": LegacyPreemption.LIMIT})
        variant = run_all(str(path), [by_limit], jobs=1)[0]
    name = str(scenario["name"])
    if args.report:
        from scheduler_core.research.report import write_report

        write_report(args.report, name, runs, wall)
    verdict = "within" if wall <= BAR_S else "OVER"
    print(
        f"compare: {name}, {len(scenario['requests'])} requests: {len(runs)} policies in "
        f"{wall:.1f} s on {os.cpu_count()} CPUs ({verdict} the {BAR_S:.0f} s bar)"
    )
    print(headline_table([(run.label, headline(run)) for run in runs]))
    by_policy = {run.label: run for run in runs}
    budget, legacy = by_policy["budget"], by_policy["legacy"]
    for run in (budget, legacy):
        figures = headline(run)
        team, worst = worst_team(run.metrics)
        teams = ", ".join(
            f"{t} {v['fulfilment']:.1%}"
            for t, v in run.metrics["teams"].items()
            if v["fulfilment"] is not None
        )
        print(
            f"compare: {run.label}: debug p90 wait {figures['debug_p90_s']:.0f} s, "
            f"p99 {run.metrics['wait_s']['debug']['p99']:.0f} s; occupancy "
            f"{figures['occupancy']:.1%}, goodput {figures['goodput']:.1%} (lost to preemption "
            f"{figures['lost_gpu_h']:,.0f} GPU-h, {figures['lost_share']:.1%} of the GPU time; "
            f"{lost_classes(run.metrics)}); fulfilment {figures['fulfilment']:.1%}, worst {team} "
            f"{worst:.1%}; teams: {teams}"
        )
    ours, theirs = (
        budget.metrics["wait_s"]["debug"]["p90"],
        legacy.metrics["wait_s"]["debug"]["p90"],
    )
    if ours:
        ratio = f"{theirs / ours:.1f}x"
    elif theirs:
        ratio = "unbounded (budget's is 0 s)"
    else:
        ratio = "undefined: both 0 s, legacy is not worse here"
    print(f"compare: legacy debug p90 / budget debug p90: {ratio} (issue bar: at least 5x)")
    figures = headline(variant)
    print(
        f"compare: legacy with legacy_preemption=limit: debug p90 wait "
        f"{figures['debug_p90_s']:.0f} s, all p50 {figures['all_p50_s']:.0f} s "
        f"p90 {figures['all_p90_s']:.0f} s; occupancy {figures['occupancy']:.1%}, goodput "
        f"{figures['goodput']:.1%} (lost {figures['lost_gpu_h']:,.0f} GPU-h); fulfilment "
        f"{figures['fulfilment']:.1%}, worst {figures['worst_team']} "
        f"{figures['worst_fulfilment']:.1%}"
    )
    return {
        "compare.wall_s": wall,
        "compare.legacy_debug_p90_s": float(theirs or 0.0),
        "compare.budget_debug_p90_s": float(ours or 0.0),
    }


if __name__ == "__main__":
    sys.exit(main())
