"""Reading a live store's history for `budgethub replay`, read-only and safe beside a Hub.

The store is opened read-only where the driver allows it: a SQLite file through a
``mode=ro`` URI (the Hub's WAL writes go on; a reader never blocks them), PostgreSQL with
``SET TRANSACTION READ ONLY`` on every transaction (``postgresql_readonly``). Each table is
read in its own short transaction; everything after ``until`` is cut, so rows a Hub
writes meanwhile change nothing. A store whose schema predates the admin tables (0003)
is upgraded in a copy (SQLite) or refused with its revision named (PostgreSQL).

What the store lacks for a faithful replay is listed in `History.missing`.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from alembic.script import ScriptDirectory
from sqlalchemy import Engine, and_, create_engine, func, inspect, make_url, or_, select, text
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, selectinload

from scheduler_core import model
from scheduler_core.errors import InputError
from scheduler_core.research.replay import (
    FINISHED,
    LAUNCH_FAILED,
    PREEMPTED,
    RUNNING,
    AdminChange,
    History,
    InventoryChange,
    LiveRequest,
    LiveRun,
    without_cyclic_gc,
)
from scheduler_core.scenario import NodeEvent
from scheduler_core.settings import SETTING_NAMES, SettingError, Settings, settings_from_mapping
from scheduler_core.store.engine import alembic_config, make_engine, migrate
from scheduler_core.store.mapping import (
    node_from_inventory,
    node_from_row,
    pool_from_row,
    request_from_row,
    slice_from_row,
)
from scheduler_core.store.models import (
    AllocationGrantRow,
    AllocationRow,
    AuditRow,
    BookedSliceRow,
    EventRow,
    GpuRow,
    NodeRow,
    PoolRow,
    RequestRow,
    SchedulerStatusRow,
    TeamRow,
    UsageRow,
)
from scheduler_core.store.records import RequestState
from scheduler_core.store.store import NODE_INVENTORY

OLDEST = "0003"
"""The oldest schema read as it is: the admin tables (audit log, settings) came with it."""

STORE_FLAG = "STORE_URL"

_ENDING_KINDS = ("preempt", "launch-failed")
_EVENT_KINDS = (
    "preempt",
    "launch-failed",
    "exit",
    "cancel",
    "launched",
    "activity",
    "node",
    "hub-start",
    "admin-applied",
    NODE_INVENTORY,
)
_STATE_KINDS = ("node", "hub-start", NODE_INVENTORY)
GRANTED = "granted"
"""The Hub's event of an admission booked: ``request``, ``funded``, ``devices`` (node ->
the device ids of its slices; spawner/hub/embedded.py writes it)."""
"""Kinds read from before the period too: the state at its start."""


@dataclass(frozen=True)
class Source:
    """An opened store: its engine, its revision, and how it is shown."""

    engine: Engine
    revision: str
    shown: str
    copy: str | None = None
    """The temporary upgraded copy read instead of an older SQLite file."""

    def close(self) -> None:
        self.engine.dispose()
        if self.copy is not None:
            shutil.rmtree(Path(self.copy).parent, ignore_errors=True)


def _sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL or a bare path; None for other backends."""
    if "://" not in url:
        return url
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    if not parsed.database or parsed.database == ":memory:":
        raise InputError(STORE_FLAG, "an in-memory SQLite store has no history to replay")
    return parsed.database


def _read_only_sqlite(path: str) -> Engine:
    uri = f"file:{Path(path).resolve().as_posix()}?mode=ro"
    return create_engine(
        "sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False)
    )


