"""The budget policy and legacy over a family of seed-like workloads, against issue 12's bars.

Run: `.venv/bin/python -m bench.family [--gpus 88,128,256,1024] [--loads 0.8,1.0,1.2]
[--shares 0.05,0.35] [--kinds base,pools,...] [--kind-gpus 88,128] [--kind-loads 1.0]
[--kind-shares 0.35] [--seeds 1,2] [--days 7] [--baselines] [--set NAME=VALUE]
[--against NAME=VALUE] [--save PATH] [--paired-with PATH] [--plot PATH]`.

Each cell of the grid is a cluster size, an arrival load, a notebook share and a kind
(KINDS): ``base`` is the seed-like workload below; the others add what real clusters
have (issue 49): two GPU pools (H100 and B200 nodes, a share of each per team), teams
in organisations, a deadline burst (one team 3x for two days), node failures and
repairs, notebooks that go idle, half the batch work never checkpointing, and ``all``
of these at once. Base runs over --gpus x --loads x --shares (24 cells), the other
kinds over --kind-gpus x --kind-loads x --kind-shares (88 and 128 GPUs at load 1 with
35 % notebooks, where fairness is hardest and a run takes seconds: 14 cells). The
``up`` column is the GPU time on nodes not down, from the scenario's events: where it
is below a bar, occupancy and the worst team cannot reach that bar by construction
(every team is owed its share of the whole pool), and the verdict says so with a star.
For each of its seeds it generates `budgethub generate seed-like --gpus G
--days D --load L --interactive-share S --scale-users --mig-nodes G/1024
--seed N` (15 teams, a standing backlog of 2.5x capacity, arrivals at L x
capacity after it, users scaled with the cluster, and one MIG-partitioned node
per 1,024 GPUs as in the default month: only MIG debug sessions can use such a
node, and on 88 GPUs it would be 9 % of the cluster, so occupancy could not
reach 95 % whatever the policy) and simulates it under ``budget`` and ``legacy``
(``--baselines`` adds fairshare, quota and fifo), one run after another in
this process (``--jobs N`` runs N at once).

The table has one row per cell; a figure that differs between seeds reads
``low-high`` (the spread, not the best case), and a bar holds only if it holds
on every seed:

* debug p90 wait <= 60 s;
* occupancy >= 97 %;
* every team's daily fulfilment >= 95 % (`scheduler_core.metrics`: owed and
  delivered GPU-hours summed per day before capping);
* lost work <= legacy's + 1 point of the GPU time, and goodput >= legacy's - 1 point,
  run by run on the same scenario (issue 49);
* legacy's debug p90 >= 5x budget's (taken as held where both are 0 s, and
  shown as ``both 0``).

``--against`` runs budget a second time with the setting laid over, on the same
scenarios, and prints the change run by run with its spread and its price in lost
work: a cell's verdict on two seeds flips under a one-second change of the cycle
tick (docs/benchmarks/family.md, "How far one cell's verdict can be trusted"), so a
rule is judged on the pairs, over many seeds, and not on the table. A rule with no
setting is judged across two trees: ``--save PATH`` writes every run's figures as
JSON, and ``--paired-with PATH``, run in the other tree, prints the same pairs
against the budget runs saved there (matched on cell, seed, days and
``--small-teams``).

The plot (matplotlib, Agg backend; ``--plot``, default ``out/bench/family.png``)
has one row per notebook share and, across, debug p90, occupancy and the worst
team's daily fulfilment against the load, one line per cluster size (budget
solid, legacy dashed), the seeds' spread as error bars, and the bars dotted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from scheduler_core.errors import InputError
from scheduler_core.metrics import result
from scheduler_core.research.generator import (
    SeedLikeOptions,
    down_gpu_seconds,
    seed_like,
    validate,
)
from scheduler_core.scenario import Scenario, parse_scenario
from scheduler_core.settings import SettingError, settings_from_mapping
from scheduler_core.simulator import Simulation

BASELINES = ("fairshare", "quota", "fifo")
DEBUG_P90_BAR_S = 60.0
OCCUPANCY_BAR = 0.97
DAILY_BAR = 0.95
LEGACY_RATIO_BAR = 5.0
LOST_BAR_POINTS = 1.0
"""Issue 49: budget's lost work at most legacy's + this many points of the GPU time, and
its goodput at least legacy's - this many, run by run on the same scenario."""
DEFAULT_PLOT = Path("out") / "bench" / "family.png"
GPUS = (88, 128, 256, 1024)
LOADS = (0.8, 1.0, 1.2)
SHARES = (0.05, 0.35)
"""The base grid's sizes, loads and notebook shares."""
MIG_EVERY = 1024
"""One MIG-partitioned node per this many GPUs (none below)."""
FIGURES = (
    "family.debug_p90_s",
    "family.occupancy",
    "family.worst_team_daily",
    "family.legacy_debug_ratio",
    "family.lost_over_legacy_points",
    "family.goodput_under_legacy_points",
)
"""The figures ``collect`` returns, each the worst run's (bench/bars.toml): a bar holds
where it holds on every seed of every cell."""


FAILURE_RATE = 0.05
"""Node failures per node per day in the ``failures`` cells: 13x the interruption rate
Llama 3's training reported (419 in 54 days on 2,048 nodes, 0.0038), so that a week on
11 nodes sees a few rather than none."""
REPAIR_HOURS = 8.0
IDLE_SHARE = 0.3
"""The ``idle`` cells: each notebook sits idle for the last 30 % of its run."""
CHECKPOINTING = 0.5
"""The ``ckpt`` cells: half the batch jobs never checkpoint (the default mix is 80 / 20)."""
ORGS = 3
BURST = 3.0
BURST_DAYS = 2.0


def _pools(gpus: int, days: int) -> dict[str, Any]:
    """Half the nodes H100 (rounded down), the rest B200."""
    h100 = gpus // (2 * 8) * 8
    return {"gpus": h100, "b200_gpus": gpus - h100}


