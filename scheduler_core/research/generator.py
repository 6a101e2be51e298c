"""Seed-like scenarios: a month of work on a shared H100 cluster, as scenario JSON.

The cluster imitates the one in the seed (Ai2's write-up): 88-1024 H100 GPUs,
about 150 researchers in 15 team allocations, demand 2-3x capacity, debug work
that is small and short, notebooks in working hours, and a CPU pool next to
storage for data preparation. `seed_like(options)` is a pure function of its
options (all randomness comes from ``random.Random(options.seed)``), so the same
options give the same scenario and `dumps` gives byte-identical text.

What it builds
--------------
* Pool ``h100``: ``gpus / 8`` nodes of 8 H100 GPUs (96 CPUs, 1024 GiB). All but
  ``mig_nodes`` of them come from one ``count`` template ``h100-{i:03d}``; the
  MIG nodes (``h100-mig-00`` ...) split each of their 8 GPUs into 7 // g
  instances of ``mig_profile`` (7 x ``1g.10gb`` by default), so they still add
  8 GPU-equivalents each.
* Pool ``b200`` (with ``b200_gpus``): ``b200_gpus / 8`` nodes ``b200-{i:03d}`` of 8
  B200 GPUs (112 CPUs, 2048 GiB). Each team has a share of it drawn as for h100.
  Capacity C is then both pools' GPUs; every GPU request draws its pool by the
  pools' GPUs (a MIG debug session stays in h100), and a batch job's team is drawn
  by share x demand in that pool.
* Pool ``cpu``: ``cpu_nodes`` data-prep nodes (64 CPUs, 512 GiB) labelled
  ``{"storage": s}``, with ``s`` cycling through ``storages``.
* Teams: ``teams`` allocations that users charge to. With ``program`` on (and at
  least 2 teams) the last two become sub-teams of an extra parent team
  ``prior``, each with a float share of it, as in the example of docs/architecture.md. Top-level
  shares of each pool are drawn from a symmetric Dirichlet law of concentration
  ``share_alpha``, rounded to 4 decimals (at least 0.001 each) and summing to at
  most 1.0 exactly as JSON floats add up. With ``small_teams`` N, the N
  top-level teams (outside the program) with the smallest drawn ``h100`` shares
  get ``small_team_gpus`` GPUs of share each (2.5: less than any batch job, which
  takes whole 8-GPU nodes), and the others split the rest in proportion to their
  drawn shares. With ``orgs`` N, the top level is N organisations ``org-1`` ...
  with drawn shares of every pool; the teams are dealt to them in turn (team k to
  organisation k mod N) and each holds a float share of its organisation drawn
  from the same Dirichlet law (``program`` then makes no pair; ``small_teams``
  must be 0). ``users`` users ``u001`` ... are spread over the teams (one each,
  the rest in proportion to the team's ``h100`` share), each user in one team;
  with ``scale_users`` there are ``users x gpus / 1024`` of them (at least one
  per team), so an 88-GPU cluster gets 15, not 150.
* Demand: every team draws a factor log-uniformly in
  ``[demand_min, demand_max]`` (0.4-3.0). It is relative: a team's batch work
  (backlog and arrivals) is proportional to ``share x factor``, so a team with
  factor 3 asks, per unit of share, 7.5x as much as one with factor 0.4.
  `load_report` prints each team's offered work over its share of capacity.

Requests (scenario fields only; ids ``r000001`` ... in submit order)
--------------------------------------------------------------
=========== ============================================================================
class       shape
=========== ============================================================================
batch       pool h100, ``gpus`` 8 per node on 1, 2, 4 or 8 nodes (8-64 GPUs, weights
            .4/.3/.2/.1; at most a quarter of the whole nodes, so 64 GPUs from 256 on),
            88 CPUs and 960 GiB per node, duration log-uniform 30 min-36 h,
            min_runtime 1, 2, 4 or 8 h (at most the duration), priority 0-3; a share
            ``checkpointing`` resumable from a checkpoint every 15-60 min with a
            ``restart_cost`` of 1-5 min (drawn from their own generator), the rest not
interactive pool h100, 1, 2, 4 or 8 GPUs on 1 node, duration 1-6 h, min_runtime 1-4 h (at
            most the duration), resumable (snapshotted) with ``restorable``;
            submitted Mon-Fri 9:00-18:00 local time
debug       pool h100, 1 or 2 GPUs, a ``gpu_fraction`` of 0.25 or 0.5, or one ``mig``
            instance; duration 5-40 min, min_runtime 5, 10 or 15 min (at most the
            duration); a share ``off_hours`` of them outside working hours
dataprep    pool cpu, ``gpus`` 0, 4-32 CPUs with 4 GiB each (16-128 GiB), a ``storage``
            label of some cpu node, duration 1-8 h, min_runtime 1 h; ``off_hours`` as debug
=========== ============================================================================

Deadline burst and node failures
--------------------------------
* ``burst`` F: one team, drawn by its share of the GPUs x its demand factor, gets a
  window of ``burst_days`` (starting on a whole hour, after the first day where the
  horizon allows) in which its batch work submitted is F x what it is there without
  the burst: extra batch jobs of that team, submitted uniformly in the window, until
  their work reaches (F - 1) x the team's own (the last overshoots by one job).
  ``burst_of(options)`` says which team and window; the scenario's ``description``
  says it too.
* ``failure_rate`` R: every GPU node fails R times a day on average (exponential
  gaps from its last repair). A quarter of the failures are announced maintenance:
  the node drains for 2 h first (``draining``: nothing new lands there, sessions go
  once protected), then is ``down`` (its sessions end at once); the node is
  ``ready`` again after ``repair_hours`` x a uniform 0.5-1.5. The scenario's
  ``events`` carry these changes; ``down_gpu_seconds`` sums the GPU time of nodes
  down per pool and day.
* Both are drawn last from generators of their own (as the checkpoint prices are),
  so the requests without them are the same; at their defaults nothing changes.

Time 0 is a Monday, 00:00 UTC; working hours are Monday-Friday 9:00-18:00 at UTC
``+ tz_offset`` hours. Counts of interactive, debug and dataprep requests are
``rate x W x gpus / 1024`` where W, the weekday-equivalents, is the working time
inside the horizon over 9 h (21.8 for 30 days at -8 h: the horizon ends on a
Friday at 16:00 local time). With ``debug_rate`` the debug count is
``debug_rate x users x W`` instead. With ``interactive_share`` S, notebooks are
drawn until their work reaches S x the h100 work arriving after the backlog
(below). They still come only in working hours, so S = 0.35 at ``load`` 1 asks,
on weekday afternoons, for 1.3-1.6x the pool in notebooks alone (one-week
scenarios of 256 and 1,024 GPUs, seed 2, each notebook counted from its submit).

Load arithmetic (pool h100)
---------------------------
* Capacity ``C = gpus`` GPU-equivalents, horizon ``H = days x 86400`` s; offered
  work is GPU-equivalents x duration summed over the h100 requests.
* Backlog: batch requests submitted in [0, 1 h) until their GPUs reach
  ``backlog x C``: at the start, running plus pending demand is 2.5x capacity.
  Its work is B (about 0.03 x C x H for a default month, 0.12 for a week; more
  with a ``load`` below 0.98, see below).
* Target offered work ``O = offered x C x H``, or with ``load`` given (the
  arrival rate on top of the backlog) ``O = B + load x C x H``. A backlog
  stands only while arrivals keep up with a busy pool, so with ``load`` below
  0.98 the backlog gets, beyond its ``backlog x C`` GPUs, batch work of
  ``(0.98 - load) x C x H`` more (at 0.8 for a week: 5.7x capacity in GPUs
  in the first hour, not 2.5x): in a FIFO replay the queue still stands at
  2.3-3.7x capacity at the end of the week (seed 1, 256 and 1,024 GPUs).
* Interactive and debug work, I and D, follow from their counts (or I from
  ``interactive_share``: ``S x (O - B)``; the backlog is then drawn before the
  sessions rather than after, so the same seed draws other requests).
* Batch arrivals over [1 h, H) are drawn until their work reaches
  ``O - B - I - D`` (the last one overshoots by at most 64 GPUs x 36 h, 0.3 % of
  a default month). They are paced by work, not drawn independently: each comes
  when the share of arrival work before it has arrived at an even pace (35 % of
  it in working hours), give or take 6 h. Independent times would let the queue
  drift by days of cluster work within a month.
* Why ``offered`` defaults to 1.01, at the low end of the band 1.0-1.3: a
  backlog stands only while arrivals match what a busy cluster delivers. 1.01 =
  B (0.03) plus arrivals at 0.98 x C, the seed's 98 % occupancy. Larger loads
  make a queue that grows all month (at 1.1 outstanding demand reaches about
  10x capacity by day 30; the figures below show how to check). ``--load L``
  states the arrivals directly (0.98 for the default month). Until ``load``
  came to mean the arrivals, ``--load`` was what ``--offered`` is now: an older
  command line gives the same bytes with ``--offered`` in place of ``--load``.
* Defaults (1024 GPUs, 30 days, seed 0): C x H = 737,280 GPU-h; offered 745,062
  GPU-h = 1.011 x capacity (batch 703,940 including the backlog's 21,935,
  interactive 39,240, debug 1,881); GPUs submitted in the first hour 2.55 x C;
  14,802 requests (batch 4,131, debug 5,662, interactive 3,702, dataprep 1,307);
  pool cpu offered 0.48 x its capacity. An optimistic FIFO replay of pool h100
  (`outstanding_estimate`: no nodes, no fragmentation; it keeps 98 % of the pool
  busy) puts outstanding demand, the GPUs of running plus pending requests, at
  1.7-3.6x capacity at the end of each day, median 2.7x. ``--stats`` prints
  these figures for any knobs.

Knobs (`SeedLikeOptions`; CLI flags are the names with dashes)
--------------------------------------------------------------
=================== ============= ==============================================================
knob                default       meaning
=================== ============= ==============================================================
gpus                1024          H100 GPUs in pool h100 (a positive multiple of 8)
days                30            horizon in days
teams               15            team allocations that users charge to (>= 1)
users               150           researchers, each in one team (>= teams)
scale_users         False         users x gpus / 1024 of them instead (at least one per team)
seed                0             seed of random.Random; same options, same scenario
name                None          scenario name (default ``seed-like-<gpus>g-<days>d-s<seed>``)
b200_gpus           0             B200 GPUs in a second GPU pool b200 (0: pool h100 alone)
mig_nodes           1             h100 nodes whose 8 GPUs are MIG-partitioned (< gpus / 8)
mig_profile         1g.10gb       MIG instance profile; each GPU holds 7 // g of them
cpu_nodes           4             data-prep nodes in pool cpu (0: no cpu pool, no dataprep)
storages            weka-a,weka-b storage labels the cpu nodes cycle through
program             True          two teams are sub-teams of a parent team ``prior``
orgs                0             every team a sub-team of one of this many organisations
share_alpha         1.5           Dirichlet concentration of shares (smaller: more unequal)
demand_min          0.4           lowest team demand factor (relative, per unit of share)
demand_max          3.0           highest team demand factor
small_teams         0             teams of the smallest drawn shares given small_team_gpus each
small_team_gpus     2.5           h100 share of each small team, in GPUs
load                None          h100 work after the backlog / (capacity x horizon), over offered
offered             1.01          all offered h100 GPU-seconds / (capacity x horizon)
backlog             2.5           GPUs of batch backlog submitted in the first hour / capacity
interactive_per_day 170           notebooks per weekday per 1024 GPUs
interactive_share   None          notebooks' share of the work after the backlog (over the rate)
idle_share          None          share of each notebook's run, at its end, spent idle
restorable          True          notebooks are restorable (snapshotted, as in the product)
checkpointing       0.8           share of batch jobs that checkpoint every 15-60 min (the rest
                                  never do; none: all batch is snapshotted, as before issue 49)
burst               None          one team's batch work in a window is this many times its own
burst_days          2.0           the burst's window, in days
failure_rate        0.0           GPU node failures per node per day (down, then ready again)
repair_hours        8.0           mean hours a failed node is down (x 0.5-1.5, uniform)
debug_per_day       260           debug sessions per weekday per 1024 GPUs
debug_rate          None          debug sessions per user per weekday (overrides debug_per_day)
dataprep_per_day    60            data-prep sessions per weekday per 1024 GPUs
off_hours           0.15          share of debug and dataprep sessions outside working hours
tz_offset           -8.0          hours from UTC of the working day (Mon-Fri 9-18)
lookback            None          policy ``lookback``, seconds or e.g. 7d (omitted if not given)
max_min_runtime     None          policy ``max_min_runtime``, e.g. 8h (omitted if not given)
=================== ============= ==============================================================
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
import math
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from scheduler_core.errors import InputError
from scheduler_core.model import MIG_SLICES, mig_weight

DAY = 86400
HOUR = 3600
MINUTE = 60
GPUS_PER_NODE = 8
REFERENCE_GPUS = 1024
"""Cluster size at which the ``*_per_day`` rates apply; counts scale linearly with gpus."""
WORK_START = 9 * HOUR
WORK_END = 18 * HOUR
WORKDAY = WORK_END - WORK_START
BACKLOG_WINDOW = HOUR
"""The backlog arrives in [0, BACKLOG_WINDOW)."""
STANDING_BUSY = 0.98
"""With ``load`` below this, the backlog also holds the work those arrivals leave short of
keeping the pool this busy (the seed's occupancy) for the whole horizon."""

GPU_NODE_CPUS = 96
GPU_NODE_MEMORY_GIB = 1024
CPU_NODE_CPUS = 64
CPU_NODE_MEMORY_GIB = 512
CPUS_PER_GPU = 11
MEMORY_GIB_PER_GPU = 120

BATCH_NODES = ((1, 0.4), (2, 0.3), (4, 0.2), (8, 0.1))
BATCH_MAX_NODES_DIVISOR = 4
"""A batch request spans at most whole nodes / this many nodes."""
BATCH_MIN_DURATION = 30 * MINUTE
BATCH_MAX_DURATION = 36 * HOUR
BATCH_MIN_RUNTIMES = (1 * HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR)
BATCH_PRIORITIES = ((0, 0.55), (1, 0.25), (2, 0.15), (3, 0.05))
CHECKPOINT_EVERY = (15 * MINUTE, 60 * MINUTE)
"""A checkpointing batch job writes one every this many seconds (uniform, whole minutes)."""
RESTART_COST = (1 * MINUTE, 5 * MINUTE)
"""What it takes such a job to load its checkpoint and start again (uniform)."""
BATCH_IN_HOURS = 0.35
"""Share of batch arrival work submitted in working hours; the rest falls outside them."""
BATCH_JITTER = 6 * HOUR
"""How far, at the mean arrival rate, a batch arrival strays from its even-paced time."""
INTERACTIVE_GPUS = ((1, 0.35), (2, 0.25), (4, 0.25), (8, 0.15))
DEBUG_FRACTIONS = (0.25, 0.5)
DEBUG_MIN_RUNTIMES = (5 * MINUTE, 10 * MINUTE, 15 * MINUTE)
DATAPREP_CPUS = (4, 8, 16, 32)
DATAPREP_MEMORY_GIB_PER_CPU = 4

B200_NODE_CPUS = 112
B200_NODE_MEMORY_GIB = 2048
MAX_FAILURE_RATE = 1.0
"""At most one failure per node per day on average: beyond that a node is mostly down."""
MAINTENANCE_SHARE = 0.25
"""Share of node failures announced: the node drains for MAINTENANCE_LEAD first."""
MAINTENANCE_LEAD = 2 * HOUR
REPAIR_SPREAD = (0.5, 1.5)
"""A repair takes repair_hours times a uniform draw in this range."""

MIN_SHARE_UNITS = 10
"""Smallest top-level share, in 1/10000 of a pool (0.001)."""
SHARE_UNITS = 10_000
"""Shares are multiples of 1/SHARE_UNITS (4 decimals)."""
MAX_TEAMS = SHARE_UNITS // (2 * MIN_SHARE_UNITS)
"""At most this many teams, so that each gets at least the smallest share."""
PROGRAM_TEAM = "prior"
ORG_PREFIX = "org-"
"""Organisations (``orgs``) are parent teams ``org-1``, ``org-2`` ..."""
TEAM_NAMES = (
    "olmo",
    "molmo",
    "tulu",
    "robotics",
    "rl-sim",
    "agents",
    "science",
    "vision",
    "safety",
    "evals",
    "pretrain",
    "data",
    "multimodal",
    "reasoning",
    "code",
    "climate",
    "bio",
    "speech",
    "theory",
    "infra",
)


def _knob(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True)
class SeedLikeOptions:
    """The generator's knobs; see the module docstring's table."""

    gpus: int = _knob(1024, "H100 GPUs in pool h100 (a positive multiple of 8)")
    days: int = _knob(30, "horizon in days")
    teams: int = _knob(15, "team allocations that users charge to")
    users: int = _knob(150, "researchers, each in one team (at least --teams)")
    scale_users: bool = _knob(
        False, "scale --users with the cluster: users x gpus / 1024, at least one per team"
    )
    seed: int = _knob(0, "seed of the random generator; same options, byte-identical output")
    name: str | None = _knob(None, "scenario name (default seed-like-<gpus>g-<days>d-s<seed>)")
    b200_gpus: int = _knob(
        0, "B200 GPUs in a second GPU pool b200 (a multiple of 8; 0: pool h100 alone)"
    )
    mig_nodes: int = _knob(1, "h100 nodes whose 8 GPUs are MIG-partitioned (fewer than gpus/8)")
    mig_profile: str = _knob("1g.10gb", "MIG instance profile; each GPU holds 7 // g of them")
    cpu_nodes: int = _knob(4, "data-prep nodes in pool cpu (0: no cpu pool, no dataprep)")
    storages: tuple[str, ...] = _knob(
        ("weka-a", "weka-b"), "comma-separated storage labels the cpu nodes cycle through"
    )
    program: bool = _knob(True, "make two teams sub-teams of a parent team 'prior'")
    orgs: int = _knob(
        0,
        "organisations: every team a sub-team of one of this many parent teams, each with its"
        " own shares (0: none; with orgs, --program makes no pair)",
    )
    share_alpha: float = _knob(1.5, "Dirichlet concentration of team shares (smaller: unequal)")
    demand_min: float = _knob(0.4, "lowest team demand factor (relative, per unit of share)")
    demand_max: float = _knob(3.0, "highest team demand factor")
    small_teams: int = _knob(
        0, "the teams of the smallest drawn shares that get --small-team-gpus of share each"
    )
    small_team_gpus: float = _knob(2.5, "h100 share of each --small-teams team, in GPUs")
    load: float | None = _knob(
        None, "h100 work arriving after the backlog over capacity x horizon (overrides --offered)"
    )
    offered: float = _knob(
        1.01, "all offered h100 GPU-seconds, backlog included, over capacity x horizon"
    )
    backlog: float = _knob(2.5, "GPUs of batch backlog submitted in the first hour / capacity")
    interactive_per_day: float = _knob(170.0, "notebooks per weekday per 1024 GPUs")
    interactive_share: float | None = _knob(
        None, "notebooks' share of the h100 work after the backlog (overrides the per-day rate)"
    )
    idle_share: float | None = _knob(
        None, "share of each notebook's run, at its end, spent idle (field idle_after)"
    )
    restorable: bool = _knob(
        True, "notebooks are restorable: snapshotted at a preemption, they resume later"
    )
    checkpointing: float | None = _knob(
        0.8,
        "share of batch jobs that checkpoint every 15-60 min, the rest never do"
        " (none: every batch job is snapshotted, as before issue 49)",
    )
    burst: float | None = _knob(
        None,
        "deadline burst: one team's batch work submitted in a window of --burst-days is this"
        " many times what it would be (e.g. 3; not set: no burst)",
    )
    burst_days: float = _knob(2.0, "length of the --burst window in days")
    failure_rate: float = _knob(
        0.0, "GPU node failures per node per day (each node down, then ready after a repair)"
    )
    repair_hours: float = _knob(8.0, "mean hours a failed node stays down (uniform 0.5-1.5x)")
    debug_per_day: float = _knob(260.0, "debug sessions per weekday per 1024 GPUs")
    debug_rate: float | None = _knob(
        None, "debug sessions per user per weekday (overrides --debug-per-day)"
    )
    dataprep_per_day: float = _knob(60.0, "data-prep sessions per weekday per 1024 GPUs")
    off_hours: float = _knob(0.15, "share of debug and dataprep sessions outside working hours")
    tz_offset: float = _knob(-8.0, "hours from UTC of the working day (Mon-Fri 9-18)")
    lookback: float | None = _knob(
        None, "policy lookback, seconds or e.g. 7d (omitted when not given)"
    )
    max_min_runtime: float | None = _knob(
        None, "policy max_min_runtime, seconds or e.g. 8h (omitted when not given)"
    )


def _idle_after(duration: float, idle_share: float | None) -> dict[str, float]:
    """A notebook is busy first and then left open idle until it ends (no draw, so the
    rest of the scenario is the same with or without idleness)."""
    if idle_share is None:
        return {}
    return {"idle_after": round(duration * (1 - idle_share))}


def knob_flag(name: str) -> str:
    """The command-line flag of a knob: ``mig_nodes`` -> ``--mig-nodes``."""
    return "--" + name.replace("_", "-")


def knob_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(SeedLikeOptions))


