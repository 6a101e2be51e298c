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

from jupyterhub.app import JupyterHub

from scheduler_core.model import Request
from spawner.hub.embedded import BudgetScheduler
from spawner.hubapi import split_request_id
from spawner.profiles import rounded_duration
from spawner.readmodel.status import QueueStatus

BUDGET_SERVICE = "budget"
"""The hub-managed service whose "My budget" page the banner links to."""


@dataclass(frozen=True, slots=True)
class TeamLine:
    team: str
    line: str
    """``gpu: holds 2 GPU funded of a 2 GPU share (bursts to 2.5 GPU); 1% of its 7-day …``."""


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One waiting request on the admin page: the request, its status as the read model
    has it (position, why it waits), and how long it has waited."""

    request_id: str
    """The request's id (the queue's cancel and priority actions name it)."""
    request: Request
    status: QueueStatus
    waited: str

    @property
    def server(self) -> str:
        return split_request_id(self.request_id)[1]


@dataclass
class PageVars:
    """``budgethub`` in the Hub's templates."""

    budget_url: str
    teams: list[TeamLine] = field(default_factory=list)
    queued: dict[str, QueueStatus] = field(default_factory=dict)
    """Server name ('' for the default one) → its place in the queue, why it waits and
    its estimated start."""
    queue: list[QueueRow] = field(default_factory=list)
    """Every waiting request in admission order (filled for admins only)."""
    snapshot_notice: str | None = None
    """Issue 10's "you have a snapshot" notice: the home template shows it when set."""

    @property
    def status_line(self) -> str:
        return " · ".join(f"{t.team} — {t.line}" for t in self.teams)


def running_scheduler() -> BudgetScheduler | None:
    """The Hub's embedded scheduler once it has started (None before, or in safe mode)."""
    if not BudgetScheduler.initialized():
        return None
    scheduler = BudgetScheduler.instance()
    return scheduler if scheduler.started else None


def page_vars(user: Any) -> PageVars | None:
    """The figures the overridden templates show for ``user`` (None: stock pages)."""
    if user is None or not hasattr(user, "groups"):
        return None
    scheduler = running_scheduler()
    if scheduler is None:
        return None
    base = JupyterHub.instance().base_url if JupyterHub.initialized() else "/"
    return figures(
        scheduler,
        user.name,
        [g.name for g in user.groups],
        base,
        admin=bool(getattr(user, "admin", False)),
    )


def figures(
    scheduler: BudgetScheduler, name: str, groups: list[str], base: str = "/", *, admin: bool
) -> PageVars:
    """The figures for the user ``name`` in ``groups``: the team banner, their queued
    servers and (``admin``) the admin page's queue, every one from the read model."""
    found = PageVars(budget_url=f"{base}services/{BUDGET_SERVICE}/")
    view = scheduler.view
    for team in scheduler.team_of_groups(groups):
        lines = [view.team_status(team, pool).line() for pool in scheduler.core_pools]
        found.teams.append(TeamLine(team, "; ".join(lines)))
    now = time.time()
    for request_id, request in list(scheduler.core.pending.items()):
        mine = request.user == name
        if not (mine or admin):
            continue
        status = view.queue_status(request_id)
        if status is None:
            continue
        if mine:
            found.queued[split_request_id(request_id)[1]] = status
        if admin:
            waited = rounded_duration(now - request.submit)
            found.queue.append(QueueRow(request_id, request, status, waited))
    found.queue.sort(key=lambda r: (r.request.pool, r.status.position))
    found.snapshot_notice = scheduler.home_snapshot_notice(name)
    return found
