"""`make bench`: every benchmark in turn, each printing its figures.

* bench.cycle — one scheduling cycle, 128 nodes × 8 GPUs, 1,000 running, 2,000 pending
* bench.month — the simulator on a generated 30-day, 1,024-GPU month, seeds 1-5
* bench.idle — where the idle GPU time of the seed-1 month goes
* bench.compare — budget and the four baselines on that month (`budgethub compare`)
* bench.family — budget and legacy over 88-1,024 GPUs x loads x notebook shares, two seeds
* bench.restorable — restorable notebooks and idle-session release on five months
* the placement benchmark on the Alibaba trace (`budgethub bench placement`)
* bench.spawn — BudgetSpawner against DockerSpawner on the local engine (`make images` first)
* bench.snapshot_cells — checkpoint overhead per cell (50 cells, 200 MB of state) in the image
* bench.snapshot — preemption decision -> slices free, restore start -> variables available
  (1 GiB of kernel variables, 1 GiB of home files)
* bench.service — the budget service's API and pages: 150 users, 15 teams, 2,000 requests
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench import (
    compare,
    cycle,
    family,
    idle,
    month,
    restorable,
    service,
    snapshot,
    snapshot_cells,
    spawn,
)
from scheduler_core.research.cli import main as cli

TRACE = Path(os.environ.get("BUDGETHUB_OPENB") or "/nonexistent")
"""The Alibaba trace's folder for the placement benchmark (README, "The Alibaba trace
under load")."""


def main() -> int:
    cycle.main()
    month.main([1, 2, 3, 4, 5])
    idle.main()
    compare.main([])
    family.main([])
    restorable.main([])
    if TRACE.is_dir():
        cli(
            [
                "bench",
                "placement",
                "--pods",
                str(TRACE / "openb_pod_list_default.csv"),
                "--nodes",
                str(TRACE / "openb_node_list_gpu_node.csv"),
                "--seeds",
                "5",
            ]
        )
    else:
        print("placement: skipped, BUDGETHUB_OPENB names no folder with the Alibaba trace")
    spawn.main([])
    snapshot_cells.main([])
    snapshot.main([])
    service.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