KINDS: dict[str, tuple[str, Callable[[int, int], dict[str, Any]]]] = {
    "base": ("the seed-like workload as issue 12 drew it", lambda gpus, days: {}),
    "pools": ("two GPU pools, H100 and B200 nodes, a share of each per team", _pools),
    "orgs": (f"the 15 teams in {ORGS} organisations", lambda gpus, days: {"orgs": ORGS}),
    "burst": (
        f"one team's batch work {BURST:g}x for {BURST_DAYS:g} days (a deadline)",
        lambda gpus, days: {"burst": BURST, "burst_days": min(BURST_DAYS, days)},
    ),
    "failures": (
        f"{FAILURE_RATE:g} node failures per node and day, {REPAIR_HOURS:g} h repairs",
        lambda gpus, days: {"failure_rate": FAILURE_RATE, "repair_hours": REPAIR_HOURS},
    ),
    "idle": (
        f"notebooks idle for the last {IDLE_SHARE:.0%} of their run",
        lambda gpus, days: {"idle_share": IDLE_SHARE},
    ),
    "ckpt": (
        f"{1 - CHECKPOINTING:.0%} of batch jobs never checkpoint",
        lambda gpus, days: {"checkpointing": CHECKPOINTING},
    ),
}
"""The cells' kinds: each a change of the generator's knobs (``all`` takes every one)."""
ALL = "all"
KIND_NAMES = (*KINDS, ALL)


def kind_changes(kind: str, gpus: int, days: int) -> dict[str, Any]:
    """The generator knobs a kind of cell sets (``all``: every kind's together)."""
    if kind == ALL:
        out: dict[str, Any] = {}
        for _, changes in KINDS.values():
            out |= changes(gpus, days)
        return out
    return KINDS[kind][1](gpus, days)


@dataclass(frozen=True)
class Cell:
    gpus: int
    load: float
    share: float
    kind: str = "base"
    """A name of KIND_NAMES: what the workload has beside the seed-like base."""

    def label(self) -> str:
        text = f"{self.gpus} GPUs, load {self.load:g}, notebooks {self.share:.0%}"
        return text if self.kind == "base" else f"{text}, {self.kind}"


@dataclass(frozen=True)
class Job:
    cell: Cell
    seed: int
    policy: str
    days: int
    small_teams: int
    settings: tuple[tuple[str, float | str], ...] = ()
    """``--set`` values, laid over the budget policy's settings (scenario names)."""


@dataclass(frozen=True)
class Outcome:
    """What one run of one policy on one seed of one cell gives."""

    job: Job
    requests: int
    debug_p90_s: float
    all_p50_s: float
    occupancy: float
    worst_team: str
    worst_daily: float
    wall_s: float
    lost_gpu_h: float = 0.0
    """Work lost to preemption (GPU-hours of runs that start over; scheduler_core.metrics)."""
    preemptions: int = 0
    lost_share: float = math.nan
    """``lost_gpu_h`` over all GPU time in the week (NaN in runs saved before it was kept)."""
    goodput: float = math.nan
    """Occupancy less ``lost_share``: the GPU time that went to work not thrown away."""
    lost_by_class: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    """``lost_gpu_h`` of batch, interactive and debug work (NaN in runs saved before)."""
    up_share: float = 1.0
    """The GPU time on nodes not down, from the scenario's node events (the lowest of its
    GPU pools): occupancy cannot pass it, and where every team asks for its share all the
    time, neither can the worst team's daily fulfilment (what is owed is the whole
    pool's share, what can be delivered only the up part)."""
    lost_by_stop: tuple[tuple[str, float], ...] = ()
    """``lost_gpu_h`` split by the stop that threw it away (the result's
    ``lost_gpu_h_by_stop``, scheduler_core.metrics:
    reason/funded|borrowed/class/checkpoint|snapshot|whole)."""


def options(job: Job) -> SeedLikeOptions:
    plain = SeedLikeOptions(
        gpus=job.cell.gpus,
        days=job.days,
        seed=job.seed,
        load=job.cell.load,
        interactive_share=job.cell.share,
        scale_users=True,
        small_teams=job.small_teams,
        mig_nodes=job.cell.gpus // MIG_EVERY,
    )
    return replace(plain, **kind_changes(job.cell.kind, job.cell.gpus, job.days))


def up_share(scenario: dict[str, Any]) -> float:
    """The lowest GPU pool's share of GPU time on nodes that are not down."""
    down = down_gpu_seconds(scenario)
    horizon = float(scenario["horizon"])
    shares = [1.0]
    for pool, seconds in down.items():
        gpus = sum(
            int(n.get("count", 1)) * int(n.get("gpus", 0))
            for n in scenario["nodes"]
            if n["pool"] == pool
        )
        shares.append(1 - sum(seconds) / (gpus * horizon))
    return min(shares)


def scenario_of(job: Job, generated: dict[str, Any] | None = None) -> Scenario:
    """The job's generated scenario under its policy, with its ``--set`` settings if the
    policy is budget: the baselines run as they do without ``--set``, so that a setting
    is weighed against the same legacy figures (the scheduler's cycles, which every
    policy shares, also follow some settings)."""
    scenario = parse_scenario(generated or seed_like(options(job)))
    base = scenario.settings.replace(name=job.policy)
    if job.policy != "budget":
        return replace(scenario, settings=base)
    return replace(scenario, settings=settings_from_mapping(dict(job.settings), base))


def run(job: Job) -> Outcome:
    """Generate the job's scenario, simulate it under the job's policy, reduce to figures."""
    generated = seed_like(options(job))
    scenario = scenario_of(job, generated)
    started = time.perf_counter()
    document = result(Simulation(scenario).run())
    metrics = document["metrics"]
    wall = time.perf_counter() - started
    waits = metrics["wait_s"]
    by_class = metrics["lost_gpu_h_by_class"]
    daily = {n: t["daily_fulfilment"] for n, t in metrics["teams"].items()}
    team, worst = min(
        ((n, v) for n, v in daily.items() if v is not None),
        key=lambda item: item[1],
        default=("-", math.nan),
    )
    return Outcome(
        job=job,
        requests=len(scenario.requests),
        debug_p90_s=float(waits["debug"]["p90"] or 0.0),
        all_p50_s=float(waits["all"]["p50"] or 0.0),
        occupancy=float(metrics["occupancy"]),
        worst_team=team,
        worst_daily=float(worst),
        wall_s=wall,
        lost_gpu_h=float(metrics["lost_gpu_seconds"]) / 3600.0,
        preemptions=int(metrics["preemptions"]),
        lost_share=float(metrics["lost_share"]),
        goodput=float(metrics["goodput"]),
        lost_by_class=(
            float(by_class["batch"]),
            float(by_class["interactive"]),
            float(by_class["debug"]),
        ),
        up_share=up_share(generated),
        lost_by_stop=tuple((k, float(v)) for k, v in document["lost_gpu_h_by_stop"].items()),
    )


