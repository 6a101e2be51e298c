"""One scheduling cycle at cluster scale: 128 nodes × 8 GPUs, 1,000 running, 2,000 pending.

Run: `.venv/bin/python -m bench.cycle`. Builds a random but seeded cluster state
through the real Scheduler (so the running sessions are placed by the policy
itself), then times `decide(view, now)` on that state, repeatedly, without
applying the decisions. The scheduler keeps indexes between cycles and hands
them over in the view, so taking the view is timed too.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from scheduler_core.model import Node, Pool, Request, RequestClass, Team
from scheduler_core.registry import decide
from scheduler_core.scenario import parse_scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.settings import Settings

TEAMS = 15
FIGURES = ("cycle.steady_median_ms", "cycle.steady_p95_ms", "cycle.cold_start_median_ms")
"""The figures ``collect`` returns (bench/bars.toml holds their bars)."""


class NullActuator:
    def launch(self, allocation: object) -> None:
        pass

    def preempt(self, allocation: object, reason: str) -> bool:
        return True


class FixedClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def cluster() -> tuple[list[Pool], list[Node], list[Team]]:
    scenario = parse_scenario(
        {
            "name": "cycle-bench",
            "horizon": 1,
            "pools": [{"name": "h100", "kind": "gpu"}],
            "nodes": [
                {
                    "name": "h100-{i:03d}",
                    "count": 128,
                    "pool": "h100",
                    "gpus": 8,
                    "cpus": 192,
                    "memory_gib": 2048,
                }
            ],
            "teams": [],
        }
    )
    rng = random.Random(7)
    weights = [rng.random() + 0.2 for _ in range(TEAMS)]
    total = sum(weights)
    teams = [Team(f"team{i:02d}", {"h100": w / total * 0.999}) for i, w in enumerate(weights)]
    return list(scenario.pools), list(scenario.nodes), teams


def random_request(rng: random.Random, i: int, submit: float) -> Request:
    team = f"team{rng.randrange(TEAMS):02d}"
    kind = rng.random()
    if kind < 0.15:
        return Request(
            f"q{i}",
            f"u{i % 150}",
            team,
            "h100",
            submit,
            gpus=8,
            nodes=rng.choice([1, 1, 2, 4]),
            cpus=32,
            memory_gib=256,
            min_runtime=28800,
            resumable=True,
            klass=RequestClass.BATCH,
            priority=rng.randrange(4),
        )
    if kind < 0.55:
        return Request(
            f"q{i}",
            f"u{i % 150}",
            team,
            "h100",
            submit,
            gpus=rng.choice([1, 2, 4]),
            cpus=8,
            memory_gib=64,
            min_runtime=7200,
            klass=RequestClass.INTERACTIVE,
        )
    if kind < 0.8:
        return Request(
            f"q{i}",
            f"u{i % 150}",
            team,
            "h100",
            submit,
            gpu_milli=rng.choice([250, 500]),
            cpus=2,
            memory_gib=16,
            min_runtime=900,
            klass=RequestClass.DEBUG,
        )
    return Request(
        f"q{i}",
        f"u{i % 150}",
        team,
        "h100",
        submit,
        gpus=1,
        cpus=4,
        memory_gib=32,
        min_runtime=900,
        klass=RequestClass.DEBUG,
    )


def fill_request(rng: random.Random, i: int, submit: float) -> Request:
    """Small sessions (fractions and single GPUs), so that ~1,000 fit on 1,024 GPUs."""
    return Request(
        f"q{i}",
        f"u{i % 150}",
        f"team{rng.randrange(TEAMS):02d}",
        "h100",
        submit,
        gpu_milli=rng.choice([250, 500, 999]),
        cpus=1,
        memory_gib=8,
        min_runtime=3600,
    )


def build_state(
    running: int = 1000, pending: int = 2000, steady: bool = True
) -> tuple[Scheduler, float]:
    """A cluster state the policy itself produced.

    ``steady``: a week of usage is seeded so team ratios spread over 0.3–1.5,
    and requests arrive one at a time with a cycle after each, as they do live;
    the measured cycle then sees a queue the previous cycles already sorted out.
    Cold start: no usage history and the whole queue arrives at once (a Hub
    restart onto a full queue), the worst case for preemption.
    """
    pools, nodes, teams = cluster()
    clock = FixedClock(0.0)
    settings = Settings()
    scheduler = Scheduler(settings, pools, nodes, teams, clock, NullActuator())
    rng = random.Random(42)
    if steady:
        capacity = sum(len(n.gpus) for n in nodes)
        for team in teams:
            ratio = rng.uniform(0.3, 1.5)
            units = ratio * team.share["h100"] * capacity * settings.lookback
            scheduler.ledger.add(team.name, "h100", -3600.0, units)
    i = 0
    while len(scheduler.running) < running and i < 20 * running:
        clock.t += 1.0
        scheduler.submit(fill_request(rng, i, clock.t))
        i += 1
        scheduler.cycle()
    clock.t += 7200.0  # the fill is now past its protected windows
    while len(scheduler.pending) < pending and i < 20 * (running + pending):
        clock.t += 5.0
        scheduler.submit(random_request(rng, i, clock.t))
        i += 1
        if steady:
            scheduler.cycle()
    return scheduler, clock.t + 1.0


def measure(steady: bool, runs: int) -> tuple[float, float]:
    """Print the cycle's figures; (median, p95) of ``decide`` in ms."""
    scheduler, now = build_state(steady=steady)
    t0 = time.perf_counter()
    view = scheduler.view(now)
    taking = time.perf_counter() - t0
    gpus_used = sum(len(g.slices) for a in view.allocations for g in a.grants)
    timings = []
    for _ in range(runs):
        t0 = time.perf_counter()
        decisions = decide(view, now)
        timings.append(time.perf_counter() - t0)
    timings.sort()
    p95 = timings[max(0, int(round(0.95 * len(timings))) - 1)]
    label = "steady" if steady else "cold start"
    print(
        f"cycle ({label}): {len(view.nodes)} nodes, {len(view.allocations)} running "
        f"({gpus_used} slices), {len(view.pending)} pending -> "
        f"{len(decisions.admissions)} admitted, {len(decisions.preemptions)} preempted"
    )
    print(
        f"cycle ({label}): decide median {statistics.median(timings) * 1e3:.1f} ms, "
        f"p95 {p95 * 1e3:.1f} ms over {len(timings)} runs "
        f"(taking the view: {taking * 1e3:.1f} ms)"
    )
    return statistics.median(timings) * 1e3, p95 * 1e3


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Print as ``main`` does; the figures (FIGURES). ``argv``: [RUNS] (30)."""
    runs = int(argv[0]) if argv else 30
    steady, steady_p95 = measure(steady=True, runs=runs)
    cold, _ = measure(steady=False, runs=max(3, runs // 10))
    return {
        "cycle.steady_median_ms": steady,
        "cycle.steady_p95_ms": steady_p95,
        "cycle.cold_start_median_ms": cold,
    }


def main(runs: int = 30) -> int:
    collect([str(runs)])
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 30))
