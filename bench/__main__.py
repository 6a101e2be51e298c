"""`make bench`: every benchmark in turn, each printing its figures, then every figure
against its bar in bench/bars.toml.

* bench.cycle — one scheduling cycle, 128 nodes × 8 GPUs, 1,000 running, 2,000 pending
* bench.month — the simulator on a generated 30-day, 1,024-GPU month, seeds 1-5
* bench.idle — where the idle GPU time of the seed-1 month goes
* bench.compare — budget and the four baselines on that month (`budgethub compare`)
* bench.family — budget and legacy over 88-1,024 GPUs x loads x notebook shares, and at
  88 and 128 GPUs the kinds issue 49 adds (two pools, organisations, a deadline burst,
  node failures, idle notebooks, batch that never checkpoints, all at once), two seeds;
  two runs at a time (the cells issue 49 added are 16 % of its simulation time, its
  1,024-GPU legacy weeks with 35 % notebooks half of it: docs/benchmarks/family.md)
* bench.forecast — the form's forecast at submit against what happened, on the family's
  88-GPU workloads
* bench.replay — `budgethub replay` on a 30-day, 1,024-GPU history written into a SQLite
  store: the time to read it and the time to replay it
* bench.restorable — restorable notebooks and idle-session release on five months
* placement — the placement benchmark on the Alibaba trace (`budgethub bench placement`;
  printed, no bar)
* bench.spawn — BudgetSpawner against DockerSpawner on the local engine (`make images` first)
* bench.browser_start — a click on Start to JupyterLab ready in headless Chromium, one
  user alone and four at once
* bench.snapshot_cells — checkpoint overhead per cell (50 cells, 200 MB of state) in the image
* bench.snapshot — preemption decision -> slices free, restore start -> variables available
  (1 GiB of kernel variables, 1 GiB of home files)
* bench.restore_fidelity — the restore-fidelity property test at scale: 40 generated
  namespaces checkpointed in a real kernel and restored into a fresh one
* bench.service — the budget service's API and pages: 150 users, 15 teams, 2,000 requests
* bench.slurm — a session as a Slurm job against the same session on Docker, and
  preemption decision -> slices free on Slurm (a real two-node cluster; root)

Each module's ``collect(argv)`` prints as its ``main`` does and returns its figures,
keyed by the ids in bars.toml (the module's FIGURES). Exit status: 0 when every figure
is within its bar, 1 when one falls outside, 2 when a figure declared for a module that
ran was not produced (a skipped part, or one that failed: its traceback is printed and
the rest still runs) or bars.toml is malformed.

    python -m bench [--only cycle,month] [--list]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import bars

TRACE = Path(os.environ.get("BUDGETHUB_OPENB") or "/nonexistent")
"""The Alibaba trace's folder for the placement benchmark (docs/benchmarks/compare.md,
"The Alibaba trace under load")."""

PLACEMENT = "placement"
MODULES: tuple[tuple[str, list[str]], ...] = (
    ("cycle", []),
    ("month", ["1", "2", "3", "4", "5"]),
    ("idle", []),
    ("compare", []),
    ("family", ["--jobs", "2"]),
    ("forecast", []),
    ("replay", []),
    ("restorable", []),
    (PLACEMENT, []),
    ("spawn", []),
    ("browser_start", []),
    ("snapshot_cells", []),
    ("snapshot", []),
    ("restore_fidelity", []),
    ("service", []),
    ("slurm", []),
)
"""What `make bench` runs, in order, with each module's arguments."""
NAMES = tuple(name for name, _ in MODULES)


def placement() -> dict[str, float]:
    """The placement benchmark where BUDGETHUB_OPENB names the trace; no figures."""
    from scheduler_core.research.cli import main as cli

    if not TRACE.is_dir():
        print("placement: skipped, BUDGETHUB_OPENB names no folder with the Alibaba trace")
        return {}
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
    return {}


def collector(name: str) -> Callable[[list[str]], dict[str, float]]:
    """The module's ``collect``, imported only when it runs (spawn needs docker)."""
    if name == PLACEMENT:
        return lambda argv: placement()
    collect: Callable[[list[str]], dict[str, float]] = importlib.import_module(
        f"bench.{name}"
    ).collect
    return collect


def names(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in NAMES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: not a benchmark (one of {', '.join(NAMES)})"
        )
    return chosen


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(
        prog="python -m bench", description="every benchmark, each figure against its bar"
    )
    out.add_argument(
        "--only",
        type=names,
        metavar="NAME,...",
        help="run these only and judge only their figures (" + ", ".join(NAMES) + ")",
    )
    out.add_argument("--list", action="store_true", help="print the bars (bench/bars.toml)")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        declared = bars.load()
    except bars.BarsError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    if args.list:
        for line in bars.listing(declared):
            print(line)
        return 0
    chosen = set(args.only or NAMES)
    figures: dict[str, float] = {}
    ran = []
    for name, module_args in MODULES:
        if name not in chosen:
            continue
        ran.append(name)
        try:
            figures.update(collector(name)(list(module_args)))
        except Exception:  # the rest still runs; its figures are then missing (exit 2)
            print(f"bench: {name} failed; its figures are missing", file=sys.stderr)
            traceback.print_exc()
    expected = [figure for figure, bar in declared.items() if bar.module in ran]
    verdicts = bars.judge(figures, declared, expected)
    print()
    print(f"bench: {len(verdicts)} figures of {', '.join(ran)} against bench/bars.toml")
    for line in bars.table(verdicts):
        print(line)
    undeclared = sorted(set(figures) - set(declared))
    if undeclared:
        print(f"bench: produced but not in bars.toml (not judged): {', '.join(undeclared)}")
    status = bars.exit_status(verdicts)
    outside = [v.bar.id for v in verdicts if v.status == bars.OUTSIDE]
    missing = [v.bar.id for v in verdicts if v.status == bars.MISSING]
    if missing:
        print(f"bench: MISSING {', '.join(missing)}")
    if outside:
        print(f"bench: OUTSIDE its bar: {', '.join(outside)}")
    if status == 0:
        print("bench: every figure within its bar")
    return status


if __name__ == "__main__":
    sys.exit(main())