def _revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _known_revisions() -> list[str]:
    """Every shipped revision, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def open_store(url: str) -> Source:
    """The store at ``url`` opened read-only; InputError (naming STORE_URL) if it cannot
    be read, is not a budgethub store, or has a schema this replay does not read."""
    path = _sqlite_path(url)
    try:
        if path is not None:
            if not os.path.isfile(path):
                raise InputError(STORE_FLAG, f"no SQLite store at {path}")
            engine = _read_only_sqlite(path)
            shown = f"sqlite:///{path}"
        else:
            engine = create_engine(url, execution_options={"postgresql_readonly": True})
            shown = engine.url.render_as_string(hide_password=True)
        revision = _revision(engine)
    except ArgumentError as error:
        raise InputError(STORE_FLAG, f"not a database URL: {error}") from None
    except SQLAlchemyError as error:
        reason = str(getattr(error, "orig", error)).strip().splitlines()[0]
        raise InputError(STORE_FLAG, f"cannot read {url}: {reason}") from None
    if revision is None:
        engine.dispose()
        raise InputError(STORE_FLAG, f"{shown} is not a budgethub store (no schema revision)")
    known = _known_revisions()
    if revision not in known:
        engine.dispose()
        raise InputError(
            STORE_FLAG,
            f"the store's schema is at revision {revision}, which this budgethub does not "
            f"know (it knows {known[0]} to {known[-1]}): replay it with a newer budgethub",
        )
    if known.index(revision) >= known.index(OLDEST):
        return Source(engine, revision, shown)
    engine.dispose()
    if path is None:
        raise InputError(
            STORE_FLAG,
            f"the store's schema is at revision {revision}, older than {OLDEST} which the "
            f"replay reads; start the Hub once on it (it migrates to {known[-1]}) and "
            "replay again",
        )
    return _upgraded_copy(path, revision, shown, known[-1])


def _upgraded_copy(path: str, revision: str, shown: str, newest: str) -> Source:
    """An older SQLite store, copied (SQLite's online backup: consistent while the Hub
    writes) and the copy migrated; the original is never written."""
    folder = tempfile.mkdtemp(prefix="budgethub-replay-")
    copy = os.path.join(folder, "store.sqlite")
    source = sqlite3.connect(f"file:{Path(path).resolve().as_posix()}?mode=ro", uri=True)
    target = sqlite3.connect(copy)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    writable = make_engine(f"sqlite:///{copy}")
    try:
        migrate(writable)
    finally:
        writable.dispose()
    note = f"{shown} (schema {revision}, read from a copy upgraded to {newest})"
    return Source(_read_only_sqlite(copy), newest, note, copy)


@contextmanager
def _reading(engine: Engine) -> Iterator[Session]:
    """One short read-only transaction."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        yield session


@without_cyclic_gc
def read_history(source: Source, since: float, until: float, window: float) -> History:
    """The history of ``[since, until)``, and the usage charged before it within the
    longest lookback window in force (or ``window``, if longer: a what-if's)."""
    engine = source.engine
    missing: list[str] = []
    with _reading(engine) as session:
        pools = tuple(pool_from_row(r) for r in session.scalars(select(PoolRow)))
    with _reading(engine) as session:
        rows = session.scalars(
            select(NodeRow)
            .options(selectinload(NodeRow.gpus).selectinload(GpuRow.mig))
            .order_by(NodeRow.name)
        )
        nodes = [node_from_row(r) for r in rows]
    with _reading(engine) as session:
        team_rows = session.scalars(select(TeamRow).options(selectinload(TeamRow.shares)))
        teams = [
            model.Team(r.name, {s.pool: s.share for s in r.shares}, r.parent) for r in team_rows
        ]
    events = _events(engine, since, until)
    audit = _audit(engine, since, until)
    status = _status(engine)
    starts = [e for e in events if e.kind == "hub-start"]
    before = [e for e in starts if e.time <= since]
    settings, teams = _state_at(since, before[-1] if before else None, status, teams, audit)
    if not starts:
        missing.append(
            "hub-start events: the settings, shares and node health at each Hub start, "
            "and when the Hub restarted (settings come from scheduler_status and the audit log)"
        )
    if settings is None:
        missing.append("the Hub's settings: no hub-start event, no scheduler_status row")
        settings = Settings()
    nodes, inventory, noted = _inventory_at(since, until, nodes, events)
    missing.extend(noted)
    nodes = _health_at(since, nodes, events, before[-1] if before else None)
    later = _added(inventory)
    nodes = [replace(n, health=model.Health.DOWN) if n.name in later else n for n in nodes]
    requests, notes = _requests(engine, since, until, events)
    missing.extend(notes)
    requests = _devices_at(engine, since, requests, {n.name: n for n in nodes})
    admin = _admin_changes(since, until, audit, starts, events)
    lookbacks = [c.settings.get("lookback", 0.0) for c in admin]
    usage = _usage(engine, since, max([window, settings.lookback, *lookbacks]))
    node_names = {n.name for n in nodes}
    node_events = tuple(
        NodeEvent(e.time, e.payload["node"], model.Health(e.payload["state"]))
        for e in events
        if e.kind == "node" and since <= e.time < until and e.payload.get("node") in node_names
    )
    return History(
        since=since,
        until=until,
        settings=settings,
        pools=pools,
        nodes=tuple(nodes),
        teams=tuple(teams),
        requests=tuple(requests),
        node_events=node_events,
        admin=admin,
        usage=usage,
        hub_starts=tuple(e.time for e in starts if since < e.time < until),
        inventory=inventory,
        missing=tuple(missing),
        store=source.shown,
        schema=source.revision,
    )


