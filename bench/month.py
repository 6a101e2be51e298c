"""The simulator on a generated seed-like month (1,024 GPUs, 30 days, 15 teams).

Run: `.venv/bin/python -m bench.month [SEED]`. Generates the month with
`budgethub generate seed-like --seed SEED` (default 1), then times
`budgethub sim` on it (the scenario is parsed first and not timed) and prints
the headline metrics next to the seed's production figures.
"""

from __future__ import annotations

import sys
import time

from scheduler_core.generator import SeedLikeOptions, seed_like
from scheduler_core.metrics import result
from scheduler_core.scenario import parse_scenario
from scheduler_core.simulator import Simulation


def main(seed: int = 1) -> int:
    scenario = parse_scenario(seed_like(SeedLikeOptions(seed=seed)))
    started = time.perf_counter()
    run = Simulation(scenario).run()
    wall = time.perf_counter() - started
    metrics = result(run)["metrics"]
    waits = metrics["wait_s"]
    teams = {n: t for n, t in metrics["teams"].items() if t["fulfilment"] is not None}
    worst = min(teams.items(), key=lambda item: item[1]["fulfilment"])
    print(
        f"month: {len(scenario.requests)} requests, {sum(len(n.gpus) for n in scenario.nodes)} "
        f"GPUs, {scenario.horizon / 86400:.0f} days: simulated in {wall:.1f} s "
        f"({run.cycles} cycles)"
    )
    print(
        f"month: debug p90 wait {waits['debug']['p90']:.0f} s, all p50 {waits['all']['p50']:.0f} s "
        f"p90 {waits['all']['p90']:.0f} s; occupancy {metrics['occupancy']:.1%}; "
        f"unallocated share {metrics['unallocated_share']:.1%}; "
        f"fulfilment {metrics['fulfilment']:.1%}, worst team {worst[0]} "
        f"{worst[1]['fulfilment']:.1%}, teams >= 95%: "
        f"{sum(1 for t in teams.values() if t['fulfilment'] >= 0.95)} of {len(teams)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1))
