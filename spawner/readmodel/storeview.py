"""The queue/budget read model computed from the store, for the budget service.

The service runs in its own process, so it cannot read the Hub's core. It builds a
read-only `Scheduler` from what the store holds (pools, nodes, teams, running
allocations, the queue, the charged usage) and asks the same `QueueView` the spawn
page asks, so positions, funding, estimates and ratios agree with the queue
messages. Funding is what the policy would decide now (`decide`, pure, never
applied). A `StoreModel` keeps the result until the store changes (one small query,
asked on every read, tells) or ``ttl`` passes (ratios drift with time); a read after a
change waits for the model built again, up to `WAIT` seconds (then it gets the previous
one, and the page says how old it is and reloads itself).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select

from scheduler_core.forecast import History, probes
from scheduler_core.metrics import HourlySeries
from scheduler_core.model import (
    Allocation,
    Health,
    Node,
    PoolKind,
    Request,
    SliceKind,
    mig_weight,
)
from scheduler_core.ranking import PoolRanking
from scheduler_core.scheduler import Scheduler, WallClock
from scheduler_core.settings import SETTING_NAMES, Settings, settings_from_mapping
from scheduler_core.store import SnapshotRecord, Store
from scheduler_core.store.admin import AdminStore, AuditEntry, SchedulerStatus
from scheduler_core.store.models import (
    AllocationRow,
    AuditRow,
    EventRow,
    NodeRow,
    RequestRow,
    SchedulerStatusRow,
    SnapshotRow,
    UsageRow,
)
from scheduler_core.store.records import WAITING_STATES
from scheduler_core.view import Decisions
from spawner import admin
from spawner.readmodel.status import (
    QueueStatus,
    QueueView,
    TeamStatus,
    plural,
    unallocated_why,
    usage_ledger,
)

DAY = 86400.0
HOUR = 3600.0
CHECK_EVERY = 0.05
"""Seconds a state is served without asking the store again whether it changed (only
collapses the checks of requests that come together; every later read asks)."""
WAIT = 0.9
"""Seconds a read waits for the model built again after a change; past it, the read gets
the previous model, marked stale."""
HISTORY_DAYS = 30
"""Owed and delivered are shown per day over this many days."""


class _ReadOnly:
    """The actuator of a core that never runs a cycle."""

    def launch(self, allocation: Allocation) -> None:
        raise RuntimeError("the store's read model never admits")

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        raise RuntimeError("the store's read model never preempts")


@dataclass(frozen=True, slots=True)
class TeamPool:
    """One team in one pool: what it holds against its share, what it used, where it ranks."""

    status: TeamStatus
    """What its sessions hold in the pool now, against its share (the read model's)."""
    share: float
    """Fraction of the pool (the hierarchy applied)."""
    used_units: float
    """Charged over the lookback window, unit-seconds (running sessions included)."""
    budget_units: float
    """The share in units (``status.share``) × window: what the team may use over it."""
    ratio: float
    """Occupancy ratio (the one that decides funding: the team's own level)."""
    rank: int
    """1: the team that goes first in the pool (the lowest rank key: the window's ratio
    and, by ``day_rank_weight``, the last day's; `ranking.PoolRanking.key`)."""
    pending: int
    would_fund: bool
    """Would a session of one unit, started now, be funded?"""
    protected_s: float
    why: str
    """Why it would run unallocated ("" when funded): `status.unallocated_why`."""
    daily: tuple[tuple[float, float, float], ...] = ()
    """(day start, owed, delivered) in unit-seconds, oldest first."""

    @property
    def used_fraction(self) -> float | None:
        return self.used_units / self.budget_units if self.budget_units > 0 else None


@dataclass(frozen=True, slots=True)
class Waiting:
    """A request in the queue, in policy order, with its status (the spawn page's own)."""

    request: Request
    status: QueueStatus
    held_nodes: tuple[str, ...] = ()

    @property
    def why(self) -> str:
        """Why it waits: its verdict's codes in their words (`QueueStatus.why`)."""
        return self.status.why


@dataclass(frozen=True, slots=True)
class NodeView:
    node: Node
    unit: str
    capacity: float
    used: float
    slices: tuple[tuple[str, str, str], ...]
    """(device, kind, held by request id or "") per slice of each GPU."""
    held_for: str | None
    """The request the node is held for (starvation reservation), if any."""
    virtual: bool
    sessions: tuple[str, ...]
    cpus_used: float = 0.0
    """CPUs the sessions on the node were granted (GPU nodes too: the form counts them)."""
    memory_used_gib: float = 0.0
    """Memory the sessions on the node were granted, GiB."""


@dataclass
class State:
    """Everything the pages, the API and /metrics show, as of ``now``."""

    now: float
    settings: Settings
    core: Scheduler
    teams: dict[tuple[str, str], TeamPool]
    queue: list[Waiting]
    nodes: list[NodeView]
    running: list[Allocation]
    status: SchedulerStatus | None
    audit: list[AuditEntry]
    overrides: dict[str, Any]
    waits: list[tuple[str, float]]
    """(class, seconds waited) of admissions within the history, for the histogram."""
    preemptions: dict[str, int]
    """Preemptions by reason (kind of victim), from the event log."""
    snapshots: list[SnapshotRecord] = field(default_factory=list)
    view: QueueView | None = None
    order: dict[str, list[str]] = field(default_factory=dict)
    """Per pool, the waiting requests in policy order."""
    memo: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    """Answers worked out from this state (rendered pages and JSON), by route and viewer."""
    history: History = field(default_factory=History)
    """Past sessions' lengths per profile: what estimates rest on."""
    _estimating: threading.Lock = field(default_factory=threading.Lock)

    def estimate(self, request_id: str) -> float | None:
        """The request's estimated start: the spawn page's own forecast, the scheduler run
        forward from this state (`QueueView.estimate`: one run per state, only as far as
        the requests asked for need; None: that run does not start it)."""
        if self.view is None or request_id not in self.core.pending:
            return None
        with self._estimating:
            return self.view.estimate(request_id)

    def unit(self, pool: str) -> str:
        return "CPU" if self.core.pools[pool].kind is PoolKind.CPU else "GPU"

    @property
    def pools(self) -> list[str]:
        return sorted(self.core.pools)

    @property
    def team_names(self) -> list[str]:
        return sorted(self.core.teams.teams)


def units_of(allocation: Allocation, kind: PoolKind) -> float:
    return allocation.charge_rate if allocation.funded else allocation.request.charge_rate(kind)


def slices_text(allocation: Allocation) -> str:
    """ "2 × GPU", "MIG 1g.10gb", "0.25 GPU" or "4 CPU"."""
    parts = []
    for grant in allocation.grants:
        whole = sum(1 for s in grant.slices if s.kind is SliceKind.WHOLE)
        if whole:
            parts.append(f"{whole} GPU" if whole == 1 else f"{whole} × GPU")
        for s in grant.slices:
            if s.kind is SliceKind.MIG:
                parts.append(f"MIG {s.mig_profile}")
            elif s.kind is SliceKind.FRACTION:
                parts.append(f"{s.milli / 1000:g} GPU")
    if not parts:
        parts.append(plural(allocation.request.cpus, "CPU"))
    return ", ".join(parts)


def preemption_reason(payload: Mapping[str, Any]) -> str:
    """The kind of a preemption for the ``reason`` label (few values, as Kueue's)."""
    text = str(payload.get("reason", "")).lower()
    if "down" in text or "unreachable" in text or "health" in text:
        return "node-down"
    if "drain" in text:
        return "drain"
    if "unallocated" in text:
        return "unallocated-victim"
    if "funded" in text or "protect" in text:
        return "funded-victim"
    if "debug" in text:
        return "debug-victim"
    if "slice" in text:
        return "time-slice"
    return "other"


class StoreModel:
    """The read model over a store, built again as soon as the store changes.

    Every read asks the store, with one small query (`version`), whether anything the
    model shows changed (a request cancelled, an admin change, a preemption's event...),
    and whether the model is older than ``ttl`` (ratios drift with time). If so the
    model is built again in a worker thread (one build at a time; reads that come
    together share it) and the read waits for it: `state` for as long as it takes,
    `current` up to ``wait`` seconds, after which it gets the previous model marked
    stale (the pages then say how old it is and reload themselves).
    """

    def __init__(self, store: Store, *, ttl: float = 5.0, wait: float = WAIT) -> None:
        self.store = store
        self.admin = AdminStore(store)
        self.ttl = ttl
        self.wait = wait
        self._lock = threading.Lock()
        self._state: State | None = None
        self._version: tuple[Any, ...] | None = None
        self._built = 0.0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="budget-model")
        self._building: Future[State] | None = None
        self._building_version: tuple[Any, ...] | None = None
        self._checked = 0.0

    def version(self) -> tuple[Any, ...]:
        """Changes whenever anything the model shows changes in the store."""
        with self.store.engine.connect() as connection:
            row = connection.execute(
                select(
                    select(func.max(EventRow.id)).scalar_subquery(),
                    select(func.max(AllocationRow.id)).scalar_subquery(),
                    select(func.count(AllocationRow.id))
                    .where(AllocationRow.end_time.is_(None))
                    .scalar_subquery(),
                    select(func.count(RequestRow.id)).scalar_subquery(),
                    select(func.count(RequestRow.id))
                    .where(RequestRow.state.in_(WAITING_STATES))
                    .scalar_subquery(),
                    select(func.max(UsageRow.id)).scalar_subquery(),
                    select(func.max(AuditRow.id)).scalar_subquery(),
                    select(func.max(SnapshotRow.id)).scalar_subquery(),
                    select(func.count(SnapshotRow.id)).scalar_subquery(),
                    select(func.count(NodeRow.name))
                    .where(NodeRow.health != Health.READY)
                    .scalar_subquery(),
                    select(func.max(SchedulerStatusRow.applied_audit_id)).scalar_subquery(),
                )
            ).one()
        return tuple(row)

    def _build(self, version: tuple[Any, ...]) -> State:
        try:
            state = build_state(self.store, self.admin, time.time())
        except BaseException:
            with self._lock:
                if self._building_version == version:
                    self._building = None
            raise
        with self._lock:
            self._state, self._version, self._built = state, version, time.time()
            if self._building_version == version:
                self._building = None
        return state

    def _refresh(self, fresh: bool) -> tuple[State | None, Future[State] | None]:
        """The model if it is up to date, else the previous one (or None) and the build
        that brings it up to date."""
        now = time.time()
        with self._lock:
            current = self._state
            if current is not None and not fresh and now - self._checked < CHECK_EVERY:
                return current, None
        version = self.version()
        with self._lock:
            self._checked = time.time()
            current = self._state
            if (
                current is not None
                and version == self._version
                and time.time() - self._built < self.ttl
            ):
                return current, None
            if self._building is None or self._building_version != version:
                # The store moved on since the build under way began: one more after it.
                self._building = self._pool.submit(self._build, version)
                self._building_version = version
            return current, self._building

    def state(self, *, fresh: bool = False) -> State:
        """The model as the store is now (waits for a build if the store changed)."""
        current, building = self._refresh(fresh)
        if building is None:
            assert current is not None
            return current
        return building.result()

    async def current(self, *, fresh: bool = False) -> tuple[State, bool]:
        """As `state`, without blocking the event loop: the model and whether it is stale
        (the build after a change took longer than ``wait``; never for ``fresh``)."""
        current, building = self._refresh(fresh)
        if building is None:
            assert current is not None
            return current, False
        waiting = asyncio.wrap_future(building)
        if current is None or fresh:
            return await waiting, False
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), self.wait), False
        except TimeoutError:
            return current, True

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def effective_settings(status: SchedulerStatus | None, overrides: Mapping[str, Any]) -> Settings:
    values = {}
    if status is not None:
        values = {k: v for k, v in status.settings.items() if k in SETTING_NAMES or k == "name"}
    try:
        settings = settings_from_mapping(values)
    except ValueError:
        settings = Settings()
    changes = {}
    for key in admin.LIMITS:
        if key in overrides:
            try:
                changes[key] = admin.check_setting(key, overrides[key])
            except admin.AdminError:
                pass
    return settings.replace(**changes)


