"""Replaying a live store's history in the simulator (`budgethub replay`, issue 51).

A `History` (read from the store by `replay_store.read_history`, or built by a test)
says what really happened over a period: every request with its runs, node health
over time, admin changes, and the running state and queue at the period's start.
`plan` turns it into a simulator `Scenario` (times relative to the period's start) and
into a `SimRun` of what happened live, so that the simulated and the live run are
measured by the same code (`metrics.result`, `evaluation.headline`); `simulate` runs
the scenario, `compare` sets the two side by side request by request.

Design: the simulator (scheduler_core/simulator.py) starts from an empty cluster and
fixed settings. Rather than change it, `simulate` prepares its `Simulation` before the
run: sessions running at the period's start are adopted (`Scheduler.adopt`, as the live
Hub does after a restart), the queue at the start is submitted, and admin changes are
events of the simulator's own queue that a `Scheduler` subclass applies with
`Scheduler.reconfigure` (as the live Hub's `sync_admin` does). A request's work is what
its live runs did: the last run's length (less its restart) plus what each preempted run
kept (`Request.kept_seconds`, the simulator's own rule), so a session its user ended or
idle release stopped ends there; one still running at the end runs past the horizon.
"""

from __future__ import annotations

import functools
import gc
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any, TypeVar, cast

from scheduler_core import simulator as sim_module
from scheduler_core.metrics import percentile, result
from scheduler_core.model import (
    Allocation,
    Health,
    Node,
    NodeGrant,
    Pool,
    PoolKind,
    Request,
    Team,
)
from scheduler_core.nodefree import NodeFree
from scheduler_core.research.evaluation import RunOutcome, headline, waits_by_class
from scheduler_core.scenario import NodeEvent, Scenario, why_unplaceable
from scheduler_core.scheduler import Scheduler
from scheduler_core.settings import Settings
from scheduler_core.simulator import (
    CycleObserver,
    RequestRecord,
    Segment,
    SimActuator,
    SimRun,
    Simulation,
)

_F = TypeVar("_F", bound=Callable[..., Any])


def without_cyclic_gc(function: _F) -> _F:
    """Run ``function`` with Python's cyclic garbage collector paused (as it was before,
    after). The replay builds a month's history, plan and outcomes as some 10^6 objects
    that all live on, and each generational pass scanned them again: a third of the
    store's read and half the plan's time on the seed-1 month (docs/replay.md). They make
    few reference cycles; the collector's next pass takes what there is. Not used around
    the simulation, which was measured no faster without it."""

    @functools.wraps(function)
    def paused(*args: Any, **kwargs: Any) -> Any:
        if not gc.isenabled():
            return function(*args, **kwargs)
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            gc.enable()

    return cast(_F, paused)


PREEMPTED = "preempted"
LAUNCH_FAILED = "launch-failed"
FINISHED = "finished"
RUNNING = "running"

CAUSES = {
    "launch-failed": "a launch failed live and the request waited again",
    "spawn-latency": "within the session's own spawn latency of the live start",
    "hub-restart": "the Hub restarted while the request waited",
    "unseen": "a request the simulator cannot see",
    "cycle-tick": "within one cycle tick (the live Hub decides on its tick)",
    "admin-change": "an admin change fell while the request waited",
    "node-event": "a node changed health while the request waited",
    "knock-on": "an earlier difference changed what was free",
}
"""Why a request's live and simulated outcomes differ, where the cause is known."""


@dataclass(frozen=True)
class LiveRun:
    """One allocation of a request, as the store kept it (epoch seconds)."""

    start: float
    end: float | None
    """None: still running at the period's end."""
    grants: tuple[NodeGrant, ...]
    """Its nodes, with the slices where the store still holds them (a running one)."""
    funded: bool
    protected_until: float
    charge_rate: float
    ended: str
    """How it ended: PREEMPTED, LAUNCH_FAILED, FINISHED (by itself, its user or idle
    release) or RUNNING (not by the period's end)."""
    allocation_id: int | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(g.node for g in self.grants)


@dataclass(frozen=True)
class LiveRequest:
    request: Request
    runs: tuple[LiveRun, ...]
    cancelled: float | None = None
    """When it left the queue without running again (user, admin or queue limit)."""
    idle_after: float | None = None
    """Seconds into a run after which the session sat idle to its end, if it did."""
    latency: float | None = None
    """The first run's spawn latency (booked to ready), if the Hub recorded it."""
    forecast_start: float | None = None
    forecast_funded: bool | None = None
    forecast_time: float | None = None
    requeued: bool | None = None
    """Whether the Hub queued it again after a preemption (its ``preempt`` events say so);
    None where the store does not say (it was never preempted)."""


