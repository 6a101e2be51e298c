"""The simulator on a generated seed-like month (1,024 GPUs, 30 days, 15 teams).

Run: `.venv/bin/python -m bench.month [SEED ...]`. Generates the month with
`budgethub generate seed-like --seed SEED` (default 1), then times
`budgethub sim` on it (the scenario is parsed first and not timed) and prints
the headline metrics, the worst team's hourly fulfilment and its daily one
(owed and delivered summed per day, as bench.family's bar). With several seeds
it also prints their range: one seed's month is one draw of team shares and
demand, and the worst team differs by draw.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from scheduler_core.metrics import result
from scheduler_core.research.generator import SeedLikeOptions, seed_like
from scheduler_core.scenario import parse_scenario
from scheduler_core.simulator import Simulation

FIGURES = (
    "month.simulated_s",
    "month.worst_team_daily",
    "month.worst_team_hourly",
    "month.occupancy",
    "month.debug_p90_s",
)
"""The figures ``collect`` returns, each the worst over the seeds (bench/bars.toml)."""


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Print as ``main`` does; the figures (FIGURES). ``argv``: the seeds ([1])."""
    seeds = [int(arg) for arg in argv or []] or [1]
    outcomes = [one(seed) for seed in seeds]
    if len(outcomes) > 1:
        spread(outcomes)
    return {
        "month.simulated_s": max(o[4] for o in outcomes),
        "month.worst_team_daily": min(o[3] for o in outcomes),
        "month.worst_team_hourly": min(o[2] for o in outcomes),
        "month.occupancy": min(o[0] for o in outcomes),
        "month.debug_p90_s": max(o[5] for o in outcomes),
    }


def main(seeds: list[int] | None = None) -> int:
    collect([str(seed) for seed in seeds or [1]])
    return 0


def spread(outcomes: Sequence[tuple[float, ...]]) -> None:
    """The seeds' range, one line."""
    occupancy = [o[0] for o in outcomes]
    fulfilment = [o[1] for o in outcomes]
    worst = [o[2] for o in outcomes]
    daily = [o[3] for o in outcomes]
    print(
        f"months: {len(outcomes)} seeds: occupancy {min(occupancy):.1%}-"
        f"{max(occupancy):.1%}; fulfilment {min(fulfilment):.1%}-{max(fulfilment):.1%}; "
        f"worst team {min(worst):.1%}-{max(worst):.1%} "
        f"({sum(1 for w in worst if w >= 0.9)} of {len(worst)} seeds with every team >= 90%); "
        f"worst team daily {min(daily):.1%}-{max(daily):.1%}"
    )


def one(seed: int) -> tuple[float, float, float, float, float, float]:
    """Simulate seed ``seed``'s month.

    Returns (occupancy, fulfilment, worst team's fulfilment, worst team's daily
    fulfilment, seconds to simulate it, debug p90 wait in seconds).
    """
    scenario = parse_scenario(seed_like(SeedLikeOptions(seed=seed)))
    started = time.perf_counter()
    run = Simulation(scenario).run()
    wall = time.perf_counter() - started
    metrics = result(run)["metrics"]
    waits = metrics["wait_s"]
    teams = {n: t for n, t in metrics["teams"].items() if t["fulfilment"] is not None}
    worst = min(teams.items(), key=lambda item: item[1]["fulfilment"])
    daily = min(teams.items(), key=lambda item: item[1]["daily_fulfilment"])
    print(
        f"month (seed {seed}): {len(scenario.requests)} requests, "
        f"{sum(len(n.gpus) for n in scenario.nodes)} GPUs, {scenario.horizon / 86400:.0f} days: "
        f"simulated in {wall:.1f} s "
        f"({run.cycles} cycles)"
    )
    print(
        f"month (seed {seed}): debug p90 wait {waits['debug']['p90']:.0f} s, "
        f"all p50 {waits['all']['p50']:.0f} s p90 {waits['all']['p90']:.0f} s; "
        f"occupancy {metrics['occupancy']:.1%}; "
        f"unallocated share {metrics['unallocated_share']:.1%}; "
        f"fulfilment {metrics['fulfilment']:.1%}, worst team {worst[0]} "
        f"{worst[1]['fulfilment']:.1%}, teams >= 95%: "
        f"{sum(1 for t in teams.values() if t['fulfilment'] >= 0.95)} of {len(teams)}; "
        f"daily: fulfilment {metrics['daily_fulfilment']:.1%}, worst team {daily[0]} "
        f"{daily[1]['daily_fulfilment']:.1%}"
    )
    return (
        metrics["occupancy"],
        metrics["fulfilment"],
        worst[1]["fulfilment"],
        daily[1]["daily_fulfilment"],
        wall,
        float(waits["debug"]["p90"] or 0.0),
    )


if __name__ == "__main__":
    sys.exit(main([int(arg) for arg in sys.argv[1:]]))
