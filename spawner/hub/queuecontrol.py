"""An administrator's control of the budget scheduler's queue (issue 41), over the Hub's REST API.

``POST /hub/api/budgethub/queue/cancel`` ``{"request": id, "reason": "…"}`` takes a queued
request out: its spawn ends as a cancelled one (the spawn page goes to the form, as when
the user leaves the queue), and the spawn form and My sessions show its user the reason
under a heading of its own until the user has seen it on the form or starts again. A
cancel is a notice, not a failure: nothing is logged as an error (the Hub logs a failed
spawn at ERROR twice, "Not starting …" and "Previous spawn for … failed"), the
action is logged at INFO with its reason.

``POST /hub/api/budgethub/queue/priority`` ``{"request": id, "priority": n}`` changes its
declared priority, which orders only its own team's queue (teams stay in the policy's
order). Both are written to the audit log as share changes are.

They run in the Hub's process, not the budget service's: the spawner that waits for the
request lives here, and the Hub's admin page (whose "Server is pending" button they serve)
is here too. Only a Hub admin (or a token with unfiltered ``admin:servers``) may call them.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import Scope
from tornado import web

from spawner.admin import AdminError, json_body
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


CANCEL_HEADING = "Taken out of the queue"
"""The heading of an admin's cancel on the spawn form (a notice, not "Spawn failed")."""
_CANCEL_OPENING = "An administrator took your request out of the queue"
SHOW_PAUSE = 0.25
"""Seconds the open spawn pages get to show the cancel's words before the spawn ends."""


def cancel_message(reason: str, now: float) -> str:
    """What the user is told (the admin's name is not: other users' names are for admins)."""
    why = f": {reason}" if reason else " (no reason was given)"
    return (
        f"{_CANCEL_OPENING} at {_clock(now)}{why}. "
        "Nothing was started and your team was charged nothing; start again when you like."
    )


def is_cancel_notice(notice: str) -> bool:
    """Is this notice an admin's cancel (`cancel_message`)?"""
    return notice.startswith(_CANCEL_OPENING)


def notice_seen(scheduler: BudgetScheduler, user: str, server: str) -> None:
    """The user has seen the notice of ``server`` (shown once): gone from the form and My
    sessions, and, through a ``notice-seen`` event, after a Hub restart too."""
    if scheduler.notices.pop((user, server), None) is None:
        return
    scheduler.store.append_event(time.time(), "notice-seen", {"request": f"{user}/{server}/"})


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
    scheduler.notices[session] = message
    if not scheduler.withdraw(request_id, f"cancelled by an administrator: {reason}"):
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
            body = json_body(self.request.body or b"{}")
        except AdminError as error:  # a NaN or an infinity, named where it is
            raise QueueError(400, error.field, error.reason) from None
        except (ValueError, UnicodeDecodeError):
            raise QueueError(400, "body", "is not JSON") from None
        if not isinstance(body, dict):
            raise QueueError(400, "body", f"must be a JSON object, not {type(body).__name__}")
        return body

    async def _end_spawn(self, scheduler: BudgetScheduler, request_id: str) -> None:
        """End the withdrawn request's waiting spawn as the Hub ends one its user leaves
        (the REST stop of a pending server): the open spawn pages show the admin's words,
        the spawn is cancelled (their streams end "Spawn cancelled" and they go to the
        form), and the server is stopped, which clears it."""
        name, server = split_request_id(request_id)
        user = self.find_user(name)
        spawner = user.spawners.get(server) if user is not None else None
        future = getattr(spawner, "_spawn_future", None)
        if spawner is None or spawner.pending != "spawn" or future is None:
            return  # no spawn waits for it (queued before a Hub restart, not yet taken up)
        shown = getattr(spawner, "withdrawn", None)
        if shown is not None:
            shown(scheduler.notices.get((name, server), ""))
            await asyncio.sleep(SHOW_PAUSE)
        if not future.done():
            future.cancel()
        await asyncio.wait([future], timeout=10)
        for _ in range(50):  # the Hub's own done-callbacks clear the pending flag
            if not spawner.pending:
                break
            await asyncio.sleep(0.02)
        if not spawner.pending:
            await self.stop_single_user(user, server)

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
            await self._end_spawn(scheduler, done.request)
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