@dataclass(frozen=True)
class AdminChange:
    """Settings and shares an admin (or a Hub restart's configuration) changed at ``at``."""

    at: float
    settings: Mapping[str, Any] = field(default_factory=dict)
    shares: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(team, pool) → its new share."""
    source: str = "audit"


@dataclass(frozen=True)
class InventoryChange:
    """A node's GPUs, MIG layout, CPUs or memory changed at ``at`` (a Hub start that
    found it so: the store's ``node-inventory`` event)."""

    at: float
    node: Node
    added: bool = False
    """The node was new then (down until this change)."""


@dataclass(frozen=True)
class History:
    """What the store says happened between ``since`` and ``until`` (epoch seconds)."""

    since: float
    until: float
    settings: Settings
    """The live settings at ``since``."""
    pools: tuple[Pool, ...]
    nodes: tuple[Node, ...]
    """Health as at ``since``."""
    teams: tuple[Team, ...]
    """Shares as at ``since``."""
    requests: tuple[LiveRequest, ...]
    node_events: tuple[NodeEvent, ...] = ()
    """Health changes after ``since`` (epoch seconds)."""
    admin: tuple[AdminChange, ...] = ()
    usage: tuple[tuple[str, str, float, float, float, int | None], ...] = ()
    """Charges before ``since`` in the lookback window: (team, pool, start, end, units,
    allocation id)."""
    hub_starts: tuple[float, ...] = ()
    inventory: tuple[InventoryChange, ...] = ()
    """Nodes whose inventory changed after ``since`` (epoch seconds); ``nodes`` hold each
    as it was at ``since``."""
    missing: tuple[str, ...] = ()
    """What the store does not record that a faithful replay would need."""
    store: str = ""
    schema: str = ""


@dataclass(frozen=True)
class Adopted:
    """A session running at the period's start (times relative to it)."""

    allocation: Allocation
    work: float
    """Work left at its run's start, less the restart (as `SimActuator.launch` counts)."""
    restart: float
    allocation_id: int | None = None


@dataclass(frozen=True)
class Queued:
    """A request waiting at the period's start (its submit relative, so negative)."""

    request: Request
    work: float
    restart: float


@dataclass(frozen=True)
class Plan:
    """A history made ready for the simulator; every time relative to ``since``."""

    history: History
    scenario: Scenario
    """The requests submitted in the period; settings, nodes, teams at its start."""
    adopted: tuple[Adopted, ...]
    queued: tuple[Queued, ...]
    admin: tuple[AdminChange, ...]
    live: SimRun
    """What happened live, as the simulator would have recorded it."""
    unseen: Mapping[str, str]
    """Request id → why the simulator cannot see it."""
    live_requests: Mapping[str, LiveRequest]
    ends_on_preempt: frozenset[str] = frozenset()
    """Requests a preemption ends instead of queueing them again, as the live Hub did
    (`ends_on_preempt`)."""
    inventory: tuple[InventoryChange, ...] = ()
    """Nodes' inventory changes in the period (relative times)."""


def kept_progress(request: Request, elapsed: float, restart: float) -> float:
    """Of a run preempted after ``elapsed`` seconds that began with ``restart`` seconds of
    restart, the progress kept: the simulator's rule (`SimActuator.preempt`), which asks
    the request (`Request.saved_seconds` where the model has it, else `kept_seconds`)."""
    saved = getattr(request, "saved_seconds", None)
    if saved is not None:
        return max(0.0, float(saved(elapsed)) - restart)
    older = getattr(request, _KEPT)  # the model before saved_seconds
    return float(older(max(0.0, elapsed - restart)))


_KEPT = "kept_seconds"


def work_of(live: LiveRequest, horizon_end: float) -> tuple[float, bool]:
    """The work the request's live runs did, and whether it is all of it (False: still
    running or never ended, so its work is at least this)."""
    request = live.request
    done = 0.0
    restart = 0.0
    for run in live.runs:
        if run.ended == LAUNCH_FAILED:
            continue
        if run.ended == RUNNING or run.end is None:
            end = horizon_end if run.end is None else run.end
            return done + max(0.0, end - run.start - restart), False
        length = run.end - run.start
        if run.ended == PREEMPTED:
            done += kept_progress(request, length, restart)
            restart = request.restart_seconds
            continue
        return done + max(0.0, length - restart), True
    return done, False


def _restart_before(live: LiveRequest, run_index: int) -> tuple[float, float]:
    """(work kept by the runs before ``run_index``, the restart its run begins with)."""
    request = live.request
    done = restart = 0.0
    for run in live.runs[:run_index]:
        if run.ended != PREEMPTED or run.end is None:
            continue
        done += kept_progress(request, run.end - run.start, restart)
        restart = request.restart_seconds
    return done, restart


