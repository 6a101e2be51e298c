"""The Store: the authoritative record of inventory, requests, allocations, usage and events.

Each method is one transaction on SQLite (file or memory) or PostgreSQL. Booking
locks the GPU rows it touches (``FOR UPDATE`` in uuid order on PostgreSQL, ``BEGIN
IMMEDIATE`` on SQLite) before it checks what is free, so two writers never share a
device; the partial unique index on booked devices is a second line of defence.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from graphlib import CycleError, TopologicalSorter
from types import MappingProxyType, TracebackType
from typing import Any, Self

from sqlalchemy import URL, Engine, and_, case, delete, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, contains_eager, selectinload, sessionmaker

from scheduler_core import model
from scheduler_core.store.conflicts import Holding, check_free
from scheduler_core.store.engine import make_engine, migrate, writer_engine
from scheduler_core.store.errors import SliceConflict, StoreError
from scheduler_core.store.mapping import (
    allocation_from_row,
    allocation_row,
    node_from_row,
    node_inventory,
    node_row,
    node_slices,
    pool_from_row,
    pool_row,
    request_from_row,
    request_row,
    slice_from_row,
    team_from_row,
    team_row,
)
from scheduler_core.store.models import (
    AllocationRow,
    BookedSliceRow,
    EventRow,
    GpuRow,
    NodeRow,
    PoolRow,
    RequestRow,
    SnapshotRow,
    TeamRow,
    UsageRow,
)
from scheduler_core.store.records import (
    WAITING_STATES,
    EventRecord,
    RequestForecast,
    RequestState,
    RequestStatus,
    SnapshotRecord,
)

NODE_INVENTORY = "node-inventory"
"""The event of a node saved new or with another inventory (`Store.save_nodes`): ``node``,
``inventory`` (`mapping.node_inventory`) and ``was`` (the one before; None: new)."""

_ACTIVE = AllocationRow.end_time.is_(None)


class Store:
    """Persistent scheduler state behind a session factory; see `Store.create`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._reads = sessionmaker(engine, expire_on_commit=False)
        self._writes = sessionmaker(writer_engine(engine), expire_on_commit=False)

    @classmethod
    def create(cls, url: str | URL, *, migrate_schema: bool = True, echo: bool = False) -> Self:
        """A store on ``url``, its schema first brought to the newest migration.

        ``sqlite:///path`` is a file (WAL mode), ``sqlite://`` a private in-memory
        database, ``postgresql+psycopg://…`` a server. Pass ``migrate_schema=False``
        where another process owns the migrations.
        """
        engine = make_engine(url, echo=echo)
        try:
            if migrate_schema:
                migrate(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        """Close every pooled connection; the store must not be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self._engine.url.render_as_string(hide_password=True)!r})"

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._reads.begin() as session:
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with self._writes.begin() as session:
            yield session

    # Inventory: pools, teams, nodes.

    def save_pools(self, pools: Iterable[model.Pool]) -> None:
        """Insert or update pools by name."""
        with self._write() as session:
            for pool in pools:
                session.merge(pool_row(pool))

    def load_pools(self) -> list[model.Pool]:
        with self._read() as session:
            rows = session.scalars(select(PoolRow).order_by(PoolRow.name))
            return [pool_from_row(row) for row in rows]

    def save_teams(self, teams: Iterable[model.Team]) -> None:
        """Insert or update teams by name, with exactly the given shares.

        A parent must be among ``teams`` or already stored; pools must be stored.
        """
        by_name = {team.name: team for team in teams}
        graph = {
            name: {team.parent} if team.parent in by_name else set()
            for name, team in by_name.items()
        }
        try:
            order = list(TopologicalSorter(graph).static_order())
        except CycleError as error:
            raise StoreError(f"teams form a cycle of parents: {error.args[1]}") from None
        with self._write() as session:
            for name in order:
                session.merge(team_row(by_name[name]))
                # A parent's row must exist before a child's foreign key names it.
                session.flush()

    def load_teams(self) -> list[model.Team]:
        with self._read() as session:
            rows = session.scalars(
                select(TeamRow).options(selectinload(TeamRow.shares)).order_by(TeamRow.name)
            )
            return [team_from_row(row) for row in rows]

    def save_nodes(
        self,
        nodes: Iterable[model.Node],
        engine_urls: Mapping[str, str | None] | None = None,
        at: float | None = None,
    ) -> None:
        """Insert or update nodes with exactly the given GPUs and MIG instances.

        ``engine_urls`` maps node names to their Docker engine URL; a node not in it
        keeps the URL it had. Removing a GPU that is booked raises IntegrityError.
        With ``at`` (the Hub's start), a node that is new or whose inventory (GPUs, MIG
        layout, CPUs, memory, labels, pool) changed gets a `NODE_INVENTORY` event at
        ``at``, in the same transaction: the node rows keep only the newest inventory,
        and a replay of an earlier period needs the one then (issue 51).
        """
        urls = engine_urls or {}
        with self._write() as session:
            for node in nodes:
                was = self._inventory(session, node.name) if at is not None else None
                row = node_row(node)
                if node.name in urls:
                    row.engine_url = urls[node.name]
                session.merge(row)
                if at is None:
                    continue
                now = node_inventory(node)
                if now != was:
                    payload = {"node": node.name, "inventory": now, "was": was}
                    session.add(EventRow(time=at, kind=NODE_INVENTORY, payload=payload))

    @staticmethod
    def _inventory(session: Session, name: str) -> dict[str, Any] | None:
        """The stored inventory of node ``name`` (`mapping.node_inventory`); None if new."""
        row = session.scalars(
            select(NodeRow)
            .options(selectinload(NodeRow.gpus).selectinload(GpuRow.mig))
            .where(NodeRow.name == name)
        ).first()
        return node_inventory(node_from_row(row)) if row is not None else None

    def load_nodes(self, pool: str | None = None) -> list[model.Node]:
        """Stored nodes (all, or those of ``pool``) by name."""
        query = (
            select(NodeRow)
            .options(selectinload(NodeRow.gpus).selectinload(GpuRow.mig))
            .order_by(NodeRow.name)
        )
        if pool is not None:
            query = query.where(NodeRow.pool == pool)
        with self._read() as session:
            return [node_from_row(row) for row in session.scalars(query)]

    def engine_url(self, node: str) -> str | None:
        """The Docker engine URL of ``node`` (None: the local engine)."""
        with self._read() as session:
            return self._node(session, node).engine_url

    def set_node_health(self, node: str, health: model.Health) -> None:
        with self._write() as session:
            self._node(session, node).health = health

    @staticmethod
    def _node(session: Session, name: str) -> NodeRow:
        row = session.get(NodeRow, name)
        if row is None:
            raise StoreError(f"node {name} is not stored")
        return row

    # Requests.

    def add_request(self, request: model.Request, forecast: RequestForecast | None = None) -> None:
        """Record a new pending request; its id must be new. ``forecast``: what the Hub
        told its user at submit, kept with it (never changed afterwards)."""
        with self._write() as session:
            if session.get(RequestRow, request.id) is not None:
                raise StoreError(f"request {request.id} already exists")
            row = request_row(request, RequestState.PENDING)
            if forecast is not None:
                _keep_forecast(row, forecast)
            session.add(row)

    def request_forecasts(
        self, since: float | None = None, until: float | None = None
    ) -> dict[str, RequestForecast]:
        """Request id → the forecast kept at its submit, for requests submitted in
        ``[since, until)`` (either bound open when None) that have one, by submit."""
        query = (
            select(RequestRow)
            .where(RequestRow.forecast_time.is_not(None))
            .order_by(RequestRow.submit, RequestRow.id)
        )
        if since is not None:
            query = query.where(RequestRow.submit >= since)
        if until is not None:
            query = query.where(RequestRow.submit < until)
        with self._read() as session:
            found = {}
            for row in session.scalars(query):
                kept = _forecast(row)
                if kept is not None:
                    found[row.id] = kept
            return found

    def load_request(self, request_id: str) -> model.Request:
        with self._read() as session:
            return request_from_row(self._request(session, request_id))

    def request_status(self, request_id: str) -> RequestStatus:
        with self._read() as session:
            row = self._request(session, request_id)
            return RequestStatus(row.state, row.reason)

    def set_request_state(
        self, request_id: str, state: RequestState, reason: str | None = None
    ) -> None:
        """Move a request to ``state`` (e.g. running, cancelled) with an optional reason."""
        with self._write() as session:
            row = self._request(session, request_id, lock=True)
            row.state = state
            row.reason = reason

    def set_request_priority(self, request_id: str, priority: int) -> None:
        """Change a request's declared priority (an admin moves it inside its team's queue)."""
        with self._write() as session:
            self._request(session, request_id, lock=True).priority = priority

    def pending_requests(self, pool: str | None = None) -> list[model.Request]:
        """Requests waiting in the queue (new or requeued), in submit order."""
        query = (
            select(RequestRow)
            .where(RequestRow.state.in_(WAITING_STATES))
            .order_by(RequestRow.submit, RequestRow.id)
        )
        if pool is not None:
            query = query.where(RequestRow.pool == pool)
        with self._read() as session:
            return [request_from_row(row) for row in session.scalars(query)]

    @staticmethod
    def _request(session: Session, request_id: str, *, lock: bool = False) -> RequestRow:
        row = session.get(RequestRow, request_id, with_for_update=lock)
        if row is None:
            raise StoreError(f"request {request_id} is not stored")
        return row

    # Allocations.

    def book(self, allocation: model.Allocation) -> None:
        """Record ``allocation`` and book its slices, all or nothing.

        Raises SliceConflict, naming the device and its holders, when a slice is
        already held by an active allocation (or twice in this one). The request is
        recorded too if it was never added; it must be waiting and becomes admitted.
        """
        wanted = [Holding(allocation.id, node, s) for node, s in node_slices(allocation)]
        nodes = allocation.node_names
        if len(set(nodes)) != len(nodes):
            raise StoreError(f"allocation {allocation.id} has two grants on one node")
        gpu_uuids = sorted({holding.slice.gpu_uuid for holding in wanted})
        try:
            with self._write() as session:
                if gpu_uuids:
                    held = self._lock_gpus(session, gpu_uuids, wanted)
                    check_free(held, wanted)
                request = session.get(RequestRow, allocation.id, with_for_update=True)
                if request is None:
                    session.add(request_row(allocation.request, RequestState.ADMITTED))
                elif request.state not in WAITING_STATES:
                    raise StoreError(f"request {allocation.id} is {request.state}, not waiting")
                else:
                    request.state = RequestState.ADMITTED
                    request.reason = None
                    active = select(AllocationRow.id).where(
                        AllocationRow.request_id == allocation.id, _ACTIVE
                    )
                    if session.scalar(active) is not None:
                        raise StoreError(f"request {allocation.id} already holds an allocation")
                session.add(allocation_row(allocation))
        except IntegrityError as error:
            raise self._explain(allocation.id, wanted, error) from error

    def rebind(self, *allocations: model.Allocation) -> None:
        """Each request's active allocation holds the given allocation's slices from now
        on, in place of those it booked, all at once (two may swap devices): a runtime
        bound other devices of the same node (Slurm binds GPUs of a type that counts
        several by count, and picks which). Raises SliceConflict when an allocation not
        given holds one of them."""
        wanted = [Holding(a.id, node, s) for a in allocations for node, s in node_slices(a)]
        moving = {a.id for a in allocations}
        gpu_uuids = sorted({holding.slice.gpu_uuid for holding in wanted})
        with self._write() as session:
            rows = []
            for allocation in allocations:
                row = session.scalar(
                    select(AllocationRow).where(AllocationRow.request_id == allocation.id, _ACTIVE)
                )
                if row is None:
                    raise StoreError(f"request {allocation.id} holds no allocation")
                rows.append(row)
            if gpu_uuids:
                held = self._lock_gpus(session, gpu_uuids, wanted)
                check_free([h for h in held if h.holder not in moving], wanted)
            for row in rows:
                row.slices.clear()
            session.flush()  # the old rows go before the new ones take their devices
            for row, allocation in zip(rows, allocations, strict=True):
                row.slices.extend(allocation_row(allocation).slices)

    @staticmethod
    def _lock_gpus(session: Session, gpu_uuids: list[str], wanted: list[Holding]) -> list[Holding]:
        """Lock the GPU rows (in uuid order, so writers never deadlock); return their bookings."""
        locked = session.execute(
            select(GpuRow.uuid, GpuRow.node)
            .where(GpuRow.uuid.in_(gpu_uuids))
            .order_by(GpuRow.uuid)
            .with_for_update()
        )
        node_of = dict(locked.all())
        for holding in wanted:
            gpu = holding.slice.gpu_uuid
            if gpu not in node_of:
                raise StoreError(f"GPU {gpu} is not in the stored inventory")
            if node_of[gpu] != holding.node:
                raise StoreError(f"GPU {gpu} is on node {node_of[gpu]}, not {holding.node}")
        booked = session.execute(
            select(AllocationRow.request_id, BookedSliceRow)
            .join(AllocationRow, BookedSliceRow.allocation_id == AllocationRow.id)
            .where(BookedSliceRow.gpu_uuid.in_(gpu_uuids))
        )
        return [Holding(holder, row.node, slice_from_row(row)) for holder, row in booked]

    def _explain(self, request_id: str, wanted: list[Holding], error: IntegrityError) -> StoreError:
        """Turn a constraint violation into the SliceConflict it stands for, if it is one."""
        devices = [
            h.slice.device_id for h in wanted if h.slice.kind is not model.SliceKind.FRACTION
        ]
        with self._read() as session:
            holder = session.execute(
                select(BookedSliceRow.device_id, BookedSliceRow.node, AllocationRow.request_id)
                .join(AllocationRow, BookedSliceRow.allocation_id == AllocationRow.id)
                .where(BookedSliceRow.device_id.in_(devices))
                .where(BookedSliceRow.kind != model.SliceKind.FRACTION)
                .limit(1)
            ).first()
        if holder is None:
            return StoreError(f"cannot book {request_id}: {error.orig}")
        device, node, by = holder
        message = f"{device} on node {node} is held by {by}; {request_id} cannot book it"
        return SliceConflict(device, [by], message)

    def release(
        self,
        request_id: str,
        end_time: float,
        *,
        state: RequestState = RequestState.FINISHED,
        reason: str | None = None,
    ) -> float:
        """End the request's active allocation at ``end_time`` and free its slices.

        A funded allocation is charged ``charge_rate × (end − start)`` to its team
        in its pool; the charge is returned (0 for unallocated sessions). The request
        moves to ``state``: finished, cancelled, or requeued after a preemption.
        """
        if state in (RequestState.ADMITTED, RequestState.RUNNING):
            raise ValueError(f"a released request cannot be {state}")
        with self._write() as session:
            allocation = session.scalars(
                select(AllocationRow)
                .where(AllocationRow.request_id == request_id, _ACTIVE)
                .with_for_update()
            ).one_or_none()
            if allocation is None:
                raise StoreError(f"request {request_id} holds no active allocation")
            if end_time < allocation.start_time:
                raise StoreError(
                    f"request {request_id} cannot end at {end_time}, "
                    f"before its start at {allocation.start_time}"
                )
            allocation.end_time = end_time
            session.execute(
                delete(BookedSliceRow).where(BookedSliceRow.allocation_id == allocation.id)
            )
            request = allocation.request
            request.state = state
            request.reason = reason
            if not allocation.funded:
                return 0.0
            units = allocation.charge_rate * (end_time - allocation.start_time)
            session.add(
                UsageRow(
                    team=request.team,
                    pool=request.pool,
                    start_time=allocation.start_time,
                    end_time=end_time,
                    units=units,
                    allocation_id=allocation.id,
                )
            )
            return units

    def active_allocations(self, pool: str | None = None) -> list[model.Allocation]:
        """Allocations that have not ended (all, or those in ``pool``), by start time."""
        query = (
            select(AllocationRow)
            .join(AllocationRow.request)
            .where(_ACTIVE)
            .options(
                contains_eager(AllocationRow.request),
                selectinload(AllocationRow.grants),
                selectinload(AllocationRow.slices),
            )
            .order_by(AllocationRow.start_time, AllocationRow.id)
        )
        if pool is not None:
            query = query.where(RequestRow.pool == pool)
        with self._read() as session:
            return [allocation_from_row(row) for row in session.scalars(query)]

    # Usage.

    def add_usage(self, team: str, pool: str, start: float, end: float, units: float) -> None:
        """Record usage charged outside an allocation (e.g. history from before the store)."""
        if end < start:
            raise ValueError(f"usage cannot end at {end}, before its start at {start}")
        with self._write() as session:
            session.add(UsageRow(team=team, pool=pool, start_time=start, end_time=end, units=units))

    def usage_between(self, team: str, pool: str, start: float, end: float) -> float:
        """Units charged to ``team`` in ``pool`` during ``[start, end)``.

        A record that overlaps the interval counts in proportion to the overlap.
        Running allocations are not included: they are charged when released.
        """
        overlap_start = case((UsageRow.start_time > start, UsageRow.start_time), else_=start)
        overlap_end = case((UsageRow.end_time < end, UsageRow.end_time), else_=end)
        duration = UsageRow.end_time - UsageRow.start_time
        prorated = case(
            (duration > 0, UsageRow.units * (overlap_end - overlap_start) / duration),
            else_=UsageRow.units,
        )
        overlaps = or_(
            and_(UsageRow.start_time < end, UsageRow.end_time > start),
            # An instantaneous charge counts where it happened.
            and_(
                UsageRow.start_time == UsageRow.end_time,
                UsageRow.start_time >= start,
                UsageRow.start_time < end,
            ),
        )
        query = select(func.coalesce(func.sum(prorated), 0.0)).where(
            UsageRow.team == team, UsageRow.pool == pool, overlaps
        )
        with self._read() as session:
            return float(session.scalar(query) or 0.0)

    def usage_records(self, since: float) -> list[tuple[str, str, float, float, float]]:
        """Charged usage ending after ``since``: (team, pool, start, end, units), by start."""
        query = (
            select(UsageRow.team, UsageRow.pool, UsageRow.start_time, UsageRow.end_time)
            .add_columns(UsageRow.units)
            .where(UsageRow.end_time > since)
            .order_by(UsageRow.start_time, UsageRow.id)
        )
        with self._read() as session:
            return [(t, p, s, e, u) for t, p, s, e, u in session.execute(query)]

    # Events.

    def append_event(
        self, time: float, kind: str, payload: Mapping[str, Any] | None = None
    ) -> EventRecord:
        """Append an entry to the event log; entries are never changed or removed."""
        row = EventRow(time=time, kind=kind, payload=dict(payload or {}))
        with self._write() as session:
            session.add(row)
        return _event(row)

    def list_events(
        self, *, kind: str | None = None, since: float | None = None, limit: int | None = None
    ) -> list[EventRecord]:
        """Events in the order they were appended, optionally of one kind or from a time on."""
        query = select(EventRow).order_by(EventRow.id).limit(limit)
        if kind is not None:
            query = query.where(EventRow.kind == kind)
        if since is not None:
            query = query.where(EventRow.time >= since)
        with self._read() as session:
            return [_event(row) for row in session.scalars(query)]

    # Snapshots.

    def save_snapshot(
        self,
        request_id: str,
        created: float,
        image: str,
        saved: Iterable[str] = (),
        unsaved: Mapping[str, str] | None = None,
        *,
        key: str | None = None,
        server: str = "",
        node: str | None = None,
        sizes: Mapping[str, Any] | None = None,
        kernels: Iterable[Any] = (),
        report: Mapping[str, Any] | None = None,
    ) -> SnapshotRecord:
        """Record a snapshot of the request's session (linked to its latest allocation).

        ``saved`` lists what was saved; ``unsaved`` maps what could not be to why. The
        snapshot belongs to the request's user and to ``server``; ``key`` (default: the
        row's id) names it."""
        with self._write() as session:
            request = self._request(session, request_id)
            allocation_id = session.scalar(
                select(func.max(AllocationRow.id)).where(AllocationRow.request_id == request_id)
            )
            row = SnapshotRow(
                key=key or f"pending-{secrets.token_hex(8)}",
                request_id=request_id,
                allocation_id=allocation_id,
                user_name=request.user_name,
                server=server,
                node=node,
                created=created,
                image=image,
                saved=list(saved),
                unsaved=dict(unsaved or {}),
                sizes=dict(sizes or {}),
                kernels=list(kernels),
                report=dict(report or {}),
            )
            session.add(row)
            if key is None:
                session.flush()
                row.key = str(row.id)
        return _snapshot(row)

    def list_snapshots(
        self,
        request_id: str | None = None,
        *,
        user: str | None = None,
        server: str | None = None,
    ) -> list[SnapshotRecord]:
        """Snapshots (all, of one request, or of one user or one user's server), oldest
        first."""
        query = select(SnapshotRow).order_by(SnapshotRow.created, SnapshotRow.id)
        if request_id is not None:
            query = query.where(SnapshotRow.request_id == request_id)
        if user is not None:
            query = query.where(SnapshotRow.user_name == user)
        if server is not None:
            query = query.where(SnapshotRow.server == server)
        with self._read() as session:
            return [_snapshot(row) for row in session.scalars(query)]

    def get_snapshot(self, key: str) -> SnapshotRecord | None:
        """The snapshot named ``key``, or None."""
        with self._read() as session:
            row = session.scalar(select(SnapshotRow).where(SnapshotRow.key == key))
            return None if row is None else _snapshot(row)

    def delete_snapshots(self, keys: Iterable[str]) -> int:
        """Forget the snapshots named ``keys``; how many there were."""
        wanted = list(keys)
        if not wanted:
            return 0
        with self._write() as session:
            result = session.execute(delete(SnapshotRow).where(SnapshotRow.key.in_(wanted)))
            return int(getattr(result, "rowcount", 0) or 0)