def _demand(
    store: Store, core: Scheduler, day0: float, now: float
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]]]:
    """Per (team, pool), hour by hour from ``day0``: the units the team asked for (every
    request from its submit until it ended, running or waiting), and the units its
    unallocated sessions ran. Owed is the share, or what was asked if less, hour by hour
    (the simulator's daily fulfilment): a team is not owed GPUs it never asked for."""
    hours = _hours(day0, now)
    asked: dict[tuple[str, str], HourlySeries] = {}
    unallocated: dict[tuple[str, str], HourlySeries] = {}

    def add(
        table: dict[tuple[str, str], HourlySeries],
        key: tuple[str, str],
        a: float,
        b: float,
        rate: float,
    ) -> None:
        series = table.get(key)
        if series is None:
            series = table[key] = HourlySeries(hours)
        series.add(max(a, day0) - day0, min(b, now) - day0, rate)

    spans: dict[str, list[Any]] = {}
    query = (
        select(
            RequestRow.id,
            RequestRow.team,
            RequestRow.pool,
            RequestRow.submit,
            RequestRow.gpus,
            RequestRow.nodes,
            RequestRow.gpu_milli,
            RequestRow.mig,
            RequestRow.cpus,
            AllocationRow.start_time,
            AllocationRow.end_time,
            AllocationRow.funded,
        )
        .join(AllocationRow, AllocationRow.request_id == RequestRow.id)
        .where((AllocationRow.end_time.is_(None)) | (AllocationRow.end_time > day0))
    )
    with store.engine.connect() as connection:
        for row in connection.execute(query):
            rid, team, pool, submit, gpus, nodes, milli, mig, cpus, begin, end, funded = row
            if pool not in core.pools:
                continue
            # What the request holds, whether it is charged or not (unallocated sessions
            # are not, so the allocation's charge rate would say 0).
            shape = Request(rid, "", team, pool, submit, gpus, nodes, milli, mig, cpus)
            rate = shape.charge_rate(core.pools[pool].kind)
            end = now if end is None else end
            if not funded:
                add(unallocated, (team, pool), begin, end, rate)
            span = spans.setdefault(rid, [team, pool, submit, end, rate])
            span[3] = max(span[3], end)
    for rid, (team, pool, submit, end, rate) in spans.items():
        if rid in core.pending or rid in core.running:
            end = now
        add(asked, (team, pool), submit, end, rate)
    for rid, request in core.pending.items():
        if rid not in spans:
            rate = request.charge_rate(core.pools[request.pool].kind)
            add(asked, (request.team, request.pool), request.submit, now, rate)
    return (
        {key: series.values() for key, series in asked.items()},
        {key: series.values() for key, series in unallocated.items()},
    )