@without_cyclic_gc
def plan(history: History, settings: Settings | None = None) -> Plan:
    """The scenario, starting state and live run of ``history`` (``settings``: run under
    these instead of the live ones)."""
    since, until = history.since, history.until
    horizon = until - since
    chosen = settings or history.settings
    node_list = list(history.nodes)
    kinds = {p.name: p.kind for p in history.pools}
    requests: list[tuple[tuple[float, str], Request]] = []
    durations: dict[str, float] = {}
    idle_after: dict[str, float] = {}
    adopted: list[Adopted] = []
    queued: list[Queued] = []
    unseen: dict[str, str] = {}
    by_id: dict[str, LiveRequest] = {}
    never = horizon + 1.0
    """Work that cannot end inside the period."""
    team_names = {t.name for t in history.teams}
    placeable: dict[tuple[Any, ...], str | None] = {}
    ending: set[str] = set()
    placeable_on = node_list + [c.node for c in history.inventory]
    for live in history.requests:
        request = live.request
        rid = request.id
        left_out, reason = _left_out(live, kinds, team_names, placeable_on, placeable, since)
        if reason is not None:
            unseen[rid] = reason
        if left_out:
            continue
        work, complete = work_of(live, until)
        total = work if complete else work + never
        relative = replace(request, submit=request.submit - since)
        if live.idle_after is not None:
            idle_after[rid] = live.idle_after
        if ends_on_preempt(live):
            ending.add(rid)
        if request.submit >= since:
            requests.append(((relative.submit, rid), relative))
            durations[rid] = max(total, 1e-9)
            by_id[rid] = live
            continue
        state = _at_start(live, relative, total, since)
        if isinstance(state, Adopted):
            adopted.append(state)
        elif isinstance(state, Queued):
            queued.append(state)
        else:
            continue
        by_id[rid] = live
    adopted, homeless = _with_slices(adopted, node_list)
    for rid in homeless:
        unseen[rid] = "ran at --since on slices its nodes, as they were then, cannot hold"
    scenario = Scenario(
        name=f"replay {history.store}".strip(),
        horizon=horizon,
        settings=chosen,
        pools=history.pools,
        nodes=tuple(node_list),
        teams=history.teams,
        usage=(),
        requests=tuple(r for _, r in sorted(requests, key=itemgetter(0))),
        durations=durations,
        events=_node_events(history, node_list),
        idle_after=idle_after,
    )
    admin = tuple(replace(a, at=a.at - since) for a in history.admin if since <= a.at < until)
    live_run = live_sim_run(scenario, by_id, since, kinds)
    return Plan(
        history,
        scenario,
        tuple(adopted),
        tuple(queued),
        admin,
        live_run,
        unseen,
        by_id,
        frozenset(ending & by_id.keys()),
        tuple(replace(c, at=c.at - since) for c in history.inventory if since <= c.at < until),
    )


def ends_on_preempt(live: LiveRequest) -> bool:
    """Does a preemption end the request rather than queue it again? What the store says
    the live Hub did with it (`LiveRequest.requeued`), else the live Hub's rule: only a
    session that can resume is queued again (spawner/runtime/takedown.py). The simulator
    queues every preempted request again; the replay does as the Hub did (`simulate`)."""
    if live.requeued is not None:
        return not live.requeued
    return not live.request.resumable


def _node_events(history: History, nodes: Sequence[Node]) -> tuple[NodeEvent, ...]:
    """The period's health changes of the scenario's nodes, on its clock."""
    since, until = history.since, history.until
    names = {n.name for n in nodes}
    return tuple(
        NodeEvent(e.at - since, e.node, e.health)
        for e in history.node_events
        if since <= e.at < until and e.node in names
    )


def _left_out(
    live: LiveRequest,
    kinds: Mapping[str, PoolKind],
    team_names: set[str],
    nodes: list[Node],
    known: dict[tuple[Any, ...], str | None],
    since: float,
) -> tuple[bool, str | None]:
    """Is the request left out of the scenario, and (if the report should say so) why:
    its pool or team is gone, no node could hold it, or it left the queue without
    running (before the period: nothing to say)."""
    request = live.request
    if request.pool not in kinds or request.team not in team_names:
        return True, f"its pool {request.pool!r} or team {request.team!r} is gone"
    reason = _unplaceable(request, nodes, known)
    if reason is not None:
        return True, reason
    if live.cancelled is not None and not any(
        r.ended != LAUNCH_FAILED and (r.end is None or r.end > live.cancelled) for r in live.runs
    ):
        if live.cancelled >= since:
            return True, "left the queue without running (the simulator cannot cancel)"
        return True, None
    return False, None