def knob_help(name: str) -> str:
    for knob in fields(SeedLikeOptions):
        if knob.name == name:
            return str(knob.metadata["help"])
    raise KeyError(name)


def validate(options: SeedLikeOptions) -> None:
    """Raise InputError naming the flag of the first knob with a bad value."""
    _validate_cluster(options)
    _validate_teams(options)
    _validate_work(options)


def _bad(name: str, reason: str) -> InputError:
    return InputError(where=knob_flag(name), reason=reason)


def _validate_cluster(options: SeedLikeOptions) -> None:
    """The cluster's knobs: its size, horizon, MIG nodes and CPU pool."""
    if options.gpus <= 0 or options.gpus % GPUS_PER_NODE:
        raise _bad("gpus", f"{options.gpus} is not a positive multiple of {GPUS_PER_NODE}")
    if options.days <= 0:
        raise _bad("days", f"{options.days} is not a positive number of days")
    if not 1 <= options.teams <= MAX_TEAMS:
        raise _bad("teams", f"{options.teams} is not in 1..{MAX_TEAMS}")
    if options.users < options.teams:
        raise _bad("users", f"{options.users} users cannot fill {options.teams} teams")
    nodes = options.gpus // GPUS_PER_NODE
    if not 0 <= options.mig_nodes < nodes:
        raise _bad(
            "mig_nodes", f"{options.mig_nodes} is not in 0..{nodes - 1}; batch needs a whole node"
        )
    try:
        slices = round(mig_weight(options.mig_profile) * MIG_SLICES)
    except ValueError as error:
        raise _bad("mig_profile", str(error)) from None
    if slices > MIG_SLICES:  # pragma: no cover - mig_weight already refuses
        raise _bad("mig_profile", "too many compute slices")
    if options.b200_gpus < 0 or options.b200_gpus % GPUS_PER_NODE:
        raise _bad(
            "b200_gpus", f"{options.b200_gpus} is not 0 or a positive multiple of {GPUS_PER_NODE}"
        )
    if options.cpu_nodes < 0:
        raise _bad("cpu_nodes", f"{options.cpu_nodes} is negative")
    if options.cpu_nodes and not options.storages:
        raise _bad("storages", "no storage label for the cpu nodes")
    if any(not s for s in options.storages):
        raise _bad("storages", "a storage label is empty")