@dataclass(frozen=True)
class _Event:
    id: int
    time: float
    kind: str
    payload: Mapping[str, Any]


def _events(engine: Engine, since: float, until: float) -> list[_Event]:
    """The event log's entries the replay reads: those of the period, and before it the
    node changes, inventories and Hub starts (the state at ``since``); node inventories
    after it too, as the node rows hold the newest one (`_inventory_at` walks back)."""
    query = (
        select(EventRow.id, EventRow.time, EventRow.kind, EventRow.payload)
        .where(EventRow.kind.in_(_EVENT_KINDS))
        .where(
            or_(
                and_(EventRow.time < until, EventRow.time >= since),
                and_(EventRow.time < until, EventRow.kind.in_(_STATE_KINDS)),
                EventRow.kind == NODE_INVENTORY,  # the rows are now: walked back to ``until``
            )
        )
        .order_by(EventRow.time, EventRow.id)
    )
    with _reading(engine) as session:
        return [_Event(i, t, k, p or {}) for i, t, k, p in session.execute(query)]


def _audit(engine: Engine, since: float, until: float) -> list[AuditRow]:
    with _reading(engine) as session:
        rows = session.scalars(select(AuditRow).order_by(AuditRow.time, AuditRow.id))
        return [
            r for r in rows if r.target in ("lookback", "max_min_runtime") or ".share." in r.target
        ]


def _status(engine: Engine) -> Mapping[str, Any] | None:
    """The settings the Hub last reported (the newest scheduler_status row)."""
    with _reading(engine) as session:
        row = session.scalars(
            select(SchedulerStatusRow).order_by(SchedulerStatusRow.updated.desc())
        ).first()
        return dict(row.settings) if row is not None else None


def _settings(values: Mapping[str, Any]) -> Settings:
    known = {k: v for k, v in values.items() if k in SETTING_NAMES}
    try:
        return settings_from_mapping(known)
    except SettingError as error:
        raise InputError(STORE_FLAG, f"the store's setting {error.key}: {error.reason}") from None


def _share_target(target: str) -> tuple[str, str] | None:
    """(team, pool) of an audit target ``teams.<team>.share.<pool>``."""
    if not target.startswith("teams.") or ".share." not in target:
        return None
    team, _, pool = target[len("teams.") :].rpartition(".share.")
    return (team, pool) if team and pool else None


def _state_at(
    since: float,
    start: _Event | None,
    status: Mapping[str, Any] | None,
    teams: list[model.Team],
    audit: Sequence[AuditRow],
) -> tuple[Settings | None, list[model.Team]]:
    """Settings and shares in force at ``since``: from the last Hub start before it, with
    the admin changes made since that start; else the newest ones walked back through
    the audit log (each change after ``since`` undone)."""
    shares = {t.name: dict(t.share) for t in teams}
    values: dict[str, Any] | None
    if start is not None:
        values = dict(start.payload.get("settings") or {})
        for name, by_pool in _start_shares(start).items():
            shares.setdefault(name, {}).update(by_pool)
        for entry in audit:
            if start.time < entry.time <= since:
                _apply(entry, entry.new, values, shares)
    else:
        values = dict(status) if status is not None else None
        for entry in reversed(audit):
            if entry.time > since:
                _apply(entry, entry.old, values, shares)
    settings = _settings(values) if values is not None else None
    kept = [model.Team(t.name, shares.get(t.name, {}), t.parent) for t in teams]
    return settings, kept