def _hours(day0: float, now: float) -> int:
    return max(1, math.ceil((now - day0) / HOUR))


def _sum_hours(series: Iterable[list[float] | None], hours: int) -> list[float]:
    found = [s for s in series if s is not None]
    if not found:
        return [0.0] * hours
    return [sum(values) for values in zip(*found, strict=True)]


def build_state(store: Store, admin_store: AdminStore, now: float) -> State:
    """Read the store and work out every figure (see the module docstring)."""
    overrides = admin_store.overrides()
    statuses = admin_store.statuses()
    status = max(statuses, key=lambda s: s.updated) if statuses else None
    settings = effective_settings(status, overrides)
    core = _core(store, settings, overrides, now)
    view = QueueView(core, store, lambda: now)
    decisions = view.dry_run()  # the next cycle, run dry: order, funding, holds
    # What the live core keeps of a cycle, without its admissions or preemptions:
    # the funding of each waiting request and the holds (public `apply`, nothing run).
    core.apply(Decisions(reservations=decisions.reservations, funded=decisions.funded), now)
    holds = dict(core.reservations)
    held_by = {n: r for r, ns in holds.items() for n in ns}
    pending = core.pending
    queue = [  # pool by pool, each in the dry run's order
        Waiting(pending[r], found, tuple(holds.get(r, ())))
        for r, found in sorted(view.statuses().items(), key=lambda item: pending[item[0]].pool)
    ]
    return State(
        now=now,
        settings=settings,
        core=core,
        teams=_team_pools(store, core, view, now),
        queue=queue,
        nodes=[node_view(core, node, held_by) for node in core.nodes.values()],
        running=sorted(core.running.values(), key=lambda a: (a.start, a.id)),
        status=status,
        audit=admin_store.audit(),
        overrides=overrides,
        waits=_waits(store, now),
        preemptions=_preemptions(store),
        snapshots=store.list_snapshots(),
        view=view,
        order={
            pool: [w.request.id for w in queue if w.request.pool == pool] for pool in core.pools
        },
        history=view.history(),
    )


