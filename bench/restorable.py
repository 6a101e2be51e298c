"""Restorable notebooks and idle-session release on seed-like months.

Run: `.venv/bin/python -m bench.restorable [--quick | --busy]` (`--busy`: the two
notebook-heavy months only). For each month of the
family (1,024 GPUs seeds 1 and 2, 256 GPUs seed 1, and the two below; `--quick`:
1,024 GPUs seed 1 only) it simulates four variants with the same requests:

Two more months are notebook-heavy and over capacity (256 and 88 GPUs, arrivals
1.2x capacity, notebooks 35 % of the work), where notebooks wait today.

* ``today``: notebooks are not resumable; a preempted one loses its work;
* ``restorable``: notebooks come back from their snapshot (resumable) — what
  snapshot/restore gives, without idleness;
* ``idle 25% release 30m`` / ``idle 50% release 30m``: each notebook sits idle
  for the last quarter / half of its run (generator knob ``--idle-share``) and
  the policy may release a funded notebook idle for 30 minutes for any team's
  funded request (``idle_release``).

How idle real notebooks are is not known here, so the idle share is a range,
not one figure. Printed per variant: GPU-h of work lost, the notebooks' first
wait (p50, p90), how long preempted notebooks waited to come back (p50), the
preemptions of notebooks, occupancy, and the worst team's daily fulfilment.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

from scheduler_core.metrics import percentile, result
from scheduler_core.research.generator import SeedLikeOptions, seed_like
from scheduler_core.scenario import parse_scenario
from scheduler_core.simulator import Simulation

HOUR = 3600.0
VARIANTS: tuple[tuple[str, dict[str, Any], float], ...] = (
    ("today", {"restorable": False}, 0.0),
    ("restorable", {"restorable": True}, 0.0),
    ("idle 25% release 30m", {"restorable": True, "idle_share": 0.25}, 1800.0),
    ("idle 50% release 30m", {"restorable": True, "idle_share": 0.5}, 1800.0),
)
FAMILY: tuple[tuple[int, int, dict[str, Any]], ...] = (
    (1024, 1, {}),
    (1024, 2, {}),
    (256, 1, {}),
    # Notebook-heavy and over capacity: where notebooks wait today.
    (256, 1, {"load": 1.2, "interactive_share": 0.35}),
    (88, 1, {"load": 1.2, "interactive_share": 0.35}),
)
FIGURES = ("restorable.lost_gpu_h", "restorable.lost_gpu_h_today")
"""The figures ``collect`` returns (bench/bars.toml)."""


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < HOUR:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / HOUR:.1f}h"


def run_variant(
    gpus: int, seed: int, mix: dict[str, Any], knobs: dict[str, Any], release: float
) -> dict[str, Any]:
    options = SeedLikeOptions(gpus=gpus, seed=seed, scale_users=gpus < 1024, **mix, **knobs)
    scenario = parse_scenario(seed_like(options))
    if release:
        scenario = dataclasses.replace(
            scenario, settings=scenario.settings.replace(idle_release=release)
        )
    started = time.perf_counter()
    run = Simulation(scenario).run()
    wall = time.perf_counter() - started
    metrics = result(run)["metrics"]
    notebooks = [r for r in run.records.values() if r.klass == "interactive"]
    first = [r.wait for r in notebooks if r.wait is not None]
    back = [
        start - end
        for r in notebooks
        for end, start in zip(r.ends, r.starts[1:], strict=False)
        if r.preemptions
    ]
    teams = [t for t in metrics["teams"].values() if t["daily_fulfilment"] is not None]
    return {
        "lost_h": metrics["lost_gpu_seconds"] / HOUR,
        "first_p50": percentile(sorted(first), 50) if first else None,
        "first_p90": percentile(sorted(first), 90) if first else None,
        "back_p50": percentile(sorted(back), 50) if back else None,
        "notebook_preemptions": sum(r.preemptions for r in notebooks),
        "occupancy": metrics["occupancy"],
        "worst_daily": min(t["daily_fulfilment"] for t in teams),
        "wall": wall,
    }


def main(argv: list[str]) -> int:
    collect(argv)
    return 0


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Print the table as ``main`` does; the work lost, today and restorable, summed over
    the months (FIGURES)."""
    argv = argv or []
    lost: dict[str, float] = {}
    family = FAMILY[:1] if "--quick" in argv else FAMILY[3:] if "--busy" in argv else FAMILY
    print(
        f"{'month':<16} {'variant':<22} {'lost GPU-h':>10} {'nb wait p50':>11} "
        f"{'p90':>7} {'back p50':>8} {'nb preempt':>10} {'occup.':>7} {'worst day':>9} {'wall':>6}"
    )
    for gpus, seed, mix in family:
        label = f"{gpus}g s{seed}" + (
            f" L{mix['load']:g} nb{mix['interactive_share']:.0%}" if mix else ""
        )
        for name, knobs, release in VARIANTS:
            out = run_variant(gpus, seed, mix, knobs, release)
            lost[name] = lost.get(name, 0.0) + out["lost_h"]
            print(
                f"{label:<16} {name:<22} {out['lost_h']:>10,.0f} "
                f"{_fmt(out['first_p50']):>11} {_fmt(out['first_p90']):>7} "
                f"{_fmt(out['back_p50']):>8} {out['notebook_preemptions']:>10} "
                f"{out['occupancy']:>7.1%} {out['worst_daily']:>9.1%} {out['wall']:>5.0f}s",
                flush=True,
            )
    return {
        "restorable.lost_gpu_h": lost["restorable"],
        "restorable.lost_gpu_h_today": lost["today"],
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