def _validate_teams(options: SeedLikeOptions) -> None:
    """The teams' knobs: shares, demand, load and the small teams' share."""
    if not options.share_alpha > 0:
        raise _bad("share_alpha", f"{options.share_alpha} is not positive")
    if not options.demand_min > 0:
        raise _bad("demand_min", f"{options.demand_min} is not positive")
    if not options.demand_max >= options.demand_min:
        raise _bad("demand_max", f"{options.demand_max} is below --demand-min")
    if options.load is not None and not options.load > 0:
        raise _bad("load", f"{options.load} is not positive")
    if not options.offered > 0:
        raise _bad("offered", f"{options.offered} is not positive")
    if options.idle_share is not None and not 0 <= options.idle_share < 1:
        raise _bad("idle_share", f"{options.idle_share} is not a share in [0, 1)")
    if options.interactive_share is not None and not 0 <= options.interactive_share < 1:
        raise _bad("interactive_share", f"{options.interactive_share} is not a share in [0, 1)")
    if options.debug_rate is not None and not options.debug_rate >= 0:
        raise _bad("debug_rate", f"{options.debug_rate} is negative")
    if not options.small_team_gpus > 0:
        raise _bad("small_team_gpus", f"{options.small_team_gpus} is not positive")
    if not 0 <= options.orgs <= options.teams:
        raise _bad(
            "orgs",
            f"{options.orgs} is not in 0..{options.teams} (each organisation holds a team)",
        )
    if options.orgs and options.small_teams:
        raise _bad(
            "small_teams",
            f"{options.small_teams} small teams cannot be set with --orgs: the shares drawn at"
            " the top are the organisations'",
        )
    plain = options.teams - 2 if options.program and options.teams >= 2 else options.teams
    if not 0 <= options.small_teams < max(1, plain):
        raise _bad(
            "small_teams",
            f"{options.small_teams} is not in 0..{max(0, plain - 1)}"
            " (teams outside the program, one left at a drawn share)",
        )
    top_level = plain + (1 if plain != options.teams else 0)
    small_units = _small_units(options)
    if options.small_teams and (
        small_units * options.small_teams + MIN_SHARE_UNITS * (top_level - options.small_teams)
        > SHARE_UNITS
    ):
        raise _bad(
            "small_team_gpus",
            f"{options.small_teams} teams of {options.small_team_gpus:g} GPUs leave too little"
            f" of {options.gpus} GPUs for the other teams",
        )