def _start_shares(start: _Event) -> dict[str, dict[str, float]]:
    """A Hub start's shares by team and pool: ``{team: {pool: share}}`` (or, as the
    first Hubs of issue 51 wrote it, ``{team: {"share": {pool: share}, ...}}``)."""
    out: dict[str, dict[str, float]] = {}
    for team, entry in (start.payload.get("teams") or {}).items():
        by_pool = entry.get("share", entry) if isinstance(entry, dict) else {}
        if isinstance(by_pool, dict):
            out[team] = {
                pool: float(share)
                for pool, share in by_pool.items()
                if isinstance(share, int | float) and not isinstance(share, bool)
            }
    return out


def _apply(
    entry: AuditRow,
    value: Any,
    settings: dict[str, Any] | None,
    shares: dict[str, dict[str, float]],
) -> None:
    target = _share_target(entry.target)
    if target is not None:
        if isinstance(value, int | float):
            shares.setdefault(target[0], {})[target[1]] = float(value)
    elif settings is not None and isinstance(value, int | float):
        settings[entry.target] = float(value)


def _inventory_at(
    since: float, until: float, nodes: list[model.Node], events: Sequence[_Event]
) -> tuple[list[model.Node], tuple[InventoryChange, ...], list[str]]:
    """Each node's GPUs and MIG layout at ``since`` (the store's rows hold only the
    newest): its last ``node-inventory`` event before it, else what the first one after
    it replaced (``was``; None: the node came later, so it is left out if that was after
    ``until``), else the row. Also the changes in the period, and a note where the store
    has no such events."""
    by_node: dict[str, list[_Event]] = defaultdict(list)
    for event in events:
        if event.kind == NODE_INVENTORY and isinstance(event.payload.get("node"), str):
            by_node[event.payload["node"]].append(event)
    if not by_node:
        note = (
            "a node's GPUs and MIG layout over time (no node-inventory events: a Hub from "
            "before them; the replay takes each node as the store holds it now)"
        )
        return nodes, (), [note]
    out: list[model.Node] = []
    changes: list[InventoryChange] = []
    for node in nodes:
        seen = by_node.get(node.name, [])
        earlier = [e for e in seen if e.time <= since]
        later = [e for e in seen if since < e.time < until]
        after = [e for e in seen if e.time > since]
        if earlier:
            node = node_from_inventory(node.name, earlier[-1].payload["inventory"], node.health)
        elif after and after[0].payload.get("was") is not None:
            node = node_from_inventory(node.name, after[0].payload["was"], node.health)
        elif after and not later:
            continue  # it came after the period
        out.append(node)
        for event in later:
            changes.append(
                InventoryChange(
                    event.time,
                    node_from_inventory(node.name, event.payload["inventory"]),
                    added=event.payload.get("was") is None,
                )
            )
    return out, tuple(sorted(changes, key=lambda c: c.at)), []


def _added(changes: Sequence[InventoryChange]) -> set[str]:
    """The nodes that a change in the period brought (absent at its start: down then)."""
    return {c.node.name for c in changes if c.added}


def _health_at(
    since: float, nodes: list[model.Node], events: Sequence[_Event], start: _Event | None
) -> list[model.Node]:
    """Each node's health at ``since``: its last change before it, else what the last Hub
    start saw, else what the store holds now if it never changed in the period."""
    health: dict[str, model.Health] = {}
    changed_later: set[str] = set()
    if start is not None:
        for name, state in (start.payload.get("nodes") or {}).items():
            health[name] = model.Health(state)
    for event in events:
        if event.kind != "node":
            continue
        name = event.payload.get("node")
        if not isinstance(name, str):
            continue
        if event.time < since:
            health[name] = model.Health(event.payload["state"])
        else:
            changed_later.add(name)
    out = []
    for node in nodes:
        if node.name in health:
            node = replace(node, health=health[node.name])
        elif node.name in changed_later:
            node = replace(node, health=model.Health.READY)
        out.append(node)
    return out