def _unplaceable(
    request: Request, nodes: list[Node], known: dict[tuple[Any, ...], str | None]
) -> str | None:
    """`why_unplaceable`, asked once per request shape (``known`` keeps the answers)."""
    shape: tuple[Any, ...] = (request.pool, request.gpus, request.nodes, request.gpu_milli)
    shape += (request.mig, request.cpus, request.memory_gib, *sorted(request.labels.items()))
    if shape not in known:
        known[shape] = why_unplaceable(request, nodes)
    return known[shape]


def _at_start(
    live: LiveRequest, relative: Request, total: float, since: float
) -> Adopted | Queued | None:
    """A request submitted before ``since``: running then (adopted), waiting then
    (queued), or done by then (None). ``total``: its work; ``relative``: the request on
    the period's clock."""
    ok_runs = [r for r in live.runs if r.ended != LAUNCH_FAILED]
    ended = [r for r in ok_runs if r.end is not None and r.end <= since]
    if ended and ended[-1].ended == FINISHED:
        return None
    current = next(
        (i for i, r in enumerate(live.runs) if r.ended != LAUNCH_FAILED and _covers(r, since)),
        None,
    )
    if current is not None:
        run = live.runs[current]
        done, restart = _restart_before(live, current)
        allocation = Allocation(
            request=relative,
            grants=run.grants,
            start=run.start - since,
            funded=run.funded,
            protected_until=run.protected_until - since,
            charge_rate=run.charge_rate,
        )
        return Adopted(allocation, max(total - done, 0.0), restart, run.allocation_id)
    later = [i for i, r in enumerate(live.runs) if r.ended != LAUNCH_FAILED and r.start >= since]
    done, restart = _restart_before(live, later[0] if later else len(live.runs))
    return Queued(relative, max(total - done, 1e-9), restart)


def _covers(run: LiveRun, at: float) -> bool:
    return run.start < at and (run.end is None or run.end > at)


def _with_slices(adopted: list[Adopted], nodes: Sequence[Node]) -> tuple[list[Adopted], list[str]]:
    """Adopted sessions whose slices the store no longer holds (the allocation ended
    since) get slices on their recorded nodes, as a node's free record would give them;
    also the ids of those that no longer fit there (left out)."""
    free = {n.name: NodeFree(n) for n in nodes}
    out: list[Adopted] = []
    pending: list[Adopted] = []
    homeless: list[str] = []
    for item in adopted:
        grants = item.allocation.grants
        if any(g.node not in free for g in grants):
            homeless.append(item.allocation.id)
        elif all(g.slices or not item.allocation.request.gpu_weight for g in grants):
            for grant in grants:
                free[grant.node].take(grant)
            out.append(item)
        else:
            pending.append(item)
    for item in pending:
        request = item.allocation.request
        placed: list[NodeGrant] = []
        for grant in item.allocation.grants:
            slices = free[grant.node].slices_for(request)
            if slices is None:
                break
            placed.append(NodeGrant(grant.node, slices, grant.cpus, grant.memory_gib))
            free[grant.node].take(placed[-1])
        else:
            allocation = replace(item.allocation, grants=tuple(placed))
            out.append(replace(item, allocation=allocation))
            continue
        for grant in placed:  # a gang that does not fit whole holds nothing
            free[grant.node].give(grant)
        homeless.append(request.id)
    return out, homeless


def live_sim_run(
    scenario: Scenario, live: Mapping[str, LiveRequest], since: float, kinds: Mapping[str, PoolKind]
) -> SimRun:
    """What happened live, recorded as the simulator records a run (times relative)."""
    horizon = scenario.horizon
    records: dict[str, RequestRecord] = {}
    segments: list[Segment] = []
    lost = 0.0
    lost_by_class: dict[str, float] = defaultdict(float)
    for rid, item in live.items():
        request = item.request
        kind = kinds[request.pool]
        rate = request.charge_rate(kind)
        record = RequestRecord(
            rid, request.submit - since, request.klass.value, request.team, request.pool, rate
        )
        restart = 0.0
        for run in item.runs:
            if run.ended == LAUNCH_FAILED:
                continue
            if run.end is not None and run.end <= since:
                if run.ended == PREEMPTED:
                    restart = request.restart_seconds
                continue
            start = run.start - since
            if start >= horizon:
                break
            end = horizon if run.end is None else min(run.end - since, horizon)
            record.starts.append(start)
            record.nodes.append([g.node for g in run.grants])
            record.funded.append(run.funded)
            record.ends.append(end)
            segments.append(
                Segment(
                    request.team, request.pool, max(start, 0.0), end, run.charge_rate, run.funded
                )
            )
            units = 0.0
            if run.ended == PREEMPTED and run.end is not None and run.end - since <= horizon:
                record.preemptions += 1
                elapsed = run.end - run.start
                kept = kept_progress(request, elapsed, restart)
                units = elapsed - kept + request.take_seconds
                restart = request.restart_seconds
            elif run.ended == FINISHED and run.end is not None and run.end - since <= horizon:
                record.finished = True
                record.finish_time = end
                units = restart
            if kind is PoolKind.GPU and units > 0:
                lost += units * run.charge_rate
                lost_by_class[request.klass.value] += units * run.charge_rate
        records[rid] = record
    return SimRun(scenario, records, segments, lost, 0, 0.0, dict(lost_by_class))


