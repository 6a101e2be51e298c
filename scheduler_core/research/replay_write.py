"""A simulated run written into a store as the live Hub would have recorded it.

For the replay's round trip (a scenario simulated, written, replayed: the same
outcome) and its benchmark (a 30-day, 1,024-GPU history to read). What is written is
what the Hub writes as sessions come and go (scheduler_core/store, spawner/hub):
requests with their spec, allocations and their grants (booked slices only for those
still running), funded usage, node inventories (``node-inventory``), and the event
log's ``hub-start``, ``submit``, ``granted``, ``preempt``, ``session-ended``, ``node``
and ``activity`` entries. All in one
transaction of bulk inserts: a month has tens of thousands of requests, and the Store's
one-transaction-per-call methods would take minutes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert

from scheduler_core.model import Allocation, Request
from scheduler_core.scenario import Scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import SimRun, Simulation
from scheduler_core.store import Store
from scheduler_core.store.admin import AdminStore, SchedulerStatus
from scheduler_core.store.mapping import node_slices, request_row, request_spec
from scheduler_core.store.models import (
    AllocationGrantRow,
    AllocationRow,
    BookedSliceRow,
    EventRow,
    RequestRow,
    UsageRow,
)
from scheduler_core.store.records import RequestState
from scheduler_core.view import Decisions

HUB_START = "hub-start"
"""The event the live Hub appends at each start: its settings, shares and node health."""


def settings_json(settings: Any) -> dict[str, Any]:
    """Settings as the Hub reports them (enums by value)."""
    return {
        key: value.value if hasattr(value, "value") else value
        for key, value in dataclasses.asdict(settings).items()
    }


@dataclass
class Recorded:
    """A simulated run with what the store needs beyond `SimRun`: every allocation made,
    in order, and each preemption (request id, time)."""

    run: SimRun
    allocations: list[Allocation] = field(default_factory=list)
    preempted: set[tuple[str, float]] = field(default_factory=set)


def simulate_recorded(scenario: Scenario) -> Recorded:
    """Simulate ``scenario`` and keep its allocations and preemptions."""
    made: list[Allocation] = []
    preempted: set[tuple[str, float]] = set()

    def observe(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
        for stop in decisions.preemptions:
            preempted.add((stop.allocation_id, now))
        for admission in decisions.admissions:
            allocation = scheduler.running.get(admission.request.id)
            if allocation is not None and allocation.start == now:
                made.append(allocation)

    run = Simulation(scenario, observe).run()
    return Recorded(run, made, preempted)


def write_run(store: Store, recorded: Recorded, base: float, hub: str = "hub") -> None:
    """Write a recorded run into ``store`` as having run live from epoch second ``base``;
    the store is migrated and empty."""
    scenario = recorded.run.scenario
    settings = settings_json(scenario.settings)
    store.save_pools(scenario.pools)
    store.save_teams(scenario.teams)
    store.save_nodes(list(scenario.nodes), at=base)  # as a Hub's start records them
    status = SchedulerStatus(hub, base + scenario.horizon, 0, 0.0, (), settings, 0)
    AdminStore(store).report(status)
    rows = _Rows(base)
    rows.start(scenario, settings)
    by_request: dict[str, list[Allocation]] = {}
    for allocation in recorded.allocations:
        by_request.setdefault(allocation.id, []).append(allocation)
    for request in scenario.requests:
        if request.submit <= scenario.horizon:
            rows.request(recorded, request, by_request.get(request.id, []))
    with store._write() as session:  # one transaction: the whole history at once
        for table, values in (
            (RequestRow, rows.requests),
            (AllocationRow, rows.allocations),
            (AllocationGrantRow, rows.grants),
            (BookedSliceRow, rows.slices),
            (UsageRow, rows.usage),
            (EventRow, sorted(rows.events, key=lambda e: e["time"])),
        ):
            if values:
                session.execute(insert(table), values)


@dataclass
class _Rows:
    """The rows of each table a run leaves, as the Hub would have written them."""

    base: float
    requests: list[dict[str, Any]] = field(default_factory=list)
    allocations: list[dict[str, Any]] = field(default_factory=list)
    grants: list[dict[str, Any]] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)
    usage: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def event(self, at: float, kind: str, payload: dict[str, Any]) -> None:
        self.events.append({"time": self.base + at, "kind": kind, "payload": payload})

    def start(self, scenario: Scenario, settings: dict[str, Any]) -> None:
        """The Hub's start, the node changes, and the usage from before the store's first
        session (charged at once, as `Store.add_usage` records it)."""
        teams = {t.name: dict(t.share) for t in scenario.teams}
        nodes = {n.name: n.health.value for n in scenario.nodes}
        self.event(0.0, HUB_START, {"settings": settings, "teams": teams, "nodes": nodes})
        for change in scenario.events:
            self.event(change.at, "node", {"node": change.node, "state": change.health.value})
        for seeded in scenario.usage:
            at = self.base + seeded.at
            self.usage.append(_usage(seeded.team, seeded.pool, at, at, seeded.units, None))

    def request(self, recorded: Recorded, request: Request, made: list[Allocation]) -> None:
        """One request, its allocations (each ending as the run says) and its events."""
        record = recorded.run.records[request.id]
        horizon = recorded.run.scenario.horizon
        idle = recorded.run.scenario.idle_after.get(request.id)
        self.event(
            request.submit, "submit", {"request": request.id, "options": {}, "team": request.team}
        )
        ending: list[str] = []
        for i, allocation in enumerate(made):
            end = record.ends[i] if i < len(record.ends) else horizon
            finished = record.finished and i == len(made) - 1
            preempted = not finished and (request.id, end) in recorded.preempted
            ending.append("finished" if finished else "preempted" if preempted else "running")
            self.allocation(allocation, None if ending[-1] == "running" else end)
            devices = {g.node: [s.device_id for s in g.slices] for g in allocation.grants}
            self.event(
                allocation.start,
                "granted",
                {"request": request.id, "funded": allocation.funded, "devices": devices},
            )
            if idle is not None and allocation.start + idle < end:
                at = allocation.start + idle
                idle_since = self.base + at
                self.event(
                    at, "activity", {"request": request.id, "busy": False, "idle_since": idle_since}
                )
            if ending[-1] != "running":
                self.events.append(_ending(request.id, self.base + end, preempted, allocation))
        spec = request_spec(request) | {
            "submit": self.base + request.submit,
            "checkpoint_every": request.checkpoint_every,
            "restart_cost": request.restart_cost,
        }
        self.requests.append(_request_row(request, self.base, _state(ending), spec))

    def allocation(self, allocation: Allocation, end: float | None) -> None:
        """An allocation ending at ``end`` (None: still running, its slices booked)."""
        number = len(self.allocations) + 1
        base = self.base
        self.allocations.append(
            {
                "id": number,
                "request_id": allocation.id,
                "start_time": base + allocation.start,
                "end_time": None if end is None else base + end,
                "funded": allocation.funded,
                "protected_until": base + allocation.protected_until,
                "charge_rate": allocation.charge_rate,
            }
        )
        for position, grant in enumerate(allocation.grants):
            self.grants.append(
                {
                    "allocation_id": number,
                    "position": position,
                    "node": grant.node,
                    "cpus": grant.cpus,
                    "memory_gib": grant.memory_gib,
                }
            )
        if end is None:
            for position, (node, piece) in enumerate(node_slices(allocation)):
                self.slices.append(
                    {
                        "allocation_id": number,
                        "position": position,
                        "node": node,
                        "gpu_uuid": piece.gpu_uuid,
                        "kind": piece.kind,
                        "milli": piece.milli,
                        "mig_uuid": piece.mig_uuid,
                        "mig_profile": piece.mig_profile,
                        "device_id": piece.device_id,
                    }
                )
        elif allocation.funded:
            units = allocation.charge_rate * (end - allocation.start)
            start = base + allocation.start
            self.usage.append(
                _usage(allocation.team, allocation.pool, start, base + end, units, number)
            )


def _usage(
    team: str, pool: str, start: float, end: float, units: float, allocation: int | None
) -> dict[str, Any]:
    return {
        "team": team,
        "pool": pool,
        "start_time": start,
        "end_time": end,
        "units": units,
        "allocation_id": allocation,
    }


def _state(ending: list[str]) -> RequestState:
    """The request's state at the end: its last run's ending (none: still waiting)."""
    last = ending[-1] if ending else None
    if last == "finished":
        return RequestState.FINISHED
    if last == "running":
        return RequestState.RUNNING
    return RequestState.REQUEUED if last else RequestState.PENDING


def _request_row(
    request: Request, base: float, state: RequestState, spec: Mapping[str, Any]
) -> dict[str, Any]:
    """The request's row as the store maps it (`mapping.request_row`), at its epoch time."""
    row = request_row(dataclasses.replace(request, submit=base + request.submit), state)
    row.spec = dict(spec)
    return {column.key: getattr(row, column.key) for column in RequestRow.__table__.columns}


def _ending(request_id: str, at: float, preempted: bool, allocation: Allocation) -> dict[str, Any]:
    if preempted:
        return {
            "time": at,
            "kind": "preempt",
            # The simulator queues every preempted request again.
            "payload": {"request": request_id, "reason": "funded", "message": "", "requeued": True},
        }
    return {
        "time": at,
        "kind": "session-ended",
        "payload": {"request": request_id, "started": allocation.start},
    }