def _core(store: Store, settings: Settings, overrides: Mapping[str, Any], now: float) -> Scheduler:
    """A read-only core holding what the store holds: pools, nodes, teams (an admin's
    changes merged in), the charged usage, running sessions and the queue."""
    pools = store.load_pools()
    nodes = store.load_nodes()
    # What an admin changed shows at once (the scheduler takes it in at its next cycle).
    merged = admin.effective(
        store.load_teams(),
        settings,
        {p.name: p for p in pools},
        [n.name for n in nodes],
        overrides,
    )
    ledger = usage_ledger(store, now - max(settings.lookback, HISTORY_DAYS * DAY))
    teams = list(merged.teams)
    core = Scheduler(settings, pools, nodes, teams, WallClock(), _ReadOnly(), ledger)
    known_teams = set(core.teams.teams)
    for allocation in store.active_allocations():
        if allocation.pool in core.pools and allocation.team in known_teams:
            core.adopt(allocation)
    for request in store.pending_requests():
        if request.pool in core.pools and request.team in known_teams:
            if request.id not in core.running:
                core.submit(request)
    return core


def _team_pools(
    store: Store, core: Scheduler, view: QueueView, now: float
) -> dict[tuple[str, str], TeamPool]:
    """Every team in every pool: its holdings (`QueueView.team_status`), usage, rank, what
    a session of one unit asked for now would get, and owed and delivered per day."""
    settings = core.settings
    cluster = core.view(now)
    day0 = (now // DAY) * DAY - (HISTORY_DAYS - 1) * DAY
    demand = _demand(store, core, day0, now)
    probe_runtime = settings.capped_min_runtime(None, "interactive")
    found: dict[tuple[str, str], TeamPool] = {}
    for pool_name in core.pools:
        ranking = PoolRanking(cluster, pool_name, now)
        ratios = {t: ranking.ratio(t) for t in core.teams.teams}
        # The scheduler's order: the rank key (the window's ratio and, by
        # day_rank_weight, the last day's), not the funding ratio shown beside it.
        order = sorted(ratios, key=lambda t: (ranking.key(t), t))
        probed = probes(cluster, now, pool_name, core.teams.teams, probe_runtime)
        for team in core.teams.teams:
            status = view.team_status(team, pool_name)
            probe = probed[team]  # a session of one unit asked for now: the policy's answer
            found[(team, pool_name)] = TeamPool(
                status=status,
                share=core.teams.share(team, pool_name),
                used_units=core.ledger.charged(team, pool_name, now - settings.lookback, now),
                budget_units=status.share * settings.lookback,
                ratio=ratios[team],
                rank=order.index(team) + 1,
                pending=sum(
                    1 for r in core.pending.values() if r.team == team and r.pool == pool_name
                ),
                would_fund=probe.funded,
                protected_s=probe.protected_s,
                why="" if probe.funded else unallocated_why(status, probe.ground),
                daily=_daily(core, demand, team, pool_name, day0, now),
            )
    return found


def _daily(
    core: Scheduler,
    demand: tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]]],
    team: str,
    pool: str,
    day0: float,
    now: float,
) -> tuple[tuple[float, float, float], ...]:
    """(day start, owed, delivered) of the team and its sub-teams in the pool, per day
    from ``day0``: owed hour by hour is the share, or what was asked if less (`_demand`)."""
    asked, unallocated_use = demand
    members = core.teams.subtree(team)
    share_units = core.teams.share(team, pool) * core.capacity[pool]
    n = _hours(day0, now)
    wanted = _sum_hours((asked.get((m, pool)) for m in members), n)
    ran_unallocated = _sum_hours((unallocated_use.get((m, pool)) for m in members), n)
    daily = []
    for d in range(HISTORY_DAYS):
        lo = day0 + d * DAY
        hi = min(lo + DAY, now)
        if hi <= lo:
            daily.append((lo, 0.0, 0.0))
            continue
        hours = range(d * 24, min((d + 1) * 24, len(wanted)))
        owed = sum(min(share_units * HOUR, wanted[h]) for h in hours)
        ran = sum(core.ledger.charged(m, pool, lo, hi) for m in members) + sum(
            ran_unallocated[h] for h in hours
        )
        daily.append((lo, owed, min(ran, owed)))
    return tuple(daily)