def _keep_forecast(row: RequestRow, forecast: RequestForecast) -> None:
    row.forecast_time = forecast.time
    row.forecast_start = forecast.start
    row.forecast_starts_now = forecast.starts_now
    row.forecast_funded = forecast.funded
    row.forecast_protected_s = forecast.protected_s
    row.forecast_position = forecast.position
    row.forecast_waiting = forecast.waiting


def _forecast(row: RequestRow) -> RequestForecast | None:
    if row.forecast_time is None:
        return None
    return RequestForecast(
        time=row.forecast_time,
        start=row.forecast_start,
        starts_now=bool(row.forecast_starts_now),
        funded=bool(row.forecast_funded),
        protected_s=float(row.forecast_protected_s or 0.0),
        position=int(row.forecast_position or 0),
        waiting=int(row.forecast_waiting or 0),
    )


def _event(row: EventRow) -> EventRecord:
    return EventRecord(row.id, row.time, row.kind, MappingProxyType(dict(row.payload)))


def _snapshot(row: SnapshotRow) -> SnapshotRecord:
    return SnapshotRecord(
        id=row.id,
        request_id=row.request_id,
        allocation_id=row.allocation_id,
        created=row.created,
        image=row.image,
        saved=tuple(row.saved),
        unsaved=MappingProxyType(dict(row.unsaved)),
        key=row.key,
        user=row.user_name,
        server=row.server,
        node=row.node,
        sizes=MappingProxyType(dict(row.sizes)),
        kernels=tuple(row.kernels),
        report=MappingProxyType(dict(row.report)),
    )