def _wanted(since: float, until: float) -> Any:
    """The requests a period's replay reads: submitted before ``until``, and submitted
    in the period, or waiting or running when read, or holding an allocation then."""
    waiting = (
        RequestState.PENDING,
        RequestState.REQUEUED,
        RequestState.ADMITTED,
        RequestState.RUNNING,
    )
    live_ids = select(AllocationRow.request_id).where(
        or_(AllocationRow.end_time.is_(None), AllocationRow.end_time > since),
        AllocationRow.start_time < until,
    )
    columns = RequestRow.__table__.c
    return and_(
        columns.submit < until,
        or_(
            columns.submit >= since,
            columns.state.in_([s.value for s in waiting]),
            columns.id.in_(live_ids),
        ),
    )


_REQUEST_COLUMNS = (
    *("id", "user_name", "team", "pool", "submit", "gpus", "nodes", "gpu_milli", "mig"),
    *("cpus", "memory_gib", "labels", "min_runtime", "resumable", "priority"),
    *("klass", "profile", "state"),  # the columns a RequestRow maps, by name
)
_FORECAST_COLUMNS = ("forecast_time", "forecast_start", "forecast_funded")
"""What the replay measures of the forecast kept at submit (migration 0004)."""


def _requests(
    engine: Engine, since: float, until: float, events: Sequence[_Event]
) -> tuple[list[LiveRequest], list[str]]:
    """Every request of the period, and those running or waiting at its start: one query
    of the columns the replay reads (the forecast's too, where the schema has them)."""
    notes: list[str] = []
    columns = RequestRow.__table__.c
    wanted = _wanted(since, until)
    with engine.connect() as connection:
        present = {c["name"] for c in inspect(connection).get_columns("requests")}
    forecasts = all(name in present for name in _FORECAST_COLUMNS)
    if not forecasts:
        notes.append("requests.forecast_* (each request's forecast at submit, migration 0004)")
    names = _REQUEST_COLUMNS + (_FORECAST_COLUMNS if forecasts else ())
    priced = (  # from the spec only what a preemption costs, not the whole JSON
        columns.spec["checkpoint_every"].as_float().label("checkpoint_every"),
        columns.spec["restart_cost"].as_float().label("restart_cost"),
    )
    query = (
        select(*(columns[name] for name in names), *priced)
        .where(wanted)
        .order_by(columns.submit, columns.id)
    )
    with _reading(engine) as session:
        request_rows = list(session.execute(query))
    rows, grants = _allocations(engine, select(columns.id).where(wanted), until)
    runs_of: dict[str, list[Any]] = defaultdict(list)
    for allocation in rows:
        runs_of[allocation.request_id].append(allocation)
    by_kind: dict[str, dict[str, list[_Event]]] = defaultdict(lambda: defaultdict(list))
    for event in events:
        request_id = event.payload.get("request")
        if isinstance(request_id, str):
            by_kind[event.kind][request_id].append(event)
    endings: dict[str, list[_Event]] = defaultdict(list)
    for kind in _ENDING_KINDS:
        for request_id, found in by_kind[kind].items():
            endings[request_id].extend(found)
    out: list[LiveRequest] = []
    no_checkpoint = False
    for row in request_rows:
        no_checkpoint = no_checkpoint or row.checkpoint_every is None
        request = _request(row)
        state = RequestState(row.state)
        rid = row.id
        own = endings.get(rid, ())
        runs = _runs(runs_of.get(rid, ()), grants, state, own, until)
        forecast = (row.forecast_time, row.forecast_start, row.forecast_funded)
        out.append(
            LiveRequest(
                request,
                runs,
                cancelled=_cancelled(rid, state, runs, by_kind, until),
                idle_after=_idle_after(runs, by_kind["activity"].get(rid, ())),
                latency=_latency(by_kind["launched"].get(rid, ())),
                forecast_time=forecast[0] if forecasts else None,
                forecast_start=forecast[1] if forecasts and forecast[0] is not None else None,
                forecast_funded=(
                    bool(forecast[2]) if forecasts and forecast[0] is not None else None
                ),
                requeued=_requeued(runs, state, own),
            )
        )
    if no_checkpoint and out:
        notes.append(
            "a request's checkpoint interval and restart cost (requests.spec has neither; "
            "the replay takes 0)"
        )
    if any("requeued" not in e.payload for found in by_kind["preempt"].values() for e in found):
        notes.append(
            "whether the Hub queued a preempted session again (preempt events without "
            "'requeued', a Hub from before 8e1a689): read from the request's later runs "
            "and its state"
        )
    if rows and not by_kind["launched"]:
        notes.append("launched events: when each session was ready (its spawn latency)")
    return out, notes