def _waits(store: Store, now: float) -> list[tuple[str, float]]:
    """(class, seconds waited) of the sessions admitted within the history."""
    with store.engine.connect() as connection:
        rows = connection.execute(
            select(RequestRow.klass, AllocationRow.start_time - RequestRow.submit)
            .join(RequestRow, AllocationRow.request_id == RequestRow.id)
            .where(AllocationRow.start_time >= now - HISTORY_DAYS * DAY)
        ).all()
    return [(str(getattr(k, "value", k)), max(0.0, float(w))) for k, w in rows]


def _preemptions(store: Store) -> dict[str, int]:
    """Preemptions by reason (`preemption_reason`), from the event log."""
    found: dict[str, int] = {}
    for event in store.list_events(kind="preempt"):
        reason = preemption_reason(event.payload)
        found[reason] = found.get(reason, 0) + 1
    return found


def node_view(core: Scheduler, node: Node, held_by: Mapping[str, str]) -> NodeView:
    """Slices used and free on one node, who holds each, and any hold on it."""
    kind = core.pools[node.pool].kind
    holders: dict[str, list[str]] = {}
    used = cpus_used = memory_used = 0.0
    sessions = []
    for allocation in core.running.values():
        for grant in allocation.grants:
            if grant.node != node.name:
                continue
            sessions.append(allocation.id)
            cpus_used += grant.cpus
            memory_used += grant.memory_gib
            if kind is PoolKind.CPU:
                used += grant.cpus
            for s in grant.slices:
                device = s.mig_uuid if s.kind is SliceKind.MIG and s.mig_uuid else s.gpu_uuid
                holders.setdefault(device, []).append(allocation.id)
                if kind is PoolKind.GPU:
                    if s.kind is SliceKind.MIG:
                        used += mig_weight(s.mig_profile) if s.mig_profile else 0.0
                    elif s.kind is SliceKind.FRACTION:
                        used += s.milli / 1000
                    else:
                        used += 1.0
    rows: list[tuple[str, str, str]] = []
    for gpu in node.gpus:
        if gpu.mig:
            for mig in gpu.mig:
                on_mig = ", ".join(holders.get(mig.uuid, []))
                rows.append((f"GPU {gpu.index} · {mig.profile}", "MIG", on_mig))
        else:
            held = holders.get(gpu.uuid, [])
            shared = any(
                s.kind is SliceKind.FRACTION
                for a in core.running.values()
                if a.id in held
                for g in a.grants
                for s in g.slices
                if s.gpu_uuid == gpu.uuid
            )
            rows.append((f"GPU {gpu.index}", "fraction" if shared else "whole", ", ".join(held)))
    capacity = node.gpu_capacity if kind is PoolKind.GPU else node.cpus
    return NodeView(
        node=node,
        unit="CPU" if kind is PoolKind.CPU else "GPU",
        capacity=capacity,
        used=min(used, capacity),
        slices=tuple(rows),
        held_for=held_by.get(node.name),
        virtual=any(g.virtual for g in node.gpus),
        sessions=tuple(sessions),
        cpus_used=min(cpus_used, node.cpus),
        memory_used_gib=min(memory_used, node.memory_gib),
    )
