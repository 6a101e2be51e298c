"""Where the idle GPU time of a seed-like month goes, under the budget policy.

Run: `.venv/bin/python -m bench.idle [SEED]` (default 1). Simulates the month
with an observer that, after every cycle, sorts each GPU node's free
GPU-equivalents into one cause and weighs it by the time until the next cycle:

* a node whose GPUs are all MIG-partitioned (only MIG requests fit there);
* a node held for a starving funded request (rule 7);
* nothing is waiting in the pool;
* a whole node free while every waiting request needs more whole nodes than
  are free (they gather as running work ends);
* part of a node free while every waiting request needs whole GPUs in
  numbers that part cannot hold;
* anything else.

Occupancy is one minus the total over the pools' GPUs, so the lines say what
stands between the policy and a full cluster.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from scheduler_core.model import PoolKind
from scheduler_core.research.generator import SeedLikeOptions, seed_like
from scheduler_core.scenario import parse_scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import Simulation
from scheduler_core.view import Decisions

CAUSES = (
    "MIG-partitioned node",
    "held for a starving funded request",
    "nothing waiting",
    "whole node free, every waiting request needs more whole nodes",
    "part of a node free, too small for every waiting request",
    "other",
)
FIGURES = ("idle.idle_share",)
"""The figures ``collect`` returns (bench/bars.toml)."""


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Print as ``main`` does; the figures (FIGURES). ``argv``: [SEED] (1)."""
    return {"idle.idle_share": idle_share(int(argv[0]) if argv else 1)}


def main(seed: int = 1) -> int:
    idle_share(seed)
    return 0


def idle_share(seed: int) -> float:
    """Simulate seed ``seed``'s month, print where its idle GPU time goes; the idle
    GPUs on average as a share of the cluster's."""
    scenario = parse_scenario(seed_like(SeedLikeOptions(seed=seed)))
    gpu_pools = {p.name for p in scenario.pools if p.kind is PoolKind.GPU}
    capacity = sum(len(n.gpus) for n in scenario.nodes if n.pool in gpu_pools)
    seconds: dict[str, float] = dict.fromkeys(CAUSES, 0.0)
    state: dict[str, float] = {}
    last = [0.0]

    def observe(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
        for cause, idle in state.items():
            seconds[cause] += idle * (now - last[0])
        last[0] = now
        state.clear()
        used: dict[str, float] = defaultdict(float)
        for allocation in scheduler.running.values():
            for grant in allocation.grants:
                used[grant.node] += allocation.charge_rate / len(allocation.grants)
        held = {node for nodes in scheduler.reservations.values() for node in nodes}
        smallest: dict[str, float] = {}
        for request in scheduler.pending.values():
            rate = request.charge_rate(PoolKind.GPU)
            smallest[request.pool] = min(smallest.get(request.pool, rate), rate)
        for node in scheduler.nodes.values():
            if node.pool not in gpu_pools:
                continue
            idle = len(node.gpus) - used[node.name]
            if idle <= 1e-6:
                continue
            need = smallest.get(node.pool)
            if node.gpus and all(g.mig for g in node.gpus):
                cause = CAUSES[0]
            elif node.name in held:
                cause = CAUSES[1]
            elif need is None:
                cause = CAUSES[2]
            elif idle >= len(node.gpus) - 1e-6 and need > idle:
                cause = CAUSES[3]
            elif need > idle:
                cause = CAUSES[4]
            else:
                cause = CAUSES[5]
            state[cause] = state.get(cause, 0.0) + idle

    Simulation(scenario, observer=observe).run()
    horizon = scenario.horizon
    for cause, idle in state.items():
        seconds[cause] += idle * max(0.0, horizon - last[0])
    total = sum(seconds.values()) / horizon
    print(
        f"idle (seed {seed}): {total:.1f} of {capacity} GPUs on average "
        f"({total / capacity:.2%}; occupancy {1 - total / capacity:.1%})"
    )
    for cause in CAUSES:
        gpus = seconds[cause] / horizon
        print(f"idle (seed {seed}):   {gpus:5.1f} GPUs ({gpus / capacity:.2%}) {cause}")
    return total / capacity


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1))