def _request(row: Any) -> model.Request:
    """The request a row maps (`mapping.request_from_row`), with what a preemption of it
    costs from its spec (the two values the query took from it)."""
    priced = {"checkpoint_every": row.checkpoint_every, "restart_cost": row.restart_cost}
    return request_from_row(cast(Any, row), priced)  # the columns a RequestRow maps


def _devices_at(
    engine: Engine, since: float, requests: list[LiveRequest], nodes: Mapping[str, model.Node]
) -> list[LiveRequest]:
    """The runs under way at ``since`` whose slices the store no longer holds (their
    allocation has ended since) get the devices their ``granted`` event named, where the
    nodes as they were then still have them; the others keep none (`replay.plan` places
    them on free slices)."""
    bare = [
        (i, j)
        for i, live in enumerate(requests)
        for j, run in enumerate(live.runs)
        if run.start < since
        and (run.end is None or run.end > since)
        and live.request.gpu_weight
        and any(not g.slices for g in run.grants)
    ]
    if not bare:
        return requests
    wanted = {requests[i].request.id for i, _ in bare}
    earliest = min(requests[i].runs[j].start for i, j in bare)
    query = (
        select(EventRow.time, EventRow.payload)
        .where(EventRow.kind == GRANTED, EventRow.time >= earliest, EventRow.time < since)
        .order_by(EventRow.time, EventRow.id)
    )
    granted: dict[tuple[str, float], Mapping[str, Any]] = {}
    with _reading(engine) as session:
        for at, payload in session.execute(query):
            if isinstance(payload, dict) and payload.get("request") in wanted:
                granted[(payload["request"], at)] = payload.get("devices") or {}
    out = list(requests)
    for i, j in bare:
        live = out[i]
        run = live.runs[j]
        devices = granted.get((live.request.id, run.start))
        if devices is None:
            continue
        grants = tuple(_granted(g, live.request, devices, nodes) for g in run.grants)
        if all(g.slices for g in grants):
            runs = live.runs[:j] + (replace(run, grants=grants),) + live.runs[j + 1 :]
            out[i] = replace(live, runs=runs)
    return out


def _granted(
    grant: model.NodeGrant,
    request: model.Request,
    devices: Mapping[str, Any],
    nodes: Mapping[str, model.Node],
) -> model.NodeGrant:
    """The grant with the slices its devices name (a MIG instance's UUID, or a GPU's:
    whole, or the request's fraction of it); unchanged where a device is not known."""
    node = nodes.get(grant.node)
    ids = devices.get(grant.node)
    if node is None or not isinstance(ids, list) or not ids:
        return grant
    gpus = {g.uuid: g for g in node.gpus}
    mig = {m.uuid: (g, m) for g in node.gpus for m in g.mig}
    slices: list[model.Slice] = []
    for device in ids:
        if device in mig:
            gpu, instance = mig[device]
            slices.append(
                model.Slice(
                    gpu.uuid, model.SliceKind.MIG, model.MILLI, instance.uuid, instance.profile
                )
            )
        elif device in gpus and request.gpu_milli:
            slices.append(model.Slice(device, model.SliceKind.FRACTION, request.gpu_milli))
        elif device in gpus:
            slices.append(model.Slice(device, model.SliceKind.WHOLE))
        else:
            return grant
    return replace(grant, slices=tuple(slices))