# --- the table -----------------------------------------------------------------


def fmt_wait(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """``low-high`` over the seeds (one figure where they agree); with three seeds or
    more ``min/median/max``."""
    low, high = min(values), max(values)
    if fmt(low) == fmt(high):
        return fmt(low)
    if len(values) >= 3:
        return "/".join(fmt(v) for v in (low, statistics.median(values), high))
    return f"{fmt(low)}-{fmt(high)}"


def percent(value: float) -> str:
    return f"{value:.1%}"


def legacy_ratio_holds(budget: Outcome, legacy: Outcome) -> bool:
    return legacy.debug_p90_s >= LEGACY_RATIO_BAR * budget.debug_p90_s


@dataclass(frozen=True)
class Verdict:
    debug: bool
    occupancy: bool
    teams: bool
    legacy: bool

    @property
    def all(self) -> bool:
        return self.debug and self.occupancy and self.teams and self.legacy


def budget_bars(budget: Sequence[Outcome]) -> tuple[bool, bool, bool]:
    """The bars that concern budget alone (debug, occupancy, teams), on every run."""
    return (
        all(o.debug_p90_s <= DEBUG_P90_BAR_S for o in budget),
        all(o.occupancy >= OCCUPANCY_BAR for o in budget),
        all(o.worst_daily >= DAILY_BAR for o in budget),
    )


def verdict(budget: Sequence[Outcome], legacy: Sequence[Outcome]) -> Verdict:
    """The bars of one cell; each must hold on every seed."""
    by_seed = {o.job.seed: o for o in legacy}
    debug, occupancy, teams = budget_bars(budget)
    return Verdict(
        debug=debug,
        occupancy=occupancy,
        teams=teams,
        legacy=all(legacy_ratio_holds(o, by_seed[o.job.seed]) for o in budget),
    )


def ratio_text(budget: Sequence[Outcome], legacy: Sequence[Outcome]) -> str:
    by_seed = {o.job.seed: o for o in legacy}
    ratios = []
    for ours in budget:
        theirs = by_seed[ours.job.seed].debug_p90_s
        if ours.debug_p90_s:
            ratios.append(theirs / ours.debug_p90_s)
        else:
            ratios.append(math.inf if theirs else math.nan)
    if all(math.isnan(r) for r in ratios):
        return "both 0"
    finite = [r for r in ratios if not math.isnan(r)]
    return spread(finite, lambda r: "inf" if math.isinf(r) else f"{r:.1f}x")


KEY = f"{'gpus':>5} {'load':>4} {'nb':>4} {'kind':>8}"
HEADER = (
    f"{KEY} | {'debug p90':>11} {'all p50':>11} {'occup.':>11}"
    f" {'worst team daily':>24} {'up':>6} | {'legacy p90':>11} {'legacy occ.':>11}"
    f" {'ratio':>11} | {'p90':>4} {'occ':>5} {'team':>5} {'5x':>4}"
)


def key(cell: Cell) -> str:
    """A cell's columns at the start of a row (KEY)."""
    return f"{cell.gpus:>5} {cell.load:>4g} {cell.share:>4.0%} {cell.kind:>8}"


def mark(held: bool) -> str:
    return "ok" if held else "MISS"


def capped_mark(held: bool, budget: Sequence[Outcome], bar: float) -> str:
    """``mark``, with a star where a seed's nodes were down for so long that the bar was
    out of reach by construction (its up share below the bar)."""
    return mark(held) + ("*" if any(o.up_share < bar for o in budget) else "")


def up_text(budget: Sequence[Outcome]) -> str:
    """The lowest up share over the seeds; ``-`` where no node went down."""
    low = min(o.up_share for o in budget)
    return "-" if low >= 1 else f"{low:.1%}"


def table(cells: Sequence[Cell], outcomes: Sequence[Outcome]) -> list[str]:
    lines = [HEADER, "-" * len(HEADER)]
    for cell in cells:
        mine = [o for o in outcomes if o.job.cell == cell]
        budget = [o for o in mine if o.job.policy == "budget"]
        legacy = [o for o in mine if o.job.policy == "legacy"]
        worst = min(budget, key=lambda o: o.worst_daily)
        daily = spread([o.worst_daily for o in budget], percent)
        bars = verdict(budget, legacy)
        lines.append(
            f"{key(cell)} |"
            f" {spread([o.debug_p90_s for o in budget], fmt_wait):>11}"
            f" {spread([o.all_p50_s for o in budget], fmt_wait):>11}"
            f" {spread([o.occupancy for o in budget], percent):>11}"
            f" {daily + ' ' + worst.worst_team:>24} {up_text(budget):>6} |"
            f" {spread([o.debug_p90_s for o in legacy], fmt_wait):>11}"
            f" {spread([o.occupancy for o in legacy], percent):>11}"
            f" {ratio_text(budget, legacy):>11} |"
            f" {mark(bars.debug):>4} {capped_mark(bars.occupancy, budget, OCCUPANCY_BAR):>5}"
            f" {capped_mark(bars.teams, budget, DAILY_BAR):>5} {mark(bars.legacy):>4}"
        )
    return lines


LOST_HEADER = (
    f"{KEY} | {'budget lost h':>13} {'lost %':>11} {'goodput':>11}"
    f" | {'legacy lost h':>13} {'lost %':>11} {'goodput':>11} | {'goodput b-l':>13} bar"
)


def points(value: float) -> str:
    return f"{value:+.1f}"


def point_spread(values: Sequence[float]) -> str:
    """Signed points as ``low..high`` (a dash would read as a minus)."""
    low, high = points(min(values)), points(max(values))
    return low if low == high else f"{low}..{high}"


def gaps(budget: Sequence[Outcome], legacy: Sequence[Outcome]) -> list[float]:
    """Budget's goodput less legacy's, in points, run by run on the same scenario."""
    theirs = {(o.job.cell, o.job.seed): o.goodput for o in legacy}
    return [
        100 * (o.goodput - theirs[o.job.cell, o.job.seed])
        for o in budget
        if (o.job.cell, o.job.seed) in theirs
    ]


def lost_table(cells: Sequence[Cell], outcomes: Sequence[Outcome]) -> list[str]:
    """Per cell, budget beside legacy: GPU-h lost to preemption, that as a share of the
    GPU time, goodput (occupancy less the lost share), and budget's goodput less legacy's
    in points, each as its spread over the seeds."""
    lines = [
        "family: work lost to preemption and goodput (occupancy less the lost share), budget"
        " beside legacy; lost: the price of each preemption, run again"
        " (scheduler_core.metrics)",
        LOST_HEADER,
        "-" * len(LOST_HEADER),
    ]
    for cell in cells:
        row = key(cell)
        runs = {
            policy: [o for o in outcomes if o.job.cell == cell and o.job.policy == policy]
            for policy in ("budget", "legacy")
        }
        for policy in ("budget", "legacy"):
            mine = runs[policy]
            if not mine:
                row += f" | {'-':>13} {'-':>11} {'-':>11}"
                continue
            row += (
                f" | {spread([o.lost_gpu_h for o in mine], lambda h: f'{h:,.0f}'):>13}"
                f" {spread([o.lost_share for o in mine], percent):>11}"
                f" {spread([o.goodput for o in mine], percent):>11}"
            )
        gap = gaps(runs["budget"], runs["legacy"])
        held = lost_mark(runs["budget"], runs["legacy"])
        lines.append(row + f" | {point_spread(gap) if gap else '-':>13} {held}")
        lines.append(
            f"{'':>{len(KEY)}} | by class, GPU-h (batch/interactive/debug): {by_class(runs)}"
        )
    return lines


def lost_mark(budget: Sequence[Outcome], legacy: Sequence[Outcome]) -> str:
    """Issue 49's bars on one cell, run by run against legacy on the same seed: lost
    work within `LOST_BAR_POINTS` above legacy's and goodput within as much below."""
    theirs = {o.job.seed: o for o in legacy}
    pairs = [(o, theirs[o.job.seed]) for o in budget if o.job.seed in theirs]
    if not pairs:
        return "-"
    held = all(
        100 * (ours.lost_share - other.lost_share) <= LOST_BAR_POINTS
        and 100 * (other.goodput - ours.goodput) <= LOST_BAR_POINTS
        for ours, other in pairs
    )
    return mark(held)


def by_class(runs: dict[str, list[Outcome]]) -> str:
    """Each policy's lost GPU-h per class, each its spread over the seeds."""
    parts = []
    for policy in ("budget", "legacy"):
        mine = runs[policy]
        if mine:
            classes = "/".join(
                spread([o.lost_by_class[k] for o in mine], lambda h: f"{h:,.0f}") for k in range(3)
            )
            parts.append(f"{policy} {classes}")
    return "; ".join(parts) or "-"


STOP_ROWS = 12
"""`stop_lines` prints each policy's costliest causes, and the rest summed."""


def stop_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """Each policy's lost work over its runs, split by the stop that threw it away
    (`Outcome.lost_by_stop`): GPU-h summed over the runs, that as a share of the
    policy's loss, and as points of all the runs' GPU time; then the spread over the runs
    in points. Runs saved before the split was kept are left out."""
    lines = []
    for policy in ("budget", "legacy", *BASELINES):
        runs = [o for o in outcomes if o.job.policy == policy and o.lost_share > 0]
        runs = [o for o in runs if o.lost_by_stop]
        if not runs:
            continue
        capacity = {id(o): o.lost_gpu_h / o.lost_share for o in runs}
        total_capacity = sum(capacity.values())
        total = sum(o.lost_gpu_h for o in runs)
        keys = sorted(
            {k for o in runs for k, _ in o.lost_by_stop},
            key=lambda k: (-sum(dict(o.lost_by_stop).get(k, 0.0) for o in runs), k),
        )
        lines.append(
            f"family: {policy}'s lost work by stop over {len(runs)} runs ({total:,.0f} GPU-h,"
            f" {100 * total / total_capacity:.2f} points of the GPU time): reason/victim/class/"
            f"how it resumes, GPU-h, % of the loss, points (min / median / max over the runs)"
        )
        for k in keys[:STOP_ROWS]:
            hours = [dict(o.lost_by_stop).get(k, 0.0) for o in runs]
            pts = [100 * h / capacity[id(o)] for h, o in zip(hours, runs, strict=True)]
            lines.append(
                f"  {k:<44} {sum(hours):>9,.0f} {100 * sum(hours) / total:>5.1f}%"
                f" {100 * sum(hours) / total_capacity:>6.2f} ({three(pts, points)})"
            )
        rest = sum(dict(o.lost_by_stop).get(k, 0.0) for o in runs for k in keys[STOP_ROWS:])
        if rest:
            lines.append(f"  {'the rest':<44} {rest:>9,.0f} {100 * rest / total:>5.1f}%")
    return lines


def three(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """min / median / max."""
    ordered = sorted(values)
    return " / ".join(fmt(v) for v in (ordered[0], statistics.median(ordered), ordered[-1]))


def lost_summary(outcomes: Sequence[Outcome]) -> list[str]:
    """The spread of lost work and goodput across the family's workloads (every run of a
    cell and seed): min / median / max for budget and legacy, and of the gap between
    them run by run."""
    budget = [o for o in outcomes if o.job.policy == "budget"]
    legacy = [o for o in outcomes if o.job.policy == "legacy"]
    lines = []
    for policy, runs in (("budget", budget), ("legacy", legacy)):
        if not runs:
            continue
        lines.append(
            f"family: {policy} across {len(runs)} workloads (min / median / max): occupancy"
            f" {three([o.occupancy for o in runs], percent)}; lost to preemption"
            f" {three([o.lost_share for o in runs], percent)} of the GPU time"
            f" ({three([o.lost_gpu_h for o in runs], lambda h: f'{h:,.0f}')} GPU-h);"
            f" goodput {three([o.goodput for o in runs], percent)}"
        )
    gap = gaps(budget, legacy)
    if gap:
        lines.append(
            f"family: goodput, budget less legacy on the same workload (min / median / max):"
            f" {three(gap, points)} points; budget higher on {sum(g > 0 for g in gap)},"
            f" lower on {sum(g < 0 for g in gap)} of {len(gap)}"
        )
    return lines


def kind_lines(cells: Sequence[Cell], outcomes: Sequence[Outcome]) -> list[str]:
    """Per kind of cell, over its cells and seeds (min / median / max): budget's goodput
    and legacy's, budget's worst team daily, occupancy and debug p90, the up share, and
    the cells within every bar (lost work and goodput against legacy included)."""
    lines = []
    for kind in KIND_NAMES:
        mine = [c for c in cells if c.kind == kind]
        budget = [o for o in outcomes if o.job.cell in mine and o.job.policy == "budget"]
        legacy = [o for o in outcomes if o.job.cell in mine and o.job.policy == "legacy"]
        if not budget or not legacy:
            continue
        held = sum(
            1
            for cell in mine
            if cell_held(
                [o for o in budget if o.job.cell == cell],
                [o for o in legacy if o.job.cell == cell],
            )
        )
        what = KINDS[kind][0] if kind in KINDS else "every kind above at once"
        lines.append(
            f"family: {kind} ({what}), {len(budget)} runs, min / median / max: goodput"
            f" {three([o.goodput for o in budget], percent)} (legacy"
            f" {three([o.goodput for o in legacy], percent)}); worst team daily"
            f" {three([o.worst_daily for o in budget], percent)}; occupancy"
            f" {three([o.occupancy for o in budget], percent)}; debug p90"
            f" {three([o.debug_p90_s for o in budget], fmt_wait)}; up"
            f" {three([o.up_share for o in budget], percent)}; every bar, lost work and"
            f" goodput included, on {held} of {len(mine)} cells"
        )
    return lines


def cell_held(budget: Sequence[Outcome], legacy: Sequence[Outcome]) -> bool:
    """Every bar of a cell, issue 49's lost work and goodput against legacy included."""
    return verdict(budget, legacy).all and lost_mark(budget, legacy) == mark(True)


def baseline_lines(cells: Sequence[Cell], outcomes: Sequence[Outcome]) -> list[str]:
    lines = []
    for policy in BASELINES:
        for cell in cells:
            runs = [o for o in outcomes if o.job.cell == cell and o.job.policy == policy]
            if not runs:
                continue
            lines.append(
                f"family: {policy} on {cell.label()}: debug p90"
                f" {spread([o.debug_p90_s for o in runs], fmt_wait)}, all p50"
                f" {spread([o.all_p50_s for o in runs], fmt_wait)}, occupancy"
                f" {spread([o.occupancy for o in runs], percent)}, goodput"
                f" {spread([o.goodput for o in runs], percent)}, worst team daily"
                f" {spread([o.worst_daily for o in runs], percent)}"
            )
    return lines


def paired_lines(
    cells: Sequence[Cell],
    base: Sequence[Outcome],
    variant: Sequence[Outcome],
    legacy: Sequence[Outcome],
    label: str,
) -> list[str]:
    """``variant`` against ``base``, run by run on the same scenarios (cell and seed): the
    mean change of the worst team's daily fulfilment with its spread and the count of
    runs each way, runs and cells within the bars, occupancy, and the price in lost work.
    A one-sided figure (the best run, or the mean alone) would hide a rule that helps
    one workload and hurts the next."""

    def by_run(outcomes: Sequence[Outcome]) -> dict[tuple[Cell, int], Outcome]:
        return {(o.job.cell, o.job.seed): o for o in outcomes}

    before, after, old = by_run(base), by_run(variant), by_run(legacy)
    runs = sorted(set(before) & set(after), key=lambda k: (k[0].gpus, k[0].load, k[0].share, k[1]))
    if not runs:
        return [f"family: {label}: no run to pair"]
    deltas = [100 * (after[k].worst_daily - before[k].worst_daily) for k in runs]
    occupancy = [100 * (after[k].occupancy - before[k].occupancy) for k in runs]
    goodput = [100 * (after[k].goodput - before[k].goodput) for k in runs]

    def cells_within(outcomes: dict[tuple[Cell, int], Outcome]) -> int:
        held = 0
        for cell in cells:
            keys = [k for k in runs if k[0] == cell]
            if (
                keys
                and verdict([outcomes[k] for k in keys], [old[k] for k in keys if k in old]).all
            ):
                held += 1
        return held

    def slow(outcomes: dict[tuple[Cell, int], Outcome]) -> int:
        return sum(1 for k in runs if outcomes[k].debug_p90_s > DEBUG_P90_BAR_S)

    n = len(runs)
    return [
        f"family: {label}, paired on {n} runs (the same scenarios):",
        f"  worst team daily: mean {sum(deltas) / n:+.2f} points (run by run"
        f" {min(deltas):+.1f}..{max(deltas):+.1f}; {sum(d > 0 for d in deltas)} better,"
        f" {sum(d < 0 for d in deltas)} worse)",
        f"  runs within the budget bars (debug, occupancy, teams):"
        f" {sum(all(budget_bars([before[k]])) for k in runs)} ->"
        f" {sum(all(budget_bars([after[k]])) for k in runs)} of {n}",
        f"  cells within every bar: {cells_within(before)} -> {cells_within(after)} of"
        f" {len({k[0] for k in runs})}",
        f"  occupancy: mean {sum(occupancy) / n:+.2f} points; runs with debug p90 over"
        f" {DEBUG_P90_BAR_S / 60:.0f} min: {slow(before)} -> {slow(after)}",
        f"  lost work: {sum(before[k].lost_gpu_h for k in runs):,.0f} ->"
        f" {sum(after[k].lost_gpu_h for k in runs):,.0f} GPU-h; preemptions"
        f" {sum(before[k].preemptions for k in runs):,} ->"
        f" {sum(after[k].preemptions for k in runs):,}; goodput: mean"
        f" {sum(goodput) / n:+.2f} points",
    ]


# --- saved runs ----------------------------------------------------------------

SAVED_FORMAT = 1


def outcome_record(outcome: Outcome) -> dict[str, Any]:
    record = asdict(outcome)
    record["job"]["settings"] = [list(item) for item in outcome.job.settings]
    return record


def outcome_from(record: dict[str, Any]) -> Outcome:
    job = dict(record["job"])
    job["cell"] = Cell(**job["cell"])
    job["settings"] = tuple((str(k), v) for k, v in job["settings"])
    if "lost_by_class" in record:
        record = {**record, "lost_by_class": tuple(record["lost_by_class"])}
    if "lost_by_stop" in record:
        stops = tuple((str(k), float(v)) for k, v in record["lost_by_stop"])
        record = {**record, "lost_by_stop": stops}
    return Outcome(**{**record, "job": Job(**job)})


def save(path: Path, outcomes: Sequence[Outcome], variants: Sequence[Outcome]) -> None:
    """Every run's figures: ``runs`` (budget, legacy and any baselines) and ``against``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "format": SAVED_FORMAT,
        "runs": [outcome_record(o) for o in outcomes],
        "against": [outcome_record(o) for o in variants],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")


def load_budget(path: Path) -> list[Outcome]:
    """The budget runs (not ``against``) that ``save`` wrote to ``path``; ValueError says
    what is wrong with the file."""
    return [o for o in load_runs(path) if o.job.policy == "budget"]


def load_runs(path: Path) -> list[Outcome]:
    """Every run (not ``against``) that ``save`` wrote to ``path``, each policy's;
    ValueError says what is wrong with the file."""
    try:
        document = json.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"{path}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(document, dict) or document.get("format") != SAVED_FORMAT:
        raise ValueError(f"{path}: not a file that --save wrote (format {SAVED_FORMAT})")
    try:
        runs = [outcome_from(record) for record in document["runs"]]
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path}: runs: a run is malformed ({error})") from None
    return runs


def same_scenarios(saved: Sequence[Outcome], days: int, small_teams: int) -> list[Outcome]:
    """The saved runs whose scenarios this invocation generates too (days, small teams)."""
    return [o for o in saved if o.job.days == days and o.job.small_teams == small_teams]


# --- the plot ------------------------------------------------------------------


def plot(path: Path, cells: Sequence[Cell], outcomes: Sequence[Outcome], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = sorted({c.share for c in cells})
    sizes = sorted({c.gpus for c in cells})
    loads = sorted({c.load for c in cells})
    panels: list[tuple[str, Callable[[Outcome], float], float, bool]] = [
        ("debug p90 wait (min)", lambda o: o.debug_p90_s / 60, DEBUG_P90_BAR_S / 60, True),
        ("occupancy (%)", lambda o: 100 * o.occupancy, 100 * OCCUPANCY_BAR, True),
        ("worst team, daily fulfilment (%)", lambda o: 100 * o.worst_daily, 100 * DAILY_BAR, False),
        ("goodput: occupancy less lost work (%)", lambda o: 100 * o.goodput, math.nan, True),
    ]
    figure, axes = plt.subplots(
        len(shares), len(panels), figsize=(20, 4.2 * len(shares)), squeeze=False
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, share in enumerate(shares):
        for col, (name, value, bar, with_legacy) in enumerate(panels):
            ax = axes[row][col]
            for k, gpus in enumerate(sizes):
                policies = ("budget", "legacy") if with_legacy else ("budget",)
                for policy in policies:
                    xs, ys, low, high = [], [], [], []
                    for load in loads:
                        runs = [
                            value(o)
                            for o in outcomes
                            if o.job.cell == Cell(gpus, load, share) and o.job.policy == policy
                        ]
                        if not runs:
                            continue
                        middle = sum(runs) / len(runs)
                        xs.append(load)
                        ys.append(middle)
                        low.append(middle - min(runs))
                        high.append(max(runs) - middle)
                    if xs:
                        ax.errorbar(
                            xs,
                            ys,
                            yerr=[low, high],
                            marker="o",
                            capsize=3,
                            color=colors[k % len(colors)],
                            linestyle="-" if policy == "budget" else "--",
                            label=f"{policy}, {gpus} GPUs",
                        )
            if not math.isnan(bar):
                ax.axhline(bar, color="grey", linestyle=":", linewidth=1)
            if col == 0:
                ax.set_yscale("symlog", linthresh=1.0)
                ax.set_ylim(bottom=0)
            ax.set_title(f"{name}, notebooks {share:.0%}")
            ax.set_xlabel("arrival load (x capacity)")
            ax.set_xticks(loads)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


# --- the command ---------------------------------------------------------------


def numbers(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None
        if not values:
            raise argparse.ArgumentTypeError("names nothing")
        return values

    return parse


def kinds(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in KIND_NAMES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: not a kind of cell (one of"
            f" {', '.join(KIND_NAMES)})"
        )
    return chosen


def grid(args: argparse.Namespace) -> list[Cell]:
    """The cells: base over --gpus x --loads x --shares, each other kind over --kind-gpus
    x --kind-loads x --kind-shares. Without --kinds, every kind; but a command that
    narrows the base grid (as every one did before the kinds) runs base alone, so an
    older command line still runs the cells it ran."""
    narrowed = any(v is not None for v in (args.gpus, args.loads, args.shares))
    if args.kinds is None:
        args.kinds = ["base"] if narrowed else list(KIND_NAMES)
    args.gpus = args.gpus or list(GPUS)
    args.loads = args.loads or list(LOADS)
    args.shares = args.shares or list(SHARES)
    cells = []
    for kind in args.kinds:
        if kind == "base":
            sizes, loads, shares = args.gpus, args.loads, args.shares
        else:
            sizes, loads, shares = args.kind_gpus, args.kind_loads, args.kind_shares
        cells += [Cell(g, lo, sh, kind) for g, lo, sh in itertools.product(sizes, loads, shares)]
    return cells


def _number_or_text(value: str) -> float | str:
    """A ``--set`` value: a number where it reads as one (weights, counts, seconds)."""
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() else number


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(
        prog="python -m bench.family",
        description="budget and legacy over a grid of seed-like workloads, against the bars",
    )
    out.add_argument("--gpus", type=numbers(int), help=f"{','.join(map(str, GPUS))}")
    out.add_argument("--loads", type=numbers(float), help=f"{','.join(map(str, LOADS))}")
    out.add_argument(
        "--shares", type=numbers(float), help=f"notebook shares ({','.join(map(str, SHARES))})"
    )
    out.add_argument(
        "--kinds",
        type=kinds,
        help="kinds of cell (" + ",".join(KIND_NAMES) + "): base over --gpus x --loads x"
        " --shares, the others over --kind-gpus x --kind-loads x --kind-shares (default: all;"
        " base alone where --gpus, --loads or --shares is given, as before the kinds)",
    )
    out.add_argument(
        "--kind-gpus", type=numbers(int), default=[88, 128], help="the other kinds' sizes (88,128)"
    )
    out.add_argument(
        "--kind-loads", type=numbers(float), default=[1.0], help="the other kinds' loads (1.0)"
    )
    out.add_argument(
        "--kind-shares",
        type=numbers(float),
        default=[0.35],
        help="the other kinds' notebook shares (0.35)",
    )
    out.add_argument("--seeds", type=numbers(int), default=[1, 2], help="generator seeds (1,2)")
    out.add_argument("--days", type=int, default=7, help="simulated days per scenario (7)")
    out.add_argument("--small-teams", type=int, default=0, help="generator --small-teams (0)")
    out.add_argument("--baselines", action="store_true", help="also run " + ", ".join(BASELINES))
    out.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a budget policy setting, as in a scenario (own_slice_after=2h; repeatable)",
    )
    out.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="also run budget with this setting laid over --set, on the same scenarios, and"
        " print the change run by run (repeatable: all are laid together)",
    )
    out.add_argument(
        "--save", type=Path, metavar="PATH", help="write every run's figures here as JSON"
    )
    out.add_argument(
        "--paired-with",
        type=Path,
        metavar="PATH",
        help="print this run's budget against the budget runs that --save wrote to PATH"
        " (another tree's rules), run by run on the same scenarios",
    )
    out.add_argument(
        "--show",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="only print the tables of the runs that --save wrote to PATH (repeatable: a grid"
        " run in parts), simulating nothing",
    )
    out.add_argument(
        "--lost-by-stop",
        action="store_true",
        help="also print each policy's lost work split by the stop that threw it away (its"
        " reason, the victim funded or borrowed, its class, how it resumes)",
    )
    out.add_argument("--jobs", type=int, default=1, help="runs at once, one process each (1)")
    out.add_argument(
        "--plot", type=Path, default=DEFAULT_PLOT, help=f"PNG to write ({DEFAULT_PLOT})"
    )
    out.add_argument("--no-plot", action="store_true", help="write no plot")
    return out


def _settings(option: str, items: Sequence[str]) -> list[tuple[str, float | str]]:
    """``NAME=VALUE`` items as settings, each checked as a scenario's would be."""
    out: list[tuple[str, float | str]] = []
    for item in items:
        name, equals, value = item.partition("=")
        if not equals or not name:
            parser().error(f"{option}: {item!r} is not NAME=VALUE")
        try:
            settings_from_mapping({name: _number_or_text(value)})
        except SettingError as error:
            parser().error(f"{option}: {error}")
        out.append((name, _number_or_text(value)))
    return out


def figures(budget: Sequence[Outcome], legacy: Sequence[Outcome]) -> dict[str, float]:
    """The worst budget run's figure per bar (FIGURES); the legacy ratio is taken run by
    run on the same scenario (cell and seed): inf where budget's debug p90 is 0 s, so
    both at 0 s holds, as in ``verdict``."""
    theirs = {(o.job.cell, o.job.seed): o.debug_p90_s for o in legacy}
    ratios = []
    for ours in budget:
        other = theirs.get((ours.job.cell, ours.job.seed))
        if other is None:
            continue
        ratios.append(other / ours.debug_p90_s if ours.debug_p90_s else math.inf)

    def worst(values: Sequence[float], pick: Callable[[Sequence[float]], float]) -> float:
        """NaN (judged outside) where there is none or one is NaN."""
        return math.nan if not values or any(map(math.isnan, values)) else pick(values)

    others = {(o.job.cell, o.job.seed): o for o in legacy}
    pairs = [
        (o, others[o.job.cell, o.job.seed]) for o in budget if (o.job.cell, o.job.seed) in others
    ]
    return {
        "family.debug_p90_s": worst([o.debug_p90_s for o in budget], max),
        "family.occupancy": worst([o.occupancy for o in budget], min),
        "family.worst_team_daily": worst([o.worst_daily for o in budget], min),
        "family.legacy_debug_ratio": worst(ratios, min),
        "family.lost_over_legacy_points": worst(
            [100 * (ours.lost_share - theirs.lost_share) for ours, theirs in pairs], max
        ),
        "family.goodput_under_legacy_points": worst(
            [100 * (theirs.goodput - ours.goodput) for ours, theirs in pairs], max
        ),
    }


def main(argv: list[str] | None = None) -> int:
    collect(argv)
    return 0


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Run the grid as ``main`` does, printing the same; the figures (FIGURES)."""
    args = parser().parse_args(argv)
    if args.show:
        return show(args.show, args.lost_by_stop)
    if args.days < 1:
        parser().error(f"--days: {args.days} is not a number of days >= 1")
    if args.jobs < 1:
        parser().error(f"--jobs: {args.jobs} is not >= 1")
    cells = grid(args)
    for flag, sizes in (("--gpus", args.gpus), ("--kind-gpus", args.kind_gpus)):
        for gpus in sizes:
            if gpus <= 0 or gpus % 8:
                parser().error(f"{flag}: {gpus} is not a positive multiple of 8")
    settings = _settings("--set", args.set)
    against = _settings("--against", args.against)
    saved: list[Outcome] = []
    if args.paired_with is not None:
        try:
            saved = same_scenarios(load_budget(args.paired_with), args.days, args.small_teams)
        except ValueError as error:
            parser().error(f"--paired-with: {error}")
    policies = ("budget", "legacy", *(BASELINES if args.baselines else ()))
    jobs = [
        Job(cell, seed, policy, args.days, args.small_teams, tuple(settings))
        for cell, seed, policy in itertools.product(cells, args.seeds, policies)
    ]
    variant = tuple(settings) + tuple(against)
    if against:
        jobs += [
            Job(cell, seed, "budget", args.days, args.small_teams, variant)
            for cell, seed in itertools.product(cells, args.seeds)
        ]
    for job in jobs:
        try:  # a bad --small-teams or a kind the days cannot hold fails here, before any run
            validate(options(job))
        except InputError as error:
            parser().error(f"{job.cell.label()}: {error}")
    started = time.perf_counter()
    outcomes = list(execute(jobs, args.jobs))
    wall = time.perf_counter() - started
    runs = len(jobs)
    variants = [o for o in outcomes if against and o.job.settings == variant]
    outcomes = [o for o in outcomes if not (against and o.job.settings == variant)]
    print(
        f"family: {len(cells)} cells x {len(args.seeds)} seeds x"
        f" {len(policies) + (1 if against else 0)} policies ="
        f" {runs} runs of {args.days} simulated days in {wall:.0f} s"
        f" ({args.jobs} at a time; simulation alone {sum(o.wall_s for o in outcomes):.0f} s)"
    )
    print_grid(cells, outcomes)
    if args.lost_by_stop:
        for line in stop_lines(outcomes):
            print(line)
    budget = [o for o in outcomes if o.job.policy == "budget"]
    legacy = [o for o in outcomes if o.job.policy == "legacy"]
    if against:
        label = "budget with " + ", ".join(f"{k}={v}" for k, v in against)
        for line in paired_lines(cells, budget, variants, legacy, label):
            print(line)
    if args.paired_with is not None:
        label = f"budget against the runs saved in {args.paired_with}"
        for line in paired_lines(cells, saved, budget, legacy, label):
            print(line)
    if args.save is not None:
        save(args.save, outcomes, variants)
        print(f"family: runs written to {args.save}")
    if not args.no_plot:
        title = f"bench.family: seed-like, {args.days} days, seeds {','.join(map(str, args.seeds))}"
        if settings:
            title += ", " + ", ".join(f"{k}={v}" for k, v in settings)
        plot(args.plot, cells, outcomes, title)
        print(f"family: plot written to {args.plot}")
    return figures(budget, legacy)


def print_grid(cells: Sequence[Cell], outcomes: Sequence[Outcome]) -> None:
    """The bars' table and verdict, the lost work's table and spread, the baselines."""
    for line in table(cells, outcomes):
        print(line)
    print(
        f"family: every bar holds on {cells_held(cells, outcomes)} of {len(cells)} cells"
        f" (bars: debug p90 <= {DEBUG_P90_BAR_S:.0f} s, occupancy >= {OCCUPANCY_BAR:.0%},"
        f" every team daily >= {DAILY_BAR:.0%}, legacy debug p90 >= 5x budget's; lost work"
        f" and goodput against legacy in the lost table; a bar holds where it holds on"
        f" every seed)"
    )
    for line in [*lost_table(cells, outcomes), *lost_summary(outcomes)]:
        print(line)
    for line in kind_lines(cells, outcomes):
        print(line)
    for line in baseline_lines(cells, outcomes):
        print(line)


def show(paths: Sequence[Path], by_stop: bool = False) -> dict[str, float]:
    """Print the tables of runs that ``--save`` wrote (a grid run in parts, one invocation
    per size, say), simulating nothing; the figures (FIGURES) as ``collect`` gives them.
    A run saved twice (the same cell, seed, policy, days and settings) is taken once."""
    found: dict[Job, Outcome] = {}
    for path in paths:
        try:
            for outcome in load_runs(path):
                found.setdefault(outcome.job, outcome)
        except ValueError as error:
            parser().error(f"--show: {error}")
    outcomes = list(found.values())
    cells = sorted(
        {o.job.cell for o in outcomes},
        key=lambda c: (KIND_NAMES.index(c.kind), c.gpus, c.load, c.share),
    )
    seeds = sorted({o.job.seed for o in outcomes})
    print(
        f"family: {len(outcomes)} saved runs of {len(cells)} cells, seeds"
        f" {','.join(map(str, seeds))}, from {', '.join(map(str, paths))}"
    )
    print_grid(cells, outcomes)
    if by_stop:
        for line in stop_lines(outcomes):
            print(line)
    budget = [o for o in outcomes if o.job.policy == "budget"]
    return figures(budget, [o for o in outcomes if o.job.policy == "legacy"])


def cells_held(cells: Sequence[Cell], outcomes: Sequence[Outcome]) -> int:
    """The cells where every bar holds on every seed."""
    return sum(
        1
        for cell in cells
        if verdict(
            [o for o in outcomes if o.job.cell == cell and o.job.policy == "budget"],
            [o for o in outcomes if o.job.cell == cell and o.job.policy == "legacy"],
        ).all
    )


def execute(jobs: Sequence[Job], workers: int) -> list[Outcome]:
    """Every job's outcome, in the jobs' order; progress goes to stderr as runs end."""

    def report(outcome: Outcome) -> None:
        job = outcome.job
        print(
            f"family: {job.cell.label()}, seed {job.seed}, {job.policy}:"
            f" {outcome.requests} requests simulated in {outcome.wall_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    if workers == 1:
        outcomes = []
        for job in jobs:
            outcomes.append(run(job))
            report(outcomes[-1])
        return outcomes
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        # The largest clusters first, so that the last runs to end are short ones.
        order = sorted(range(len(jobs)), key=lambda k: -jobs[k].cell.gpus * jobs[k].cell.load)
        futures = {pool.submit(run, jobs[k]): k for k in order}
        found: dict[int, Outcome] = {}
        for future in concurrent.futures.as_completed(futures):
            found[futures[future]] = future.result()
            report(found[futures[future]])
    return [found[k] for k in range(len(jobs))]


if __name__ == "__main__":
    sys.exit(main())