def _validate_work(options: SeedLikeOptions) -> None:
    """The work's knobs: backlog, session rates, hours and the policy's."""
    if not options.backlog >= 0:
        raise _bad("backlog", f"{options.backlog} is negative")
    for rate in ("interactive_per_day", "debug_per_day", "dataprep_per_day"):
        value = getattr(options, rate)
        if not value >= 0:
            raise _bad(rate, f"{value} is negative")
    if not 0 <= options.off_hours <= 1:
        raise _bad("off_hours", f"{options.off_hours} is not a share in 0..1")
    if options.checkpointing is not None and not 0 <= options.checkpointing <= 1:
        raise _bad("checkpointing", f"{options.checkpointing} is not a share in 0..1")
    if options.burst is not None and not options.burst >= 1:
        raise _bad("burst", f"{options.burst} is not a factor >= 1 on a team's batch work")
    if not options.burst_days > 0:
        raise _bad("burst_days", f"{options.burst_days} is not a positive number of days")
    if options.burst is not None and options.burst_days > options.days:
        raise _bad(
            "burst_days", f"{options.burst_days} days of burst do not fit in --days {options.days}"
        )
    if not 0 <= options.failure_rate <= MAX_FAILURE_RATE:
        raise _bad(
            "failure_rate",
            f"{options.failure_rate} is not a rate in 0..{MAX_FAILURE_RATE:g} failures per node"
            " per day",
        )
    if not options.repair_hours > 0:
        raise _bad("repair_hours", f"{options.repair_hours} is not a positive number of hours")
    if not -12 <= options.tz_offset <= 14:
        raise _bad("tz_offset", f"{options.tz_offset} is not an offset in -12..14 hours")
    for policy_knob in ("lookback", "max_min_runtime"):
        value = getattr(options, policy_knob)
        if value is not None and not value >= 0:
            raise _bad(policy_knob, f"{value} is negative")


# --- time -------------------------------------------------------------------


def working_windows(horizon: int, tz_offset: float) -> list[tuple[int, int]]:
    """Working-hour intervals [start, end) inside [0, horizon), in scenario seconds."""
    offset = round(tz_offset * HOUR)
    windows = []
    for local_day in range((offset) // DAY, (horizon + offset) // DAY + 1):
        if local_day % 7 >= 5:  # day 0 is a Monday
            continue
        start = max(0, local_day * DAY + WORK_START - offset)
        end = min(horizon, local_day * DAY + WORK_END - offset)
        if end > start:
            windows.append((start, end))
    return windows


def is_working_time(t: float, tz_offset: float) -> bool:
    """Whether scenario second ``t`` falls on Monday-Friday, 9:00-18:00 local time."""
    local = t + round(tz_offset * HOUR)
    day, second = divmod(local, DAY)
    return int(day) % 7 < 5 and WORK_START <= second < WORK_END


def _complement(windows: Sequence[tuple[int, int]], horizon: int) -> list[tuple[int, int]]:
    gaps = []
    cursor = 0
    for start, end in windows:
        if start > cursor:
            gaps.append((cursor, start))
        cursor = end
    if cursor < horizon:
        gaps.append((cursor, horizon))
    return gaps


class _ArrivalCurve:
    """Maps a fraction q of the arrivals to the time by which that fraction has arrived.

    The arrival rate is constant inside each set of windows: ``in_share`` of the
    mass falls in ``work`` windows, the rest in ``off`` windows.
    """

    def __init__(
        self,
        work: Sequence[tuple[int, int]],
        off: Sequence[tuple[int, int]],
        in_share: float,
    ) -> None:
        work_total = sum(end - start for start, end in work)
        off_total = sum(end - start for start, end in off)
        if not work_total:
            in_share = 0.0
        if not off_total:
            in_share = 1.0
        segments = [(s, e, in_share / work_total) for s, e in work if work_total]
        segments += [(s, e, (1 - in_share) / off_total) for s, e in off if off_total]
        segments.sort()
        self.segments = [(s, e, d) for s, e, d in segments if d > 0]
        self.mass_ends = list(itertools.accumulate((e - s) * d for s, e, d in self.segments))

    def at(self, q: float) -> int:
        q = min(max(q, 0.0), self.mass_ends[-1] * (1 - 1e-12))
        k = min(bisect.bisect_right(self.mass_ends, q), len(self.segments) - 1)
        start, end, density = self.segments[k]
        before = self.mass_ends[k - 1] if k else 0.0
        return min(end - 1, start + int((q - before) / density))


def _clip(windows: Sequence[tuple[int, int]], low: int) -> list[tuple[int, int]]:
    return [(max(s, low), e) for s, e in windows if e > low]


class _Times:
    """Uniform draws of whole seconds from a union of intervals."""

    def __init__(self, windows: Sequence[tuple[int, int]]) -> None:
        self.windows = list(windows)
        self.ends = list(itertools.accumulate(end - start for start, end in self.windows))
        self.total = self.ends[-1] if self.ends else 0

    def draw(self, rng: random.Random) -> int:
        u = rng.randrange(self.total)
        k = bisect.bisect_right(self.ends, u)
        before = self.ends[k - 1] if k else 0
        return self.windows[k][0] + u - before


# --- teams and users --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Team:
    name: str
    h100_share: float
    """Effective share of pool h100 (a sub-team's is its parent's times its own)."""
    demand: float
    b200_share: float = 0.0
    """Effective share of pool b200 (0 without it)."""


@dataclass(frozen=True, slots=True)
class Burst:
    """A deadline burst as drawn: ``team``'s batch work submitted in [start, end) is
    ``factor`` times what the scenario without it has there (``base_work`` GPU-seconds;
    ``extra_work`` is what the burst adds)."""

    team: str
    start: int
    end: int
    factor: float
    base_work: float
    extra_work: float


def _units_to_shares(units: list[int]) -> list[float]:
    """Shares of 1/SHARE_UNITS whose float sum, added in order or exactly, is at most 1."""
    units = list(units)
    shares = [u / SHARE_UNITS for u in units]
    while sum(shares) > 1.0 or math.fsum(shares) > 1.0:
        biggest = max(range(len(units)), key=lambda k: units[k])
        units[biggest] -= 1
        shares = [u / SHARE_UNITS for u in units]
    return shares


def draw_shares(count: int, alpha: float, rng: random.Random) -> list[float]:
    """``count`` shares from a symmetric Dirichlet(alpha) law, 4 decimals, summing to <= 1."""
    weights = [rng.gammavariate(alpha, 1.0) for _ in range(count)]
    total_weight = sum(weights) or 1.0
    floor_units = MIN_SHARE_UNITS * count
    spread = SHARE_UNITS - floor_units
    raw = [w / total_weight * spread for w in weights]
    units = [MIN_SHARE_UNITS + int(r) for r in raw]
    # Largest remainders take the units lost to truncation.
    order = sorted(range(count), key=lambda k: (-(raw[k] - int(raw[k])), k))
    for k in order[: SHARE_UNITS - sum(units)]:
        units[k] += 1
    return _units_to_shares(units)


def _small_units(options: SeedLikeOptions) -> int:
    """The h100 share of one ``small_teams`` team, in 1/SHARE_UNITS of the pool."""
    return max(MIN_SHARE_UNITS, round(options.small_team_gpus / options.gpus * SHARE_UNITS))


def shrink_shares(shares: Sequence[float], picks: Sequence[int], units: int) -> list[float]:
    """``shares`` with those at ``picks`` set to ``units`` / SHARE_UNITS each.

    The others split what is left in proportion to their old shares (at least the
    smallest share each); the result still sums to at most 1 as JSON floats add up.
    """
    old = [round(share * SHARE_UNITS) for share in shares]
    chosen = set(picks)
    others = [k for k in range(len(old)) if k not in chosen]
    left = sum(old) - units * len(chosen) - MIN_SHARE_UNITS * len(others)
    extra = _largest_remainder(left, [max(0, old[k] - MIN_SHARE_UNITS) for k in others])
    new = list(old)
    for k in chosen:
        new[k] = units
    for k, more in zip(others, extra, strict=True):
        new[k] = MIN_SHARE_UNITS + more
    return _units_to_shares(new)


def _team_names(count: int) -> list[str]:
    if count <= len(TEAM_NAMES):
        return list(TEAM_NAMES[:count])
    return [f"team-{k + 1:02d}" for k in range(count)]


def _largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    weight_sum = sum(weights) or 1.0
    raw = [total * w / weight_sum for w in weights]
    counts = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda k: (-(raw[k] - counts[k]), k))
    for k in order[: total - sum(counts)]:
        counts[k] += 1
    return counts


# --- the scenario -----------------------------------------------------------


@dataclass(slots=True)
class _Draft:
    submit: int
    body: dict[str, Any]
    gpu_seconds: float