def _requeued(
    runs: Sequence[LiveRun], state: RequestState, endings: Sequence[_Event]
) -> bool | None:
    """Whether the Hub queued the request again after a preemption: what its last
    ``preempt`` event says (``requeued``, written since issue 51), else a last run
    preempted with the request finished (the Hub ends one it does not queue again),
    else None (the store does not say: never preempted, or queued again and not told)."""
    for event in reversed(endings):
        if event.kind == "preempt" and isinstance(event.payload.get("requeued"), bool):
            return bool(event.payload["requeued"])
    if runs and runs[-1].ended == PREEMPTED and state is RequestState.FINISHED:
        return False
    if any(r.ended == PREEMPTED for r in runs):
        return True
    return None


def _allocations(
    engine: Engine, request_ids: Any, until: float
) -> tuple[list[Any], dict[int, tuple[model.NodeGrant, ...]]]:
    """The allocations of ``request_ids`` (a subquery) that started before ``until`` (rows
    with their columns by name), and their grants with, where still booked, their slices:
    three plain queries in one transaction (the ORM's loading took most of a month's read)."""
    a = AllocationRow.__table__.c
    g = AllocationGrantRow.__table__.c
    b = BookedSliceRow.__table__.c
    chosen = and_(a.start_time < until, a.request_id.in_(request_ids))
    ids = select(a.id).where(chosen)
    with _reading(engine) as session:
        rows = session.execute(
            select(
                a.id,
                a.request_id,
                a.start_time,
                a.end_time,
                a.funded,
                a.protected_until,
                a.charge_rate,
            )
            .where(chosen)
            .order_by(a.start_time, a.id)
        ).all()
        grant_rows = session.execute(
            select(g.allocation_id, g.node, g.cpus, g.memory_gib)
            .where(g.allocation_id.in_(ids))
            .order_by(g.allocation_id, g.position)
        ).all()
        slice_rows = session.execute(
            select(b.allocation_id, b.node, b.gpu_uuid, b.kind, b.milli, b.mig_uuid, b.mig_profile)
            .where(b.allocation_id.in_(ids))
            .order_by(b.allocation_id, b.position)
        ).all()
    slices: dict[tuple[int, str], list[model.Slice]] = defaultdict(list)
    for piece in slice_rows:
        slices[(piece.allocation_id, piece.node)].append(slice_from_row(cast(Any, piece)))
    grants: dict[int, list[model.NodeGrant]] = defaultdict(list)
    for allocation_id, node, cpus, memory in grant_rows:
        pieces = tuple(slices.get((allocation_id, node), ()))
        grants[allocation_id].append(model.NodeGrant(node, pieces, cpus, memory))
    return list(rows), {k: tuple(v) for k, v in grants.items()}


def _runs(
    rows: Sequence[Any],
    grants: Mapping[int, tuple[model.NodeGrant, ...]],
    state: RequestState,
    endings: Sequence[_Event],
    until: float,
) -> tuple[LiveRun, ...]:
    """The request's allocations, each with how it ended: a preempt or launch-failed event
    within it says so; else a later allocation means it was requeued (preempted), and
    the last one ended as the request did."""
    runs: list[LiveRun] = []
    last = len(rows) - 1
    for i, row in enumerate(rows):
        start, end = row.start_time, row.end_time
        if end is None or end > until:
            end = None
            ended = RUNNING
        else:
            hit = (
                next((e for e in endings if start < e.time <= end + 1.0), None) if endings else None
            )
            if hit is not None:
                ended = PREEMPTED if hit.kind == "preempt" else LAUNCH_FAILED
            elif i < last or state in (RequestState.REQUEUED, RequestState.PENDING):
                ended = PREEMPTED
            else:
                ended = FINISHED
        runs.append(
            LiveRun(
                start,
                end,
                grants.get(row.id, ()),
                row.funded,
                row.protected_until,
                row.charge_rate,
                ended,
                row.id,
            )
        )
    return tuple(runs)


