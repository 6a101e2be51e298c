"""An administrator's control of the budget scheduler's queue (issue 41), over the Hub's REST API.

``POST /hub/api/budgethub/queue/cancel`` ``{"request": id, "reason": "…"}`` takes a queued
request out: its spawner fails with the reason, which the spawn page, the spawn form and
My sessions show its user. ``POST /hub/api/budgethub/queue/priority`` ``{"request": id,
"priority": n}`` changes its declared priority, which orders only its own team's queue
(teams stay in the policy's order). Both are written to the audit log as share changes are.

They run in the Hub's process, not the budget service's: the spawner that waits for the
request lives here, and the Hub's admin page (whose "Server is pending" button they serve)
is here too. Only a Hub admin (or a token with unfiltered ``admin:servers``) may call them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import Scope
from jupyterhub.spawner import SpawnException
from tornado import web

from spawner.hub.embedded import BudgetScheduler
from spawner.hubapi import split_request_id
from spawner.profiles import MAX_PRIORITY

MAX_REASON = 500
"""The most characters an admin's reason for a cancel may have."""


class QueueError(web.HTTPError):
    """A refused queue action: ``field`` names what is wrong."""

    def __init__(self, status: int, field: str, reason: str) -> None:
        super().__init__(status, "%s", f"{field}: {reason}")
        self.field = field
        self.jupyterhub_message = f"{field}: {reason}"


@dataclass(frozen=True, slots=True)
class Done:
    """What an action did, as the API answers it."""

    request: str
    action: str
    old: Any
    new: Any

    def json(self) -> dict[str, Any]:
        return {"request": self.request, "action": self.action, "old": self.old, "new": self.new}


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


def queued_request(scheduler: BudgetScheduler, request_id: Any) -> str:
    """``request_id`` if it names a request waiting in the queue, else a 400 naming it."""
    if not isinstance(request_id, str) or not request_id:
        raise QueueError(400, "request", f"must be a request id (text), not {request_id!r}")
    if request_id not in scheduler.core.pending:
        shown = request_id if len(request_id) <= 80 else request_id[:80] + "…"
        raise QueueError(
            400,
            "request",
            f"no request {shown!r} waits in the queue (it started, left or never was)",
        )
    return request_id


def cancel_message(reason: str, now: float) -> str:
    """What the user is told (the admin's name is not: other users' names are for admins)."""
    why = f": {reason}" if reason else " (no reason was given)"
    return (
        f"An administrator took your request out of the queue at {_clock(now)}{why}. "
        "Nothing was started and your team was charged nothing; start again when you like."
    )


def cancel(scheduler: BudgetScheduler, actor: str, request_id: Any, reason: Any) -> Done:
    """Take a queued request out; its user is told why; the audit log says who did it."""
    request_id = queued_request(scheduler, request_id)
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        raise QueueError(400, "reason", f"must be text, not {type(reason).__name__}")
    reason = " ".join(reason.split())
    if len(reason) > MAX_REASON:
        raise QueueError(
            400, "reason", f"must be at most {MAX_REASON} characters, not {len(reason)}"
        )
    now = time.time()
    message = cancel_message(reason, now)
    session = split_request_id(request_id)
    error = SpawnException(message, reason="admin-cancel", status_code=409)
    error.jupyterhub_message = message
    scheduler.notices[session] = message
    if not scheduler.withdraw(request_id, error, f"cancelled by an administrator: {reason}"):
        raise QueueError(400, "request", f"{request_id!r} no longer waits in the queue")
    # An "exit" event with a message: the notice outlives a Hub restart (readmodel.notices_from).
    scheduler.store.append_event(
        now, "exit", {"request": request_id, "notify": True, "message": message, "by": actor}
    )
    new = f"cancelled: {reason}" if reason else "cancelled"
    scheduler.admin.change(actor, now, {}, [(f"queue.{request_id}", "queued", new)])
    return Done(request_id, "cancel", "queued", new)


def set_priority(scheduler: BudgetScheduler, actor: str, request_id: Any, priority: Any) -> Done:
    """A queued request's new declared priority: its place inside its own team's queue."""
    request_id = queued_request(scheduler, request_id)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise QueueError(
            400, "priority", f"must be a whole number from 0 to {MAX_PRIORITY}, not {priority!r}"
        )
    if not 0 <= priority <= MAX_PRIORITY:
        raise QueueError(400, "priority", f"must be between 0 and {MAX_PRIORITY}, not {priority}")
    old = scheduler.reprioritize(request_id, priority)
    scheduler.admin.change(
        actor, time.time(), {}, [(f"queue.{request_id}.priority", old, priority)]
    )
    return Done(request_id, "priority", old, priority)


class QueueAPIHandler(APIHandler):  # type: ignore[misc]
    """``POST …/queue/cancel`` and ``…/queue/priority`` (see the module's docstring)."""

    def _actor(self) -> str:
        current = self.current_user
        if current is None:
            raise QueueError(403, "admin", "log in as an administrator")
        if getattr(current, "kind", None) == "user" and getattr(current, "admin", False):
            return str(current.name)
        if self.parsed_scopes.get("admin:servers") == Scope.ALL:
            return str(current.name)
        raise QueueError(403, "admin", "only an administrator may change the queue")

    def _body(self) -> dict[str, Any]:
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise QueueError(400, "body", "is not JSON") from None
        if not isinstance(body, dict):
            raise QueueError(400, "body", f"must be a JSON object, not {type(body).__name__}")
        return body

    async def post(self, action: str) -> None:
        actor = self._actor()
        body = self._body()
        scheduler = BudgetScheduler.instance()
        if not scheduler.started:
            raise QueueError(503, "scheduler", "the budget scheduler is not running")
        if action == "cancel":
            extra = set(body) - {"request", "reason"}
            if extra:
                raise QueueError(400, sorted(extra)[0], "unknown field (fields: request, reason)")
            done = cancel(scheduler, actor, body.get("request"), body.get("reason"))
        else:
            extra = set(body) - {"request", "priority"}
            if extra:
                raise QueueError(400, sorted(extra)[0], "unknown field (fields: request, priority)")
            if "priority" not in body:
                raise QueueError(400, "priority", "is required")
            done = set_priority(scheduler, actor, body.get("request"), body["priority"])
        self.log.info(
            "budgethub: admin %s: %s of %s (%s)", actor, done.action, done.request, done.new
        )
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(done.json()))


HANDLERS = [(r"/api/budgethub/queue/(cancel|priority)", QueueAPIHandler)]