# -- the simulated run -------------------------------------------------------------------


_ADMIN_MARK = "\x00admin:"
"""Node name of the simulator events that stand for admin changes (never a real node)."""


_INVENTORY_MARK = "\x00inventory:"
"""Node name of the simulator events that stand for a node's inventory changing."""


class ReplayScheduler(Scheduler):
    """The scheduler with admin changes and node inventory changes at their times: the
    simulator delivers each as a node event on a node named `_ADMIN_MARK` (or
    `_INVENTORY_MARK`) + its index, and this applies it."""

    changes: list[AdminChange]
    pinned: frozenset[str]
    inventory: list[InventoryChange]
    skipped: list[InventoryChange]
    """Inventory changes not made: the simulated run held a device they take away."""

    def set_health(self, node_name: str, health: Health) -> None:
        if node_name.startswith(_INVENTORY_MARK):
            self._new_inventory(self.inventory[int(node_name[len(_INVENTORY_MARK) :])])
            return
        if not node_name.startswith(_ADMIN_MARK):
            super().set_health(node_name, health)
            return
        change = self.changes[int(node_name[len(_ADMIN_MARK) :])]
        values = {k: v for k, v in change.settings.items() if k not in self.pinned}
        settings = self.settings.replace(**values) if values else None
        teams = None
        if change.shares:
            teams = []
            for team in self.teams.teams.values():
                share = dict(team.share)
                for (name, pool), value in change.shares.items():
                    if name == team.name:
                        share[pool] = value
                teams.append(Team(team.name, share, team.parent))
        self.reconfigure(settings=settings, teams=teams)

    def _new_inventory(self, change: InventoryChange) -> None:
        """The node as the Hub found it at a start (a new one comes up ready), the pool's
        capacity and the kept data built again (`Scheduler.reconfigure`). The live Hub
        cannot take away a device a session holds; nor does this (the change is skipped)."""
        node = change.node
        devices = {g.uuid for g in node.gpus} | {m.uuid for g in node.gpus for m in g.mig}
        for allocation in self.running.values():
            for grant in allocation.grants:
                if grant.node == node.name and any(
                    (s.mig_uuid or s.gpu_uuid) not in devices for s in grant.slices
                ):
                    self.skipped.append(change)
                    return
        old = self.nodes.get(node.name)
        health = Health.READY if change.added or old is None else old.health
        self.nodes[node.name] = replace(node, health=health)
        self._node_tuple = tuple(self.nodes.values())
        self._capacity = self._pool_capacity()
        self.reconfigure()


class _AsLive:
    """The simulator's actuator, except that a request the live Hub ended at a preemption
    (`Plan.ends_on_preempt`) is not queued again: the run stops as the simulator stops
    any (its kept progress and lost work counted alike) and the request ends there. A
    wrapper, not a subclass: the compiled core's classes take none."""

    def __init__(self, inner: Any, ends: frozenset[str]) -> None:
        self.inner = inner
        self.ends = ends

    def launch(self, allocation: Allocation) -> None:
        self.inner.launch(allocation)

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        queued = bool(self.inner.preempt(allocation, reason))
        return queued and allocation.id not in self.ends


