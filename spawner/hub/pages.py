"""What budgethub's overrides of the Hub's own templates show (``spawner/hub/templates/``).

``configure_hub`` puts ``page_vars`` into ``c.JupyterHub.template_vars`` as
``budgethub``: the Hub calls it with the logged-in user for every page it renders,
so the home page's banner, its queued servers and the admin page's queue come from
the same read model as the spawn page's messages. It only reads; a scheduler that
has not started (or is in safe mode) gives ``None`` and the pages look as stock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from spawner.hubapi import split_request_id
from spawner.profiles import rounded_duration

BUDGET_SERVICE = "budget"
"""The hub-managed service whose "My budget" page the banner links to."""


@dataclass(frozen=True, slots=True)
class TeamLine:
    team: str
    line: str
    """``gpu: holds 2 GPU funded of a 2 GPU share (bursts to 2.5 GPU); 1% of its 7-day …``."""


@dataclass(frozen=True, slots=True)
class QueuedServer:
    """A user's server that waits in the queue (the home page shows it as queued)."""

    name: str
    position: int
    waiting: int
    funded: bool | None
    estimate: str
    """What the estimated start rests on, as the queue message says it."""

    @property
    def label(self) -> str:
        return f"queued, position {self.position} of {self.waiting}"


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One waiting request, for the admin page."""

    user: str
    server: str
    team: str
    profile: str
    pool: str
    position: int
    waiting: int
    waited: str
    reason: str
    request_id: str = ""
    """The request's id (the queue's cancel and priority actions name it)."""
    priority: int = 0
    team_position: str = ""
    """``1 of 2`` inside its team's queue, which its priority orders."""


@dataclass
class PageVars:
    """``budgethub`` in the Hub's templates."""

    budget_url: str
    teams: list[TeamLine] = field(default_factory=list)
    queued: dict[str, QueuedServer] = field(default_factory=dict)
    """Server name ('' for the default one) → its place in the queue."""
    queue: list[QueueRow] = field(default_factory=list)
    """Every waiting request in admission order (filled for admins only)."""
    snapshot_notice: str | None = None
    """Issue 10's "you have a snapshot" notice: the home template shows it when set."""

    @property
    def status_line(self) -> str:
        return " · ".join(f"{t.team} — {t.line}" for t in self.teams)


def page_vars(user: Any) -> PageVars | None:
    """The figures the overridden templates show for ``user`` (None: stock pages)."""
    if user is None or not hasattr(user, "groups"):
        return None
    from jupyterhub.app import JupyterHub

    from spawner.hub.embedded import BudgetScheduler
    from spawner.hub.spawner import estimate_words

    if not BudgetScheduler.initialized():
        return None
    scheduler = BudgetScheduler.instance()
    if not scheduler.started:
        return None
    base = JupyterHub.instance().base_url if JupyterHub.initialized() else "/"
    found = PageVars(budget_url=f"{base}services/{BUDGET_SERVICE}/")
    view = scheduler.view
    core = scheduler.core
    pools = list(scheduler.core_pools)
    for team in scheduler.team_of_groups([g.name for g in user.groups]):
        lines = [view.team_status(team, pool).line() for pool in pools]
        found.teams.append(TeamLine(team, "; ".join(lines)))
    now = time.time()
    for request_id, request in list(core.pending.items()):
        if request.user != user.name:
            continue
        status = view.queue_status(request_id)
        if status is None:
            continue
        _user, server = split_request_id(request_id)
        found.queued[server] = QueuedServer(
            server,
            status.position,
            status.waiting,
            status.funded,
            estimate_words(
                status.funded,
                status.estimated_start,
                now,
                starts_now=status.starts_now,
                basis=status.basis,
            ),
        )
    found.snapshot_notice = scheduler.home_snapshot_notice(user.name)
    if getattr(user, "admin", False):
        for request_id, request in list(core.pending.items()):
            status = view.queue_status(request_id)
            if status is None:
                continue
            _user, server = split_request_id(request_id)
            if status.funded is None:
                reason = "not weighed yet"
            elif status.funded:
                reason = (
                    f"funded; waits for {status.position - 1} ahead and free slices"
                    if status.position > 1
                    else "funded; waits for free slices (or a session's protection to end)"
                )
            else:
                reason = "over its team's allocation: waits for idle capacity (unallocated)"
            found.queue.append(
                QueueRow(
                    user=request.user,
                    server=server,
                    team=request.team,
                    profile=request.profile or "",
                    pool=request.pool,
                    position=status.position,
                    waiting=status.waiting,
                    waited=rounded_duration(now - request.submit),
                    reason=reason,
                    request_id=request_id,
                    priority=request.priority,
                    team_position=f"{status.team_position} of {status.team_waiting}",
                )
            )
        found.queue.sort(key=lambda r: (r.pool, r.position))
    return found