def _cancelled(
    request_id: str,
    state: RequestState,
    runs: Sequence[LiveRun],
    by_kind: Mapping[str, Mapping[str, list[_Event]]],
    until: float,
) -> float | None:
    """When a request left the queue without running again: its ``cancel`` event, or an
    admin's cancel (an ``exit`` event with ``by``)."""
    for event in by_kind["cancel"].get(request_id, []):
        return event.time
    for event in by_kind["exit"].get(request_id, []):
        if "by" in event.payload and not any(r.end is None for r in runs):
            return event.time
    if state is RequestState.CANCELLED and not runs:
        return until
    return None


def _idle_after(runs: Sequence[LiveRun], activity: Sequence[_Event]) -> float | None:
    """Seconds into its run after which a session went idle and stayed idle to its end
    (the first run that did). A report at the instant one run ends and the next starts
    (a session preempted and started again in the same cycle) is the new run's."""
    for i, run in enumerate(runs):
        end = run.end if run.end is not None else float("inf")
        after = runs[i + 1].start if i + 1 < len(runs) else float("inf")
        inside = [e for e in activity if run.start <= e.time <= end and e.time < after]
        if inside and not inside[-1].payload.get("busy", True):
            idle_since = inside[-1].payload.get("idle_since")
            if isinstance(idle_since, int | float):
                return max(0.0, float(idle_since) - run.start)
    return None


def _latency(launched: Sequence[_Event]) -> float | None:
    for event in launched:
        value = event.payload.get("latency_s")
        if isinstance(value, int | float):
            return float(value)
    return None


def _admin_changes(
    since: float,
    until: float,
    audit: Sequence[AuditRow],
    starts: Sequence[_Event],
    events: Sequence[_Event],
) -> tuple[AdminChange, ...]:
    """Admin changes of settings and shares in the period, at the time the running
    scheduler took each in (its ``admin-applied`` event) or else the audit's; and each
    Hub start in the period with its configuration."""
    applied = sorted(
        (e.time, e.payload.get("audit_id", 0)) for e in events if e.kind == "admin-applied"
    )
    changes: list[AdminChange] = []
    for entry in audit:
        if not since < entry.time < until:
            continue
        at = next(
            (t for t, audit_id in applied if audit_id >= entry.id and t >= entry.time), entry.time
        )
        if not since <= at < until:
            continue
        target = _share_target(entry.target)
        if not isinstance(entry.new, int | float):
            continue
        if target is not None:
            changes.append(AdminChange(at, shares={target: float(entry.new)}))
        else:
            changes.append(AdminChange(at, settings={entry.target: float(entry.new)}))
    for start in starts:
        if not since < start.time < until:
            continue
        settings = _settings_values(start.payload.get("settings") or {})
        shares = {
            (team, pool): share
            for team, by_pool in _start_shares(start).items()
            for pool, share in by_pool.items()
        }
        changes.append(
            AdminChange(start.time, settings=settings, shares=shares, source="hub-start")
        )
    return tuple(sorted(changes, key=lambda c: c.at))


def _settings_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """A Hub start's settings, parsed, by name (every field)."""
    parsed = _settings(values)
    return {name: getattr(parsed, name) for name in SETTING_NAMES if name in values}


def _usage(
    engine: Engine, since: float, window: float
) -> tuple[tuple[str, str, float, float, float, int | None], ...]:
    query = (
        select(
            UsageRow.team,
            UsageRow.pool,
            UsageRow.start_time,
            UsageRow.end_time,
            UsageRow.units,
            UsageRow.allocation_id,
        )
        .where(UsageRow.end_time > since - window, UsageRow.start_time < since)
        .order_by(UsageRow.start_time, UsageRow.id)
    )
    with _reading(engine) as session:
        return tuple((t, p, s, e, u, a) for t, p, s, e, u, a in session.execute(query))


def history_span(source: Source) -> tuple[float | None, float | None]:
    """The first and last submit the store holds (for messages about an empty period)."""
    columns = RequestRow.__table__.c
    with _reading(source.engine) as session:
        first, last = session.execute(
            select(func.min(columns.submit), func.max(columns.submit))
        ).one()
    return first, last