def simulate(
    plan_: Plan,
    settings: Settings | None = None,
    pinned: Iterable[str] = (),
    observer: CycleObserver | None = None,
) -> SimRun:
    """Run the plan's scenario (under ``settings`` if given; admin changes leave the
    ``pinned`` settings alone) from its starting state, with its admin changes;
    ``observer`` sees every cycle, as `Simulation`'s does."""
    scenario = plan_.scenario if settings is None else replace(plan_.scenario, settings=settings)
    sim = Simulation(scenario, observer)
    if plan_.admin or plan_.inventory:
        replaying = ReplayScheduler(
            scenario.settings,
            scenario.pools,
            scenario.nodes,
            scenario.teams,
            sim.clock,
            SimActuator(sim),
        )
        replaying.changes = list(plan_.admin)
        replaying.pinned = frozenset(pinned)
        sim.scheduler = replaying
        replaying.inventory = list(plan_.inventory)
        replaying.skipped = []
        for index, change in enumerate(plan_.admin):
            mark = NodeEvent(change.at, f"{_ADMIN_MARK}{index}", Health.READY)
            sim.push(change.at, sim_module._NODE, mark)
        for index, new in enumerate(plan_.inventory):
            mark = NodeEvent(new.at, f"{_INVENTORY_MARK}{index}", Health.READY)
            sim.push(new.at, sim_module._NODE, mark)
    scheduler = sim.scheduler
    if plan_.ends_on_preempt:
        scheduler.actuator = _AsLive(scheduler.actuator, plan_.ends_on_preempt)
    _seed_usage(scheduler, plan_)
    kinds = {p.name: p.kind for p in scenario.pools}
    for item in plan_.adopted:
        allocation = item.allocation
        request = allocation.request
        rid = request.id
        scheduler.adopt(allocation)
        record = RequestRecord(
            rid,
            request.submit,
            request.klass.value,
            request.team,
            request.pool,
            request.charge_rate(kinds[request.pool]),
        )
        record.starts.append(allocation.start)
        record.nodes.append(list(allocation.node_names))
        record.funded.append(allocation.funded)
        sim.records[rid] = record
        sim.remaining[rid] = item.work
        sim.restart[rid] = item.restart
        sim.generation[rid] = 1
        sim.run_start[rid] = allocation.start
        idle = scenario.idle_after.get(rid)
        finish = allocation.start + item.restart + item.work
        sim.push(max(finish, 0.0), sim_module._FINISH, (rid, 1))
        if idle is not None and idle < item.work:
            sim.push(max(allocation.start + idle, 0.0), sim_module._IDLE, (rid, 1))
    for queued in plan_.queued:
        request = queued.request
        rid = request.id
        scheduler.submit(request)
        sim.records[rid] = RequestRecord(
            rid,
            request.submit,
            request.klass.value,
            request.team,
            request.pool,
            request.charge_rate(kinds[request.pool]),
        )
        sim.remaining[rid] = queued.work
        sim.restart[rid] = queued.restart
        sim.generation[rid] = 0
    if plan_.adopted or plan_.queued:
        sim.push(0.0, sim_module._WAKE, None)
    return sim.run()


def with_min_runtime(plan_: Plan, seconds: float) -> Plan:
    """The plan with every request that has not started by the period's start asking for
    ``seconds`` of protected minimum runtime (the scheduler caps it as at any submit)."""
    requests = tuple(replace(r, min_runtime=seconds) for r in plan_.scenario.requests)
    queued = tuple(
        replace(q, request=replace(q.request, min_runtime=seconds)) for q in plan_.queued
    )
    return replace(plan_, scenario=replace(plan_.scenario, requests=requests), queued=queued)


def _seed_usage(scheduler: Scheduler, plan_: Plan) -> None:
    """Charges before the period into the ledger, as the live Hub reads them at its start
    (a rate over each record); those of sessions adopted are charged by `adopt`."""
    since = plan_.history.since
    adopted = {a.allocation_id for a in plan_.adopted if a.allocation_id is not None}
    ledger = scheduler.ledger
    for team, pool, start, end, units, allocation_id in plan_.history.usage:
        if allocation_id is not None and allocation_id in adopted:
            continue
        if end > start:
            rate = units / (end - start)
            ledger.start_charging(team, pool, start - since, rate)
            ledger.stop_charging(team, pool, end - since, rate)
        else:
            ledger.add(team, pool, end - since, units)


# -- outcomes and the comparison ---------------------------------------------------------


def metrics_run(run: SimRun) -> SimRun:
    """``run`` as the metrics count it: usage inside the period only."""
    segments = [
        replace(s, start=max(0.0, s.start)) if s.start < 0 else s for s in run.segments if s.end > 0
    ]
    records = {
        rid: r for rid, r in run.records.items() if r.submit >= 0
    }  # the period's own requests; those from before it only hold capacity
    for rid, record in run.records.items():
        if rid not in records:
            copy = RequestRecord(
                record.id, 0.0, record.klass, record.team, record.pool, record.weight
            )
            copy.finished = record.finished
            copy.finish_time = record.finish_time
            copy.preemptions = record.preemptions
            records[rid] = copy
    return replace(run, segments=segments, records=records)


@without_cyclic_gc
def outcome(label: str, run: SimRun, overrides: Mapping[str, Any] | None = None) -> RunOutcome:
    """A run as `budgethub compare` reports it (`evaluation.headline` reads it)."""
    counted = result(metrics_run(run))
    return RunOutcome(
        label,
        run.scenario.settings.name,
        dict(overrides or {}),
        counted["metrics"],
        waits_by_class(counted, run.scenario.horizon),
        round(run.wall_s, 2),
    )