def _weighted(rng: random.Random, table: Sequence[tuple[Any, float]]) -> Any:
    values = [v for v, _ in table]
    weights = [w for _, w in table]
    return rng.choices(values, weights=weights)[0]


def _minutes(seconds: float) -> int:
    return max(MINUTE, round(seconds / MINUTE) * MINUTE)


def seed_like(options: SeedLikeOptions) -> dict[str, Any]:
    """A scenario shaped like the seed's cluster; the same options give the same dict.

    Raises InputError (``where`` is the knob's flag) when a knob is out of range.
    """
    validate(options)
    return _SeedLike(options).scenario()


class _SeedLike:
    """One scenario being drawn. The parts are drawn in a fixed order from one
    ``random.Random(options.seed)`` (`scenario`): any change of that order changes
    every scenario."""

    def __init__(self, options: SeedLikeOptions) -> None:
        self.options = options
        self.rng = random.Random(options.seed)
        # Checkpoints are drawn apart, so every other draw is as it was before them.
        self.price_rng = random.Random(f"checkpoints-{options.seed}")
        self.horizon = options.days * DAY
        self.scale = (options.gpus + options.b200_gpus) / REFERENCE_GPUS
        self.capacity = float(options.gpus + options.b200_gpus)
        self.whole_nodes = options.gpus // GPUS_PER_NODE - options.mig_nodes
        self.b200_nodes = options.b200_gpus // GPUS_PER_NODE
        self.has_cpu_pool = options.cpu_nodes > 0
        self.storages = [
            options.storages[k % len(options.storages)] for k in range(options.cpu_nodes)
        ]
        self.drafts: list[_Draft] = []
        self.backlog_work = 0.0
        # Time windows.
        self.work = working_windows(self.horizon, options.tz_offset)
        self.in_hours = _Times(self.work)
        self.off = _complement(self.work, self.horizon)
        self.off_hours = _Times(self.off) if self.off else self.in_hours
        self.weekdays = self.in_hours.total / WORKDAY
        # A batch request spans at most a quarter of the whole nodes: 64-GPU jobs need
        # 256 GPUs.
        self.node_tables = {
            pool: [(n, w) for n, w in BATCH_NODES if n <= max(1, whole // BATCH_MAX_NODES_DIVISOR)]
            for pool, whole in (("h100", self.whole_nodes), ("b200", self.b200_nodes))
        }
        # Drawn in `scenario`:
        self.teams: list[_Team] = []
        self.team_weights: dict[str, list[float]] = {}
        self.burst: Burst | None = None
        self.users: list[tuple[str, str]] = []
        self.activity: list[float] = []
        self.cum_activity: list[float] = []
        self.team_members: dict[str, list[int]] = {}

    def scenario(self) -> dict[str, Any]:
        options = self.options
        nodes = self.nodes()
        teams_json = self.draw_teams()
        self.draw_users()
        # Batch: a backlog in the first hour, then arrivals up to the target load.
        # The backlog is drawn after the sessions (so the default draws come in the
        # order they always did) unless notebooks fill a share of the arrivals, whose
        # size needs the backlog's work first.
        self.team_weights = {
            "h100": list(itertools.accumulate(t.h100_share * t.demand for t in self.teams)),
            "b200": list(itertools.accumulate(t.b200_share * t.demand for t in self.teams)),
        }
        if options.interactive_share is not None:
            self.draw_backlog()
        self.draw_notebooks()
        self.draw_debug()
        self.draw_dataprep()
        if options.interactive_share is None:
            self.draw_backlog()
        self.draw_arrivals()
        if options.burst is not None:
            self.draw_burst(options.burst)

        drafts = self.drafts
        drafts.sort(key=lambda d: d.submit)  # stable: ties keep the order they were drawn in
        id_width = max(6, len(str(len(drafts))))
        requests = [{"id": f"r{k + 1:0{id_width}d}", **d.body} for k, d in enumerate(drafts)]

        policy: dict[str, Any] = {"name": "budget"}
        if options.lookback is not None:
            policy["lookback"] = _number(options.lookback)
        if options.max_min_runtime is not None:
            policy["max_min_runtime"] = _number(options.max_min_runtime)
        pools = [{"name": "h100", "kind": "gpu"}]
        if self.b200_nodes:
            pools.append({"name": "b200", "kind": "gpu"})
        if self.has_cpu_pool:
            pools.append({"name": "cpu", "kind": "cpu"})
        out: dict[str, Any] = {
            "name": options.name or f"seed-like-{options.gpus}g-{options.days}d-s{options.seed}",
            "horizon": self.horizon,
            "policy": policy,
            "pools": pools,
            "nodes": nodes,
            "teams": teams_json,
            "usage": [],
            "requests": requests,
            "events": self.failures(),
        }
        if self.burst is not None:
            burst = self.burst
            out["description"] = (
                f"deadline burst: team {burst.team}'s batch work submitted in"
                f" [{burst.start}, {burst.end}) s is {burst.factor:g}x what it would be"
            )
        return out

    # -- the cluster and its teams (no draws for the nodes) -------------------

    def nodes(self) -> list[dict[str, Any]]:
        options = self.options
        nodes: list[dict[str, Any]] = [
            {
                "name": "h100-{i:03d}",
                "count": self.whole_nodes,
                "pool": "h100",
                "gpus": GPUS_PER_NODE,
                "gpu_model": "H100",
                "cpus": GPU_NODE_CPUS,
                "memory_gib": GPU_NODE_MEMORY_GIB,
            }
        ]
        per_gpu = MIG_SLICES // round(mig_weight(options.mig_profile) * MIG_SLICES)
        for k in range(options.mig_nodes):
            nodes.append(
                {
                    "name": f"h100-mig-{k:02d}",
                    "pool": "h100",
                    "gpus": GPUS_PER_NODE,
                    "gpu_model": "H100",
                    "cpus": GPU_NODE_CPUS,
                    "memory_gib": GPU_NODE_MEMORY_GIB,
                    "mig": {str(g): [options.mig_profile] * per_gpu for g in range(GPUS_PER_NODE)},
                }
            )
        if self.b200_nodes:
            nodes.append(
                {
                    "name": "b200-{i:03d}",
                    "count": self.b200_nodes,
                    "pool": "b200",
                    "gpus": GPUS_PER_NODE,
                    "gpu_model": "B200",
                    "cpus": B200_NODE_CPUS,
                    "memory_gib": B200_NODE_MEMORY_GIB,
                }
            )
        for k, storage in enumerate(self.storages):
            nodes.append(
                {
                    "name": f"prep-{k + 1:02d}",
                    "pool": "cpu",
                    "gpus": 0,
                    "cpus": CPU_NODE_CPUS,
                    "memory_gib": CPU_NODE_MEMORY_GIB,
                    "labels": {"storage": storage},
                }
            )
        return nodes

    def draw_teams(self) -> list[dict[str, Any]]:
        """The teams' JSON; ``self.teams`` are the leaves, the teams users charge to."""
        options, rng = self.options, self.rng
        leaf_names = _team_names(options.teams)
        with_program = options.program and options.teams >= 2 and not options.orgs
        members: dict[str, list[str]] = {}
        if options.orgs:
            top_level = [f"{ORG_PREFIX}{k + 1}" for k in range(options.orgs)]
            members = {org: leaf_names[k :: options.orgs] for k, org in enumerate(top_level)}
        elif with_program:
            top_level = leaf_names[:-2] + [PROGRAM_TEAM]
        else:
            top_level = list(leaf_names)
        h100_shares = draw_shares(len(top_level), options.share_alpha, rng)
        if options.small_teams:
            plain = [k for k, name in enumerate(top_level) if name != PROGRAM_TEAM]
            smallest = sorted(plain, key=lambda k: (h100_shares[k], k))[: options.small_teams]
            h100_shares = shrink_shares(h100_shares, smallest, _small_units(options))
        cpu_shares = (
            draw_shares(len(top_level), options.share_alpha, rng) if self.has_cpu_pool else []
        )
        b200_shares = (
            draw_shares(len(top_level), options.share_alpha, rng) if self.b200_nodes else []
        )
        teams_json: list[dict[str, Any]] = []
        effective: dict[str, tuple[float, float]] = {}
        """(h100, b200) shares of each team, a sub-team's its parent's times its own."""
        for k, name in enumerate(top_level):
            share = {"h100": h100_shares[k]}
            if self.b200_nodes:
                share["b200"] = b200_shares[k]
            if self.has_cpu_pool:
                share["cpu"] = cpu_shares[k]
            teams_json.append({"name": name, "share": share})
            effective[name] = (h100_shares[k], b200_shares[k] if self.b200_nodes else 0.0)
        children: list[tuple[str, str, float]] = []
        if with_program:
            first = rng.randint(30, 70)
            split = _units_to_shares([first * 100, (100 - first) * 100])
            children = [
                (name, PROGRAM_TEAM, fraction)
                for name, fraction in zip(leaf_names[-2:], split, strict=True)
            ]
        for org in top_level if options.orgs else ():
            fractions = draw_shares(len(members[org]), options.share_alpha, rng)
            pairs = zip(members[org], fractions, strict=True)
            children += [(name, org, fraction) for name, fraction in pairs]
        for name, parent, fraction in children:
            teams_json.append({"name": name, "parent": parent, "share": fraction})
            effective[name] = (effective[parent][0] * fraction, effective[parent][1] * fraction)
        log_low, log_high = math.log(options.demand_min), math.log(options.demand_max)
        self.teams = [
            _Team(
                name,
                effective[name][0],
                math.exp(rng.uniform(log_low, log_high)),
                effective[name][1],
            )
            for name in leaf_names
        ]
        return teams_json

    def draw_users(self) -> None:
        """Users: one per team, the rest by h100 share; activity is heavy-tailed."""
        options, teams = self.options, self.teams
        headcount_total = options.users
        if options.scale_users:
            headcount_total = max(options.teams, round(options.users * self.scale))
        per_team = [
            1 + extra
            for extra in _largest_remainder(
                headcount_total - options.teams, [self.gpu_share(t) for t in teams]
            )
        ]
        width = max(3, len(str(headcount_total)))
        users = self.users
        for leaf, headcount in zip(teams, per_team, strict=True):
            for _ in range(headcount):
                users.append((f"u{len(users) + 1:0{width}d}", leaf.name))
        self.activity = [min(self.rng.paretovariate(1.5), 20.0) for _ in users]
        self.cum_activity = list(itertools.accumulate(self.activity))
        self.team_members = {t.name: [] for t in teams}
        for k, (_, team_name) in enumerate(users):
            self.team_members[team_name].append(k)

    def gpu_share(self, team: _Team) -> float:
        """The team's share of the GPUs: of pool h100 alone (as always) without pool b200,
        else of both pools' GPUs together."""
        if not self.b200_nodes:
            return team.h100_share
        gpus = self.options.gpus * team.h100_share + self.options.b200_gpus * team.b200_share
        return gpus / self.capacity

    def gpu_pool(self, rng: random.Random) -> str:
        """The pool a request goes to: h100 without pool b200 (no draw), else drawn by the
        pools' GPUs."""
        if not self.b200_nodes or rng.random() * self.capacity < self.options.gpus:
            return "h100"
        return "b200"

    def any_user(self) -> tuple[str, str]:
        users = self.users
        return users[self.rng.choices(range(len(users)), cum_weights=self.cum_activity)[0]]

    def member_of(self, team_name: str, rng: random.Random | None = None) -> tuple[str, str]:
        members = self.team_members[team_name]
        k = (rng or self.rng).choices(members, weights=[self.activity[m] for m in members])[0]
        return self.users[k]

    def session_time(self, off_share: float) -> int:
        if self.in_hours.total == 0 or self.rng.random() < off_share:
            return self.off_hours.draw(self.rng)
        return self.in_hours.draw(self.rng)

    def sessions(self, rate: float) -> int:
        return round(rate * self.weekdays * self.scale)

    # -- requests ---------------------------------------------------------------

    def batch(
        self, submit: int, rng: random.Random | None = None, team: _Team | None = None
    ) -> _Draft:
        """A batch job of a team drawn by share x demand in its pool (or of ``team``)."""
        rng = rng or self.rng
        pool = self.gpu_pool(rng)
        if team is None:
            team = rng.choices(self.teams, cum_weights=self.team_weights[pool])[0]
        user, _ = self.member_of(team.name, rng)
        nodes_wanted = _weighted(rng, self.node_tables[pool])
        log_short, log_long = math.log(BATCH_MIN_DURATION), math.log(BATCH_MAX_DURATION)
        duration = _minutes(math.exp(rng.uniform(log_short, log_long)))
        min_runtime = min(duration, rng.choice(BATCH_MIN_RUNTIMES))
        return _Draft(
            submit,
            {
                "user": user,
                "team": team.name,
                "submit": submit,
                "pool": pool,
                "class": "batch",
                "gpus": GPUS_PER_NODE,
                "nodes": nodes_wanted,
                "cpus": CPUS_PER_GPU * GPUS_PER_NODE,
                "memory_gib": MEMORY_GIB_PER_GPU * GPUS_PER_NODE,
                "min_runtime": min_runtime,
                "duration": duration,
                "resumable": True,
                "priority": _weighted(rng, BATCH_PRIORITIES),
            }
            | self.checkpoints(),
            float(GPUS_PER_NODE * nodes_wanted * duration),
        )

    def checkpoints(self) -> dict[str, Any]:
        """A batch job's price of a preemption: most checkpoint every 15-60 min and take
        1-5 min to start again from one; the rest never checkpoint (whole run lost)."""
        rng, share = self.price_rng, self.options.checkpointing
        if share is None:
            return {}
        if rng.random() >= share:
            return {"resumable": False}
        return {
            "checkpoint_every": _minutes(rng.uniform(*CHECKPOINT_EVERY)),
            "restart_cost": _minutes(rng.uniform(*RESTART_COST)),
        }

    def draw_backlog(self) -> None:
        """Batch work submitted in the first hour. With arrivals below what a busy pool
        delivers, the backlog also holds the difference, so that it still stands at the
        end of the horizon."""
        options = self.options
        load = options.load
        short = 0.0 if load is None else max(0.0, STANDING_BUSY - load)
        standing_work = short * self.capacity * self.horizon
        backlog_gpus = 0
        while backlog_gpus < options.backlog * self.capacity:
            draft = self.batch(self.rng.randrange(BACKLOG_WINDOW))
            self.drafts.append(draft)
            self.backlog_work += draft.gpu_seconds
            backlog_gpus += draft.body["gpus"] * draft.body["nodes"]
        queue_work = self.backlog_work
        while self.backlog_work - queue_work < standing_work:
            draft = self.batch(self.rng.randrange(BACKLOG_WINDOW))
            self.drafts.append(draft)
            self.backlog_work += draft.gpu_seconds

    def arrivals_from_backlog(self) -> float:
        """GPU-seconds of h100 work to arrive after the backlog."""
        options = self.options
        if options.load is not None:
            return options.load * self.capacity * self.horizon
        return options.offered * self.capacity * self.horizon - self.backlog_work

    def draw_notebooks(self) -> None:
        """Interactive notebooks: a count per weekday, or until they fill their share."""
        options, rng = self.options, self.rng
        in_hours = self.in_hours
        notebooks = self.sessions(options.interactive_per_day) if in_hours.total else 0
        notebook_work, notebook_target = 0.0, math.inf
        if options.interactive_share is not None:
            notebook_target = options.interactive_share * self.arrivals_from_backlog()
            notebooks = sys.maxsize if in_hours.total else 0
        for _ in range(notebooks):
            if notebook_work >= notebook_target:
                break
            user, team = self.any_user()
            gpus = _weighted(rng, INTERACTIVE_GPUS)
            duration = _minutes(rng.uniform(1 * HOUR, 6 * HOUR))
            min_runtime = min(duration, _minutes(rng.uniform(1 * HOUR, 4 * HOUR)))
            submit = in_hours.draw(rng)
            self.drafts.append(
                _Draft(
                    submit,
                    {
                        "user": user,
                        "team": team,
                        "submit": submit,
                        "pool": self.gpu_pool(rng),
                        "class": "interactive",
                        "gpus": gpus,
                        "nodes": 1,
                        "cpus": CPUS_PER_GPU * gpus,
                        "memory_gib": MEMORY_GIB_PER_GPU * gpus,
                        "min_runtime": min_runtime,
                        "duration": duration,
                        "resumable": options.restorable,
                    }
                    | _idle_after(duration, options.idle_share),
                    gpus * duration,
                )
            )
            notebook_work += gpus * duration

    def draw_debug(self) -> None:
        """Debug sessions: whole GPUs, a fraction, or a MIG instance."""
        options, rng = self.options, self.rng
        kinds: list[tuple[str, float]] = [("whole-1", 0.6), ("whole-2", 0.1), ("fraction", 0.15)]
        kinds.append(("mig", 0.15) if options.mig_nodes else ("fraction", 0.15))
        debug_sessions = self.sessions(options.debug_per_day)
        if options.debug_rate is not None:
            debug_sessions = round(options.debug_rate * len(self.users) * self.weekdays)
        for _ in range(debug_sessions):
            user, team = self.any_user()
            kind = _weighted(rng, kinds)
            duration = _minutes(rng.uniform(5 * MINUTE, 40 * MINUTE))
            min_runtime = min(duration, rng.choice(DEBUG_MIN_RUNTIMES))
            submit = self.session_time(options.off_hours)
            size, weight = self.debug_size(kind)
            self.drafts.append(
                _Draft(
                    submit,
                    {
                        "user": user,
                        "team": team,
                        "submit": submit,
                        "pool": "h100" if kind == "mig" else self.gpu_pool(rng),
                        "class": "debug",
                        **size,
                        "min_runtime": min_runtime,
                        "duration": duration,
                        "resumable": False,
                    },
                    weight * duration,
                )
            )

    def debug_size(self, kind: str) -> tuple[dict[str, Any], float]:
        """A debug session's size fields and its GPU weight."""
        if kind == "mig":
            profile = self.options.mig_profile
            return {"mig": profile, "cpus": 1, "memory_gib": 16}, mig_weight(profile)
        if kind == "fraction":
            fraction = self.rng.choice(DEBUG_FRACTIONS)
            size = {
                "gpu_fraction": fraction,
                "cpus": max(1, round(CPUS_PER_GPU * fraction)),
                "memory_gib": round(MEMORY_GIB_PER_GPU * fraction),
            }
            return size, fraction
        gpus = 1 if kind == "whole-1" else 2
        size = {
            "gpus": gpus,
            "nodes": 1,
            "cpus": CPUS_PER_GPU * gpus,
            "memory_gib": MEMORY_GIB_PER_GPU * gpus,
        }
        return size, float(gpus)

    def draw_dataprep(self) -> None:
        """Data preparation next to storage."""
        options, rng = self.options, self.rng
        labels = sorted(set(self.storages))
        for _ in range(self.sessions(options.dataprep_per_day) if self.has_cpu_pool else 0):
            user, team = self.any_user()
            cpus = rng.choice(DATAPREP_CPUS)
            duration = _minutes(rng.uniform(1 * HOUR, 8 * HOUR))
            submit = self.session_time(options.off_hours)
            self.drafts.append(
                _Draft(
                    submit,
                    {
                        "user": user,
                        "team": team,
                        "submit": submit,
                        "pool": "cpu",
                        "class": "dataprep",
                        "gpus": 0,
                        "cpus": cpus,
                        "memory_gib": DATAPREP_MEMORY_GIB_PER_CPU * cpus,
                        "labels": {"storage": rng.choice(labels)},
                        "min_runtime": HOUR,
                        "duration": duration,
                        "resumable": False,
                    },
                    0.0,
                )
            )

    def draw_arrivals(self) -> None:
        """Batch arrivals after the backlog, up to the target load. They are paced by
        their work, not drawn independently: the k-th one comes when the share of
        arrival work before it (plus jitter) has arrived at an even pace. Independent
        times would let the queue drift by days of cluster work."""
        options, rng, horizon = self.options, self.rng, self.horizon
        offered = sum(d.gpu_seconds for d in self.drafts)
        if options.load is not None:
            target = options.load * self.capacity * horizon + self.backlog_work
        else:
            target = options.offered * self.capacity * horizon
        arrivals: list[_Draft] = []
        while offered < target:
            arrivals.append(self.batch(0))
            offered += arrivals[-1].gpu_seconds
        curve = _ArrivalCurve(
            _clip(self.work, BACKLOG_WINDOW), _clip(self.off, BACKLOG_WINDOW), BATCH_IN_HOURS
        )
        arrival_work = sum(d.gpu_seconds for d in arrivals)
        jitter = BATCH_JITTER / (horizon - BACKLOG_WINDOW)
        paced = 0.0
        for draft in arrivals:
            q = (paced + draft.gpu_seconds / 2) / arrival_work
            jittered = q + rng.uniform(-jitter, jitter)
            q = jittered if 0 <= jittered < 1 else q  # no pile-up at the ends
            paced += draft.gpu_seconds
            draft.submit = curve.at(q)
            draft.body["submit"] = draft.submit
        self.drafts.extend(arrivals)

    def draw_burst(self, factor: float) -> None:
        """A deadline: one team (drawn by its share of the GPUs x its demand) submits, in a
        window of ``burst_days`` starting on a whole hour after the first day where the
        horizon allows, ``factor`` x the batch work it submits there without the burst.
        Drawn last, from a generator of its own, so the rest of the scenario is the one
        without it (but for the ids, given in submit order)."""
        options, horizon = self.options, self.horizon
        rng = random.Random(f"burst-{options.seed}")
        weights = [self.gpu_share(t) * t.demand for t in self.teams]
        team = rng.choices(self.teams, weights=weights)[0]
        length = round(options.burst_days * DAY)
        latest = (horizon - length) // HOUR
        start = rng.randint(min(DAY // HOUR, latest), latest) * HOUR
        end = start + length

        def arriving(draft: _Draft) -> bool:
            return draft.body["class"] == "batch" and draft.submit >= BACKLOG_WINDOW

        base = sum(
            d.gpu_seconds
            for d in self.drafts
            if arriving(d) and d.body["team"] == team.name and start <= d.submit < end
        )
        if not base:  # none fell in the window: what the team's pace would put there
            arrival_work = sum(d.gpu_seconds for d in self.drafts if arriving(d))
            base = (
                arrival_work
                * self.gpu_share(team)
                * team.demand
                / sum(weights)
                * length
                / (horizon - BACKLOG_WINDOW)
            )
        extra = 0.0
        while extra < (factor - 1) * base:
            submit = max(BACKLOG_WINDOW, start + rng.randrange(length))
            draft = self.batch(submit, rng, team)
            self.drafts.append(draft)
            extra += draft.gpu_seconds
        self.burst = Burst(team.name, start, end, factor, base, extra)

    def failures(self) -> list[dict[str, Any]]:
        """Node health events: each GPU node fails at ``failure_rate`` per day (exponential
        gaps, counted from its last repair); a failure is a crash (down at once) or, for
        MAINTENANCE_SHARE of them, announced (draining for MAINTENANCE_LEAD, then down);
        the node is ready again after ``repair_hours`` x 0.5-1.5. Drawn from a generator
        of their own: the requests are the ones without failures."""
        options, horizon = self.options, self.horizon
        if not options.failure_rate:
            return []
        rng = random.Random(f"failures-{options.seed}")
        names = [f"h100-{i:03d}" for i in range(self.whole_nodes)]
        names += [f"h100-mig-{k:02d}" for k in range(options.mig_nodes)]
        names += [f"b200-{i:03d}" for i in range(self.b200_nodes)]
        events: list[tuple[int, str, str]] = []
        for name in names:
            t = 0.0
            while True:
                t += rng.expovariate(options.failure_rate / DAY)
                if t >= horizon:
                    break
                repair = round(options.repair_hours * HOUR * rng.uniform(*REPAIR_SPREAD))
                down = at = int(t)
                if rng.random() < MAINTENANCE_SHARE:
                    events.append((at, name, "draining"))
                    down = at + MAINTENANCE_LEAD
                events += [(down, name, "down"), (down + repair, name, "ready")]
                t = down + repair
        return [
            {"at": at, "node": name, "state": state}
            for at, name, state in sorted(events)
            if at < horizon
        ]


def burst_of(options: SeedLikeOptions) -> Burst | None:
    """The deadline burst ``seed_like(options)`` draws (None without ``burst``)."""
    validate(options)
    drawn = _SeedLike(options)
    drawn.scenario()
    return drawn.burst


def down_gpu_seconds(scenario: Mapping[str, Any]) -> dict[str, list[float]]:
    """GPU-seconds each GPU pool's nodes are down, day by day (days of 24 h from time 0,
    the last one possibly shorter), from the scenario's node events: from ``down`` to
    ``ready`` (a draining node still runs what it holds, so it counts as up)."""
    horizon = float(scenario["horizon"])
    days = max(1, math.ceil(horizon / DAY))
    gpus: dict[str, tuple[str, int]] = {}
    for node in scenario["nodes"]:
        if not node.get("gpus"):
            continue
        for i in range(int(node.get("count", 1))):
            gpus[str(node["name"]).format(i=i)] = (str(node["pool"]), int(node["gpus"]))
    out = {pool: [0.0] * days for pool, _ in gpus.values()}
    since: dict[str, float] = {}

    def book(name: str, start: float, end: float) -> None:
        pool, count = gpus[name]
        for day in range(int(start // DAY), min(days, math.ceil(end / DAY))):
            overlap = min(end, (day + 1) * DAY) - max(start, day * DAY)
            out[pool][day] += count * max(0.0, overlap)

    for event in sorted(scenario.get("events", []), key=lambda e: e["at"]):
        name = event["node"]
        if name not in gpus:
            continue
        if event["state"] == "ready":
            if name in since:
                book(name, since.pop(name), min(horizon, float(event["at"])))
        elif event["state"] == "down":
            since.setdefault(name, float(event["at"]))
    for name, start in since.items():
        book(name, start, horizon)
    return out


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def dumps(scenario: Mapping[str, Any]) -> str:
    """The scenario as JSON text: one top-level key per line, one list item per line."""
    lines = ["{"]
    items = list(scenario.items())
    for k, (key, value) in enumerate(items):
        comma = "," if k < len(items) - 1 else ""
        if isinstance(value, list) and value:
            inner = ",\n".join("    " + json.dumps(item) for item in value)
            lines.append(f"  {json.dumps(key)}: [\n{inner}\n  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


# --- load figures -----------------------------------------------------------


def gpu_weight(request: Mapping[str, Any]) -> float:
    """GPU-equivalents a request holds while it runs (all nodes)."""
    nodes = int(request.get("nodes", 1))
    if request.get("mig") is not None:
        return mig_weight(str(request["mig"])) * nodes
    if request.get("gpu_fraction"):
        return float(request["gpu_fraction"]) * nodes
    return float(request.get("gpus", 0)) * nodes


def _pool_capacity(scenario: Mapping[str, Any], pool: str, key: str) -> float:
    return float(
        sum(int(n.get("count", 1)) * n.get(key, 0) for n in scenario["nodes"] if n["pool"] == pool)
    )


def _effective_shares(scenario: Mapping[str, Any], pool: str) -> dict[str, float]:
    by_name = {t["name"]: t for t in scenario["teams"]}

    def share(name: str) -> float:
        team = by_name[name]
        if "parent" in team:
            return float(team["share"]) * share(team["parent"])
        return float(team["share"].get(pool, 0.0))

    return {name: share(name) for name in by_name}


def outstanding_estimate(
    requests: Sequence[Mapping[str, Any]], capacity: float, horizon: int, step: int = DAY
) -> list[float]:
    """Outstanding GPU demand over capacity at ``step, 2 step, ...``, replaying FIFO.

    An optimistic check, not a simulation: requests start in submit order as soon
    as enough GPU-equivalents are free in the pool (no nodes, no fragmentation,
    no preemption). Outstanding = GPUs of requests submitted but not finished.
    """
    running: list[tuple[float, float]] = []
    free = capacity
    clock = 0.0
    changes: list[tuple[float, float]] = []
    for request in requests:
        weight = gpu_weight(request)
        clock = max(clock, float(request["submit"]))
        while free + 1e-9 < weight and running:
            end, released = heapq.heappop(running)
            free += released
            clock = max(clock, end)
        free -= weight
        finish = clock + float(request["duration"])
        heapq.heappush(running, (finish, weight))
        changes.append((float(request["submit"]), weight))
        changes.append((finish, -weight))
    changes.sort()
    ratios = []
    outstanding = 0.0
    k = 0
    for sample in range(step, horizon + 1, step):
        while k < len(changes) and changes[k][0] <= sample:
            outstanding += changes[k][1]
            k += 1
        ratios.append(outstanding / capacity)
    return ratios


@dataclass(frozen=True, slots=True)
class LoadReport:
    """Offered-load figures of a scenario (its GPU pools together: h100, and b200 if
    present; pool cpu if present)."""

    capacity_gpus: float
    horizon: int
    offered_gpu_h: Mapping[str, float]
    """Offered GPU-hours by class, plus ``backlog`` (batch submitted in the first hour)."""
    load: float
    """All offered GPU-seconds over capacity x horizon."""
    arrival_load: float
    """Offered GPU-seconds except the first hour's batch backlog, over capacity x horizon."""
    interactive_share: float
    """Notebooks' share of the offered GPU-seconds except the backlog."""
    backlog_gpus: float
    """GPU-equivalents of requests submitted in the first hour, over capacity."""
    outstanding: tuple[float, ...]
    """`outstanding_estimate` at the end of each day."""
    counts: Mapping[str, int]
    team_demand: Mapping[str, float]
    """Each team's offered GPU work over its share of the GPU pools' capacity x horizon."""
    cpu_capacity: float
    cpu_load: float


def load_report(scenario: Mapping[str, Any]) -> LoadReport:
    """The figures a user checks a generated scenario against (see the module docstring)."""
    horizon = int(scenario["horizon"])
    gpu_pools = [p["name"] for p in scenario["pools"] if p["kind"] == "gpu"]
    by_pool = {pool: _pool_capacity(scenario, pool, "gpus") for pool in gpu_pools}
    capacity = sum(by_pool.values())
    cpu_capacity = _pool_capacity(scenario, "cpu", "cpus")
    h100 = [r for r in scenario["requests"] if r["pool"] in by_pool]
    offered: dict[str, float] = {"batch": 0.0, "backlog": 0.0, "interactive": 0.0, "debug": 0.0}
    by_team: dict[str, float] = {}
    backlog_gpus = 0.0
    for request in h100:
        work = gpu_weight(request) * float(request["duration"])
        klass = request.get("class", "interactive")
        offered[klass] = offered.get(klass, 0.0) + work / HOUR
        by_team[request["team"]] = by_team.get(request["team"], 0.0) + work
        if request["submit"] < BACKLOG_WINDOW:
            backlog_gpus += gpu_weight(request)
            if klass == "batch":
                offered["backlog"] += work / HOUR
    total = sum(v for k, v in offered.items() if k != "backlog") * HOUR
    arriving = total - offered["backlog"] * HOUR
    cpu_work = sum(
        float(r.get("cpus", 1)) * int(r.get("nodes", 1)) * float(r["duration"])
        for r in scenario["requests"]
        if r["pool"] == "cpu"
    )
    counts: dict[str, int] = {}
    for request in scenario["requests"]:
        klass = request.get("class", "interactive")
        counts[klass] = counts.get(klass, 0) + 1
    shares = {pool: _effective_shares(scenario, pool) for pool in gpu_pools}
    team_gpus = {
        name: sum(shares[pool][name] * by_pool[pool] for pool in gpu_pools)
        for name in shares.get("h100", {})
    }
    team_demand = {
        name: by_team.get(name, 0.0) / (gpus * horizon)
        for name, gpus in team_gpus.items()
        if name in by_team and gpus > 0
    }
    return LoadReport(
        capacity_gpus=capacity,
        horizon=horizon,
        offered_gpu_h=offered,
        load=total / (capacity * horizon) if capacity else 0.0,
        arrival_load=arriving / (capacity * horizon) if capacity else 0.0,
        interactive_share=offered["interactive"] * HOUR / arriving if arriving > 0 else 0.0,
        backlog_gpus=backlog_gpus / capacity if capacity else 0.0,
        outstanding=tuple(outstanding_estimate(h100, capacity, horizon)) if capacity else (),
        counts=counts,
        team_demand=team_demand,
        cpu_capacity=cpu_capacity,
        cpu_load=cpu_work / (cpu_capacity * horizon) if cpu_capacity else 0.0,
    )


def format_report(report: LoadReport) -> str:
    """`load_report` as lines of text for a person."""
    hours = report.capacity_gpus * report.horizon / HOUR
    offered = report.offered_gpu_h
    total = sum(v for k, v in offered.items() if k != "backlog")
    lines = [
        f"capacity: {report.capacity_gpus:,.0f} GPUs x {report.horizon / DAY:g} d"
        f" = {hours:,.0f} GPU-h",
        f"offered: {total:,.0f} GPU-h = {report.load:.3f} x capacity"
        f" (batch {offered['batch']:,.0f} of which backlog {offered['backlog']:,.0f},"
        f" interactive {offered['interactive']:,.0f}, debug {offered['debug']:,.0f})",
        f"submitted in the first hour: {report.backlog_gpus:.2f} x capacity in GPUs",
        f"after the backlog: {report.arrival_load:.3f} x capacity"
        f" ({report.interactive_share:.1%} of it notebooks)",
    ]
    if report.outstanding:
        ordered = sorted(report.outstanding)
        lines.append(
            "outstanding demand / capacity, FIFO replay at full capacity, end of each day:"
            f" min {ordered[0]:.2f}, median {ordered[len(ordered) // 2]:.2f},"
            f" max {ordered[-1]:.2f}"
        )
        lines.append("  by day: " + " ".join(f"{r:.1f}" for r in report.outstanding))
    if report.cpu_capacity:
        lines.append(
            f"cpu pool: {report.cpu_capacity:,.0f} cores, offered {report.cpu_load:.3f} x capacity"
        )
    total_requests = sum(report.counts.values())
    lines.append(
        f"requests: {total_requests:,} ("
        + ", ".join(f"{k} {v:,}" for k, v in sorted(report.counts.items()))
        + ")"
    )
    lines.append(
        "team h100 demand / share: "
        + ", ".join(f"{name} {ratio:.2f}" for name, ratio in report.team_demand.items())
    )
    return "\n".join(lines)
