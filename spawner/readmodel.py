"""The queue and budget read model: where a request is, why it waits, what a team's
budget looks like, and the notices a user still has to read.

The one place that answers these, for the spawn page now and the budget service
later, so both always agree. It only reads the core's state (and the event log,
for notices); it changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler_core.model import PoolKind, Request
from scheduler_core.outlook import admission_order
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import EventRecord
from spawner.hubapi import split_request_id

NOTICE_EVENTS = ("submit", "preempt", "exit")


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """Where a waiting request stands, for ``progress()``."""

    position: int
    """1-based, among the requests waiting for the same pool."""
    waiting: int
    team_position: int
    team_waiting: int
    funded: bool | None
    """Would it be funded if it started now (None: not yet weighed)."""
    protected_s: float
    estimated_start: float | None
    """Wall time (epoch seconds) by which enough running sessions should have ended."""
    unit: str = "GPU"
    """What the pool's figures below count: GPU (GPU-equivalents) or CPU."""
    team_funded: float = 0.0
    """What the team's funded sessions in the pool hold now."""
    team_share: float = 0.0
    """The team's share of the pool, in the same units."""
    budget_used: float | None = None
    """The team's charged usage over the window, as a fraction of its budget."""
    window_days: float = 7.0
    """The lookback window, in days."""
    ahead: frozenset[str] = frozenset()
    """The requests ahead of this one now."""
    other_teams: bool = False
    """Requests of other teams wait in the pool too (so the order can move)."""


def notices_from(events: Iterable[EventRecord]) -> dict[tuple[str, str], str]:
    """The "your session was stopped" notices still to show, per (user, server name),
    from the event log in order: a preemption (or a container that ended badly) sets
    its server's notice, a later submit for that server (the user started again)
    clears it."""
    notices: dict[tuple[str, str], str] = {}
    for event in events:
        if event.kind not in NOTICE_EVENTS:
            continue
        try:
            session = split_request_id(str(event.payload.get("request", "")))
        except ValueError:
            continue
        if event.kind == "submit":
            notices.pop(session, None)
        elif event.kind == "exit" and not event.payload.get("notify"):
            continue
        elif event.payload.get("message"):
            notices[session] = str(event.payload["message"])
    return notices


class QueueView:
    """Read-only answers about the queue and budgets of one running core."""

    def __init__(self, core: Scheduler) -> None:
        self.core = core
        self._order: dict[str, None] = {}
        """Waiting requests in projected admission order (`scheduler_core.outlook`)."""
        self._stale = True

    def changed(self) -> None:
        """A cycle ran: positions are worked out again when next asked."""
        self._stale = True

    def queue_status(self, request_id: str) -> QueueStatus | None:
        """Position in the queue (overall in the pool, inside the team) and an estimate."""
        core = self.core
        request = core.pending.get(request_id)
        if request is None:
            return None
        if self._stale:
            now = time.time()
            self._order = dict.fromkeys(admission_order(core.snapshot(now), now))
            self._stale = False
        same_pool = [
            r for r in self._order if r in core.pending and core.pending[r].pool == request.pool
        ]
        if request_id not in same_pool:
            same_pool.append(request_id)
        position = same_pool.index(request_id) + 1
        team = [r for r in same_pool if core.pending[r].team == request.team]
        funded = core.funded.get(request_id)
        ahead = [core.pending[r] for r in same_pool[: position - 1]]
        pool = request.pool
        return QueueStatus(
            position=position,
            waiting=len(same_pool),
            team_position=team.index(request_id) + 1,
            team_waiting=len(team),
            funded=funded,
            protected_s=request.min_runtime if funded else 0.0,
            estimated_start=self.estimate(request, ahead),
            unit="CPU" if core.pools[pool].kind is PoolKind.CPU else "GPU",
            team_funded=core.funded_rate(request.team, pool),
            team_share=core.teams.share(request.team, pool) * core.capacity[pool],
            budget_used=self.budget_used(request.team, pool),
            window_days=core.settings.lookback / 86400,
            ahead=frozenset(same_pool[: position - 1]),
            other_teams=len(team) < len(same_pool),
        )

    def why_behind(self, request_id: str, passed_by: Iterable[str]) -> str:
        """Why requests that were not ahead of this one are ahead now (the policy ranks
        teams again after every admission), in words for its user."""
        request = self.core.pending.get(request_id)
        others = [self.core.pending[r] for r in passed_by if r in self.core.pending]
        if request is None or not others:
            return "the queue was weighed again"
        reasons = []
        if any(r.team != request.team for r in others):
            reasons.append("other teams are further under their share than yours")
        if any(r.team == request.team for r in others):
            reasons.append("your team has a request of higher priority")
        return " and ".join(reasons)

    def estimate(self, request: Request, ahead: list[Request]) -> float | None:
        """When running sessions of the pool, ending as their protected windows do, free
        the GPU-equivalents (or cores) of this request and those ahead of it."""
        kind = self.core.pools[request.pool].kind
        need = request.charge_rate(kind) + sum(r.charge_rate(kind) for r in ahead)
        ends = sorted(
            (a.protected_until, a.charge_rate if a.funded else a.request.charge_rate(kind))
            for a in self.core.running.values()
            if a.pool == request.pool
        )
        freed = 0.0
        for end, units in ends:
            freed += units
            if freed >= need:
                return max(end, time.time())
        return None

    def budget_used(self, team: str, pool: str) -> float | None:
        """The team's charged usage over the window as a fraction of its budget in the
        pool (None: it has no budget there)."""
        core = self.core
        lookback = core.settings.lookback
        budget = core.teams.share(team, pool) * core.capacity[pool] * lookback
        if budget <= 0:
            return None
        now = time.time()
        return core.ledger.charged(team, pool, now - lookback, now) / budget

    def team_hint(self, team: str, pools: Iterable[str]) -> str:
        """A short line about a team's budget: how much of it is used, per pool."""
        parts = []
        for pool_name in pools:
            used = self.budget_used(team, pool_name)
            if used is not None:
                parts.append(f"{pool_name}: {used:.0%} of budget used")
        return f"({'; '.join(parts)})" if parts else ""