def _summary(values: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": None, "p90": None}
    return {
        "n": len(ordered),
        "p50": round(percentile(ordered, 50), 3),
        "p90": round(percentile(ordered, 90), 3),
    }


def order_agreement(pairs: Sequence[tuple[float, float]]) -> tuple[float | None, int, int]:
    """Of the pairs of requests started in a strict order both live and simulated (times
    rounded to whole seconds), the share in the same order; the pairs counted; the pairs
    tied (same second) on either side. O(n log n): discordant pairs are the inversions
    of the simulated starts taken in live order."""
    points = sorted((round(a), round(b)) for a, b in pairs)
    n = len(points)
    total = n * (n - 1) // 2

    def tied(values: Iterable[object]) -> int:
        return sum(c * (c - 1) // 2 for c in Counter(values).values())

    tie_live = tied(p[0] for p in points)
    tie_sim = tied(p[1] for p in points)
    tie_both = tied(points)
    ranks = {v: i + 1 for i, v in enumerate(sorted({p[1] for p in points}))}
    tree = [0] * (len(ranks) + 1)
    discordant = 0
    for seen, (_, sim) in enumerate(points):
        rank = ranks[sim]
        not_above = 0
        i = rank
        while i > 0:
            not_above += tree[i]
            i -= i & -i
        discordant += seen - not_above
        i = rank
        while i < len(tree):
            tree[i] += 1
            i += i & -i
    counted = total - tie_live - tie_sim + tie_both
    if counted <= 0:
        return None, 0, total - counted
    return (counted - discordant) / counted, counted, total - counted


@without_cyclic_gc
def compare(
    plan_: Plan,
    simulated: SimRun,
    live_out: RunOutcome | None = None,
    simulated_out: RunOutcome | None = None,
) -> dict[str, Any]:
    """Request by request: start order, wait, node, funding, preemptions, and each team's
    delivered GPU-hours; every difference with its causes where known. ``live_out`` and
    ``simulated_out``: the two runs' outcomes (`outcome`) where the caller has them."""
    history = plan_.history
    live = plan_.live
    known = (
        plan_.scenario.settings.cycle_tick,
        [t - history.since for t in history.hub_starts],
        [a.at for a in plan_.admin],
        [e.at for e in plan_.scenario.events],
    )
    rows: list[dict[str, Any]] = []
    causes: Counter[str] = Counter()
    for rid, live_record in sorted(live.records.items()):
        sim_record = simulated.records.get(rid)
        if sim_record is None:
            continue
        row = _row(rid, live_record, sim_record)
        if _differs(row):
            row["causes"] = _causes(plan_.live_requests[rid], live_record, row, *known)
            causes.update(row["causes"])
        rows.append(row)
    if plan_.unseen:
        causes["unseen"] += len(plan_.unseen)
    live_teams = (live_out or outcome("live", live)).metrics["teams"]
    sim_teams = (simulated_out or outcome("replay", simulated)).metrics["teams"]
    comparison = _summary_of(rows) | {
        "preemptions": _preemptions(rows),
        "teams": _team_errors(live_teams, sim_teams),
        "causes": dict(sorted(causes.items())),
        "unseen": dict(plan_.unseen),
    }
    return {"comparison": comparison, "requests": rows}


def _row(rid: str, live_record: RequestRecord, sim_record: RequestRecord) -> dict[str, Any]:
    """One request's two sides; its wait error where it started inside the period on both
    (waits and order leave out the sessions running at the period's start)."""
    live_side, sim_side = _side(live_record), _side(sim_record)
    error = None
    if live_side["start"] is not None and sim_side["start"] is not None:
        if live_side["start"] >= 0 and sim_side["start"] >= 0:
            error = round(sim_side["start"] - live_side["start"], 3)
    return {
        "id": rid,
        "team": live_record.team,
        "class": live_record.klass,
        "submit": round(live_record.submit, 3),
        "live": live_side,
        "simulated": sim_side,
        "wait_error_s": error,
        "causes": [],
    }


def _differs(row: Mapping[str, Any]) -> bool:
    """Do the two sides differ: started or not, preemptions, or (started on both) the
    start by more than a second, the nodes, or the funding."""
    live_side, sim_side = row["live"], row["simulated"]
    if live_side["preemptions"] != sim_side["preemptions"]:
        return True
    if (live_side["start"] is None) != (sim_side["start"] is None):
        return True
    if row["wait_error_s"] is None:
        return False
    return bool(
        abs(row["wait_error_s"]) > 1.0
        or live_side["nodes"] != sim_side["nodes"]
        or live_side["funded"] != sim_side["funded"]
    )


def _summary_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Order, wait error, node and funding over the requests started on both sides."""
    both = [r for r in rows if r["wait_error_s"] is not None]
    errors = [r["wait_error_s"] for r in both]
    agreement, pairs, ties = order_agreement(
        [(r["live"]["start"], r["simulated"]["start"]) for r in both]
    )

    def share(key: str) -> float | None:
        same = sum(r["live"][key] == r["simulated"][key] for r in both)
        return round(same / len(both), 4) if both else None

    return {
        "requests": len(rows),
        "started_both": len(both),
        "order_pairs": pairs,
        "order_ties": ties,
        "order_agreement": None if agreement is None else round(agreement, 4),
        "wait_error_s": _summary(errors),
        "wait_abs_error_s": _summary([abs(e) for e in errors]),
        "same_node": share("nodes"),
        "same_funding": share("funded"),
    }


def _preemptions(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    only_live = [
        r["id"] for r in rows if r["live"]["preemptions"] and not r["simulated"]["preemptions"]
    ]
    only_sim = [
        r["id"] for r in rows if r["simulated"]["preemptions"] and not r["live"]["preemptions"]
    ]
    return {
        "live": sum(r["live"]["preemptions"] for r in rows),
        "simulated": sum(r["simulated"]["preemptions"] for r in rows),
        "same_set": not only_live and not only_sim,
        "only_live": only_live,
        "only_simulated": only_sim,
    }


def _team_errors(
    live_teams: Mapping[str, Any], sim_teams: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """Each team's delivered GPU-hours on both sides and the simulated one's error."""
    teams = {}
    for name, figures in live_teams.items():
        live_h = figures["delivered_gpu_h"]
        sim_h = sim_teams.get(name, {}).get("delivered_gpu_h", 0.0)
        teams[name] = {
            "live_gpu_h": live_h,
            "simulated_gpu_h": sim_h,
            "error": None if not live_h else round((sim_h - live_h) / live_h, 4),
        }
    return teams


def _side(record: RequestRecord) -> dict[str, Any]:
    start = record.starts[0] if record.starts else None
    return {
        "start": None if start is None else round(start, 3),
        "wait": None if start is None else round(start - record.submit, 3),
        "nodes": record.nodes[0] if record.nodes else [],
        "funded": record.funded[0] if record.funded else None,
        "preemptions": record.preemptions,
        "end": round(record.finish_time, 3) if record.finish_time is not None else None,
    }


def _causes(
    item: LiveRequest,
    record: RequestRecord,
    row: dict[str, Any],
    tick: float,
    restarts: Sequence[float],
    admin_times: Sequence[float],
    node_times: Sequence[float],
) -> list[str]:
    """The known causes of one request's difference (`CAUSES`)."""
    submit = record.submit
    end = row["live"]["start"]
    if end is None:
        end = math.inf
    found: list[str] = []
    if any(r.ended == LAUNCH_FAILED for r in item.runs):
        found.append("launch-failed")
    if any(submit <= t <= end for t in restarts):
        found.append("hub-restart")
    if any(submit <= t <= end for t in admin_times):
        found.append("admin-change")
    if any(submit <= t <= end for t in node_times):
        found.append("node-event")
    error = row["wait_error_s"]
    if error is not None and not found:
        if item.latency is not None and abs(error) <= item.latency + tick:
            found.append("spawn-latency")
        elif abs(error) <= tick:
            found.append("cycle-tick")
    if not found:
        found.append("knock-on")
    return found


@without_cyclic_gc
def forecast_accuracy(plan_: Plan) -> dict[str, Any] | None:
    """The forecast each request was given at submit against what happened: start error
    (actual first start - forecast start) and how often the funding forecast held."""
    errors: list[float] = []
    funding = agree = 0
    seen = False
    since = plan_.history.since
    for rid, item in plan_.live_requests.items():
        if item.forecast_time is None:
            continue
        seen = True
        record = plan_.live.records[rid]
        if not record.starts or record.submit < 0:
            continue
        if item.forecast_start is not None:
            errors.append(record.starts[0] - (item.forecast_start - since))
        if item.forecast_funded is not None and record.funded:
            funding += 1
            agree += item.forecast_funded == record.funded[0]
    if not seen:
        return None
    return {
        "n": len(errors),
        "start_error_s": _summary(errors),
        "start_abs_error_s": _summary([abs(e) for e in errors]),
        "funding_n": funding,
        "funding_agreement": round(agree / funding, 4) if funding else None,
    }


def outcome_row(
    label: str,
    run: SimRun | RunOutcome,
    written: Mapping[str, str] | None = None,
    parsed: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One entry of the report's ``outcomes``: the headline of a run (or of its outcome)."""
    counted = run if isinstance(run, RunOutcome) else outcome(label, run, parsed)
    return {
        "label": label,
        "policy": counted.policy,
        "set": {k: (v.value if hasattr(v, "value") else v) for k, v in (parsed or {}).items()},
        "written": dict(written or {}),
        "headline": headline(counted),
    }
