"""My sessions (issue 41): one Hub page listing every running, queued and snapshotted session
of the logged-in user, with what each holds and what can be done with it.

Open OnDemand's "My Interactive Sessions" is the model. The page is the Hub's own
(``/hub/budgethub/sessions``, in the nav bar) rather than the budget service's: it reads
the embedded scheduler directly (the queue and its estimates come from the same
`QueueView` as the spawn page, so both say the same), and its buttons call the Hub's
own REST API (start, stop, leave the queue) with the Hub's XSRF token.
``GET /hub/api/budgethub/users/{name}/sessions`` gives the same rows as JSON (the page
polls it to raise a browser notification when a queued session starts), and ``POST
…/sessions/delete-snapshots`` ``{"server": name}`` deletes a stopped server's
snapshots. Both answer only the user themself (404 to anyone else, as for snapshots).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from scheduler_core.model import Allocation, PoolKind, Request
from scheduler_core.store import SnapshotRecord
from spawner.admin import AdminError, json_body
from spawner.hub.embedded import BudgetScheduler
from spawner.hub.pages import running_scheduler
from spawner.hubapi import split_request_id
from spawner.readmodel.status import amount

STATES = ("running", "starting", "queued", "snapshot", "stopped")
"""A row's state: a server that answers, one granted and starting, one waiting in the
queue, a stopped server whose snapshot is its latest state (offered: Start restores it),
or a stopped server whose snapshot is older than its last session (kept, not offered)."""


@dataclass
class SessionRow:
    """One of the user's sessions, as the page and the JSON API show it."""

    server: str
    """The server's name ('' for the default server)."""
    state: str
    node: str = ""
    slices: str = ""
    """What it holds (or asks for): ``1 GPU, 2 CPU, 4 GiB``."""
    funding: str = ""
    """``funded``, ``unallocated`` or ``not yet weighed`` ('' for a snapshot)."""
    protected_until: float | None = None
    """Until when a funded session cannot be preempted (None: not protected)."""
    position: str = ""
    """``2 of 3`` in its pool, for a queued session."""
    estimated_start: float | None = None
    estimate: str = ""
    """The estimate in words, as the spawn page says it."""
    why: str = ""
    """Why a queued session waits: its verdict's codes in their words (`QueueStatus.why`)."""
    url: str = ""
    """Where the running server opens."""
    snapshot: str = ""
    """The newest snapshot's key (a snapshot row, or a server that has one)."""
    offered: bool = False
    """The snapshot is the server's latest state: a start restores it."""
    snapshot_line: str = ""
    """What the snapshot holds and when it was taken, and what this row's buttons do
    with it."""
    options: dict[str, Any] = field(default_factory=dict)
    """The options of its last accepted start (Start and Start fresh send them again)."""

    @property
    def label(self) -> str:
        return self.server or "default server"

    def json(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


def holds(request: Request, unit: str) -> str:
    """``1 GPU, 2 CPU, 4 GiB`` (``0.25 GPU`` for a slice, ``MIG 1g.10gb`` for MIG)."""
    parts = []
    if unit == "GPU":
        if request.mig is not None:
            parts.append(
                f"MIG {request.mig}" + (f" × {request.nodes}" if request.nodes > 1 else "")
            )
        else:
            parts.append(f"{amount(request.gpu_weight)} GPU")
    parts.append(f"{amount(request.cpus * request.nodes)} CPU")
    parts.append(f"{amount(request.memory_gib * request.nodes)} GiB")
    return ", ".join(parts)


def _unit(scheduler: BudgetScheduler, pool: str) -> str:
    pool_obj = scheduler.core_pools.get(pool)
    return "GPU" if pool_obj is None or pool_obj.kind is PoolKind.GPU else "CPU"


def _running_row(
    scheduler: BudgetScheduler, allocation: Allocation, server: str, ready: bool
) -> SessionRow:
    request = allocation.request
    return SessionRow(
        server=server,
        state="running" if ready else "starting",
        node=", ".join(allocation.node_names),
        slices=holds(request, _unit(scheduler, request.pool)),
        funding="funded" if allocation.funded else "unallocated",
        # An unallocated session's protected_until is only the end of its grace.
        protected_until=allocation.protected_until if allocation.funded else None,
    )


def _queued_row(scheduler: BudgetScheduler, request_id: str, request: Request) -> SessionRow:
    _user, server = split_request_id(request_id)
    row = SessionRow(
        server=server, state="queued", slices=holds(request, _unit(scheduler, request.pool))
    )
    status = scheduler.view.queue_status(request_id)
    if status is not None:
        row.position = f"{status.position} of {status.waiting}"
        row.funding = {True: "funded", False: "unallocated", None: "not yet weighed"}[status.funded]
        row.estimated_start = status.estimated_start
        row.estimate = status.estimate
        row.why = status.why
    return row


def rows_of(scheduler: BudgetScheduler, user: Any) -> list[SessionRow]:
    """Every running, starting, queued and snapshotted session of ``user`` (a Hub User)."""
    name = user.name
    rows: dict[str, SessionRow] = {}
    for request_id, allocation in list(scheduler.core.running.items()):
        if allocation.request.user == name:
            server = split_request_id(request_id)[1]
            spawner = user.spawners.get(server) if hasattr(user.spawners, "get") else None
            ready = bool(spawner is not None and spawner.ready)
            rows[server] = _running_row(scheduler, allocation, server, ready)
            if ready:
                rows[server].url = user.server_url(server)
    for request_id, request in list(scheduler.core.pending.items()):
        if request.user == name:
            row = _queued_row(scheduler, request_id, request)
            rows.setdefault(row.server, row)
    started = {
        split_request_id(r)[1]: a.start
        for r, a in list(scheduler.core.running.items())
        if a.request.user == name
    }
    for server in sorted({s.server for s in scheduler.store.list_snapshots(user=name)}):
        found = scheduler.snapshots_of(name, server)
        if found:
            _snapshot_part(scheduler, rows, name, server, found[0], started.get(server))
    for row in rows.values():
        orm = user.orm_spawners.get(row.server)
        if orm is not None and isinstance(orm.user_options, dict):
            row.options = {
                k: v for k, v in orm.user_options.items() if k not in ("restore", "fresh")
            }
    order = {s: i for i, s in enumerate(STATES)}
    return sorted(rows.values(), key=lambda r: (order[r.state], r.server))


OFFER_CONTROLS = " Start restores it; Start fresh ignores it (your files stay either way)."
"""What the buttons of a row whose snapshot is offered do with it (the page's own words:
the spawn form has a "Start fresh" box instead)."""


def _snapshot_part(
    scheduler: BudgetScheduler,
    rows: dict[str, SessionRow],
    user: str,
    server: str,
    newest: SnapshotRecord,
    started: float | None,
) -> None:
    """The row of a server that has a snapshot: a stopped server's own row (offered, or
    only kept), or the line under its running or queued row."""
    offer = scheduler.snapshot_notice(user, server)
    row = rows.get(server)
    if row is None:
        state = "snapshot" if offer else "stopped"
        row = rows[server] = SessionRow(server=server, state=state)
    row.snapshot = newest.key
    row.offered = offer is not None and (started is None or newest.created > started)
    if row.state == "snapshot":
        row.snapshot_line = (offer or "") + OFFER_CONTROLS
    elif row.state == "queued" and offer:
        row.snapshot_line = "When it starts, it restores its snapshot. " + offer
    else:
        row.snapshot_line = scheduler.kept_snapshot_notice(user, server, started) or ""


def notices_of(scheduler: BudgetScheduler, user: str) -> list[tuple[str, str]]:
    """(server, message) of the user's notices not read yet (an admin's cancel, a
    preemption): the spawn form shows them too."""
    return sorted(
        (server, text) for (who, server), text in scheduler.notices.items() if who == user
    )


class MySessionsHandler(BaseHandler):  # type: ignore[misc]
    """``/hub/budgethub/sessions``: the page."""

    @web.authenticated
    async def get(self) -> None:
        user = self.current_user
        scheduler = running_scheduler()
        rows = rows_of(scheduler, user) if scheduler else []
        html = await self.render_template(
            "sessions.html",
            user=user,
            rows=rows,
            notices=notices_of(scheduler, user.name) if scheduler else [],
            broken=None if scheduler else "The budget scheduler is not running yet.",
            clock=_clock,
            rows_json=json.dumps([r.json() for r in rows]),
            updated=time.strftime("%H:%M:%S"),
        )
        self.finish(html)


def _clock(epoch: float | None) -> str:
    if epoch is None:
        return "—"
    return time.strftime("%H:%M", time.localtime(epoch))


class SessionsAPIHandler(APIHandler):  # type: ignore[misc]
    """The rows as JSON, and deleting a stopped server's snapshots (the user's own only)."""

    def _own(self, user_name: str) -> BudgetScheduler:
        current = self.current_user
        if getattr(current, "kind", None) != "user" or current.name != user_name:
            raise web.HTTPError(404, "%s", f"user: no sessions of {user_name!r} for you")
        scheduler = running_scheduler()
        if scheduler is None:
            raise web.HTTPError(503, "the budget scheduler is not running")
        return scheduler

    @needs_scope("read:servers")  # type: ignore[untyped-decorator]
    async def get(self, user_name: str, action: str | None = None) -> None:
        scheduler = self._own(user_name)
        if action is not None:
            raise web.HTTPError(405, "%s", "action: use POST to delete snapshots")
        user = self.current_user
        rows = rows_of(scheduler, user)
        self.set_header("Content-Type", "application/json")
        self.finish(
            json.dumps(
                {
                    "sessions": [r.json() for r in rows],
                    "notices": [
                        {"server": s, "message": m} for s, m in notices_of(scheduler, user.name)
                    ],
                }
            )
        )

    @needs_scope("servers")  # type: ignore[untyped-decorator]
    async def post(self, user_name: str, action: str | None = None) -> None:
        scheduler = self._own(user_name)
        if action != "delete-snapshots":
            raise web.HTTPError(404, "%s", "action: the only action is delete-snapshots")
        try:
            body = json_body(self.request.body or b"{}")
        except AdminError as error:  # a NaN or an infinity, named where it is
            raise web.HTTPError(400, "%s", f"{error.field}: {error.reason}") from None
        except (ValueError, UnicodeDecodeError):
            raise web.HTTPError(400, "%s", "body: is not JSON") from None
        if not isinstance(body, dict) or set(body) - {"server"}:
            raise web.HTTPError(400, "%s", 'body: must be {"server": name}')
        server = body.get("server", "")
        if not isinstance(server, str):
            raise web.HTTPError(400, "%s", f"server: must be a server name (text), not {server!r}")
        if not scheduler.snapshots_of(user_name, server):
            raise web.HTTPError(
                400, "%s", f"server: {server or 'your default server'!r} has no snapshot"
            )
        if (user_name, server) in {split_request_id(r) for r in scheduler.core.running}:
            raise web.HTTPError(400, "%s", "server: it is running; stop it first")
        deleted = scheduler.delete_snapshots(user_name, server)
        self.log.info("budgethub: %s deleted %d snapshots of server %r", user_name, deleted, server)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"server": server, "deleted": deleted}))


HANDLERS = [
    (r"/budgethub/sessions/?", MySessionsHandler),
    (r"/api/budgethub/users/([^/]+)/sessions/?", SessionsAPIHandler),
    (r"/api/budgethub/users/([^/]+)/sessions/(delete-snapshots)", SessionsAPIHandler),
]
