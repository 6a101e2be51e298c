"""`budgethub replay` on a 30-day, 1,024-GPU history: the time to read the store, and the
time to replay it (issue 51).

Run: `.venv/bin/python -m bench.replay [--seed 1] [--days 30] [--gpus 1024] [--no-live]`.

The history is the seed-like month of `bench.month` (`budgethub generate seed-like
--seed 1`), simulated and written into a SQLite store as the Hub would have recorded it
(`replay_write`; neither step is timed). Then, timed apart:

* **read**: the store opened read-only and the month's history read (`replay_store`);
* **replay**: the history made a scenario with its starting state, simulated, both runs'
  outcomes measured once (`replay.outcome`: the outcome table's rows, whose team
  figures the comparison reuses), and compared request by request (`replay.plan`,
  `simulate`, `outcome`, `compare`), as `budgethub replay`'s report does;
* **around the simulation**: the read and the replay less the simulation, the part the
  replay adds to the simulator's own time.

Bar (issue 51): the replay within the month's own bar, 8 s (`month.simulated_s`), plus the
time to read the store, which is reported beside it, as is the time the month's own
simulation took in the same run (it writes the history: the same conditions, for a loaded
machine or a core running from source). The round trip must also hold at this size: the
replay's start order agrees on every pair.

Figures from the live run (`replay.order_agreement`, `replay.wait_error_p50_s`,
`replay.wait_error_p90_s`): the live-run test's scenario run again on a real Hub
(`harness.liverun`), then replayed; no bar (the issue's 95 % of pairs and one cycle tick
plus the median spawn latency are the test's). ``--no-live`` leaves it out.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from scheduler_core.research.generator import SeedLikeOptions, seed_like
from scheduler_core.research.replay import compare, outcome, plan, simulate
from scheduler_core.research.replay_store import open_store, read_history
from scheduler_core.research.replay_write import simulate_recorded, write_run
from scheduler_core.scenario import parse_scenario
from scheduler_core.store import Store

BASE = 1_790_000_000.0
"""The epoch second the written month starts at."""

FIGURES = (
    "replay.read_s",
    "replay.month_s",
    "replay.around_simulation_s",
    "replay.history_simulated_s",
    "replay.month_order_agreement",
    "replay.order_agreement",
    "replay.wait_error_p50_s",
    "replay.wait_error_p90_s",
)
"""The figures ``collect`` returns (bench/bars.toml)."""


def live_figures() -> dict[str, float]:
    """The figures of the live run compared (`replay.order_agreement`,
    `replay.wait_error_p50_s`, `replay.wait_error_p90_s`): the live run of
    tests/integration/test_replay_live.py (`harness.liverun`: a real Hub on the local
    Docker engine, 42 sessions over about five minutes), then `budgethub replay` on its
    store. It needs the engine and the session images (`make images`)."""
    from harness.hub import new_hub_name
    from harness.liverun import live_figures as measured

    with tempfile.TemporaryDirectory(prefix="bench-replay-live-") as folder:
        found = measured(Path(folder), new_hub_name("bench.replay"))
    print(
        f"replay (live run): start order {found['order_agreement']:.4f} of the pairs, "
        f"|wait error| p50 {found['wait_error_p50_s']:g} s, p90 {found['wait_error_p90_s']:g} s"
    )
    return {f"replay.{name}": value for name, value in found.items()}


class _Clock:
    """Wall and CPU time (this process's) of each step: on a loaded machine the CPU time
    is the steadier of the two."""

    def __init__(self) -> None:
        self.laps: dict[str, tuple[float, float]] = {}
        self._at = (time.perf_counter(), time.process_time())

    def lap(self, name: str) -> None:
        now = (time.perf_counter(), time.process_time())
        self.laps[name] = (now[0] - self._at[0], now[1] - self._at[1])
        self._at = now

    def shown(self) -> str:
        return ", ".join(f"{n} {w:.2f} / {c:.2f} s" for n, (w, c) in self.laps.items())


def measure(seed: int, days: int, gpus: int) -> dict[str, float]:
    """Write the month into a fresh SQLite store, then time reading and replaying it."""
    options = SeedLikeOptions(seed=seed, days=days, gpus=gpus)
    scenario = parse_scenario(seed_like(options))
    started = time.perf_counter()
    recorded = simulate_recorded(scenario)
    simulated_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as folder:
        path = os.path.join(folder, "store.sqlite")
        store = Store.create(f"sqlite:///{path}")
        started = time.perf_counter()
        try:
            write_run(store, recorded, BASE)
        finally:
            store.close()
        write_s = time.perf_counter() - started
        size_mb = os.path.getsize(path) / 1e6
        clock = _Clock()
        source = open_store(path)
        try:
            history = read_history(source, BASE, BASE + scenario.horizon, 0.0)
        finally:
            source.close()
        clock.lap("read")
    # The steps of `budgethub replay`'s report (commands/replay.replay_report), timed apart.
    the_plan = plan(history)
    clock.lap("plan")
    again = simulate(the_plan)
    clock.lap("simulate")
    live_out, replay_out = outcome("live", the_plan.live), outcome("replay", again)
    clock.lap("outcomes")
    compared = compare(the_plan, again, live_out, replay_out)["comparison"]
    clock.lap("compare")
    wall = {name: w for name, (w, _) in clock.laps.items()}
    read_s = wall["read"]
    replay_s = sum(wall.values()) - read_s
    added = read_s + replay_s - wall["simulate"]
    print(
        f"replay (seed {seed}): {len(scenario.requests)} requests, {gpus} GPUs, {days} days; "
        f"simulated in {simulated_s:.1f} s, written in {write_s:.1f} s ({size_mb:.1f} MB)"
    )
    print(
        f"replay (seed {seed}): read {read_s:.2f} s + replay {replay_s:.2f} s = "
        f"{read_s + replay_s:.2f} s; start order "
        f"{compared['order_agreement']:.4f} of {compared['order_pairs']:,} pairs, "
        f"|wait error| p90 {compared['wait_abs_error_s']['p90']} s"
    )
    print(f"replay (seed {seed}): its steps, wall / CPU: {clock.shown()}")
    cpu_added = sum(c for name, (_, c) in clock.laps.items() if name != "simulate")
    print(
        f"replay (seed {seed}): around the simulation {added:.2f} s of wall time, "
        f"{cpu_added:.2f} s of CPU"
    )
    return {
        "replay.read_s": round(read_s, 2),
        "replay.month_s": round(replay_s, 2),
        "replay.around_simulation_s": round(added, 2),
        "replay.history_simulated_s": round(simulated_s, 2),
        "replay.month_order_agreement": float(compared["order_agreement"] or 0.0),
    }


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Print as ``main`` does; the figures (FIGURES)."""
    parser = argparse.ArgumentParser(prog="python -m bench.replay")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument(
        "--no-live", action="store_true", help="leave out the live run (about six minutes)"
    )
    args = parser.parse_args(argv or [])
    month = measure(args.seed, args.days, args.gpus)
    return month if args.no_live else month | live_figures()


def main(argv: list[str] | None = None) -> int:
    collect(argv)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
