"""The queue and budget read model: where a request is, why it waits, what a team's
budget looks like, and the notices a user still has to read.

The one place that answers these, for the spawn page now and the budget service
later, so both always agree. It only reads the core's state (and the event log,
for notices); it changes nothing.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler_core.kept import Queued
from scheduler_core.model import Health, NodeGrant, PoolKind, Request
from scheduler_core.outlook import admission_order
from scheduler_core.ranking import PoolRanking
from scheduler_core.rules import funds
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import EventRecord
from scheduler_core.view import ClusterView
from spawner.hubapi import split_request_id

NOTICE_EVENTS = ("submit", "preempt", "exit")


# -- how figures are written: one helper each, for the spawn page and the budget service --


def amount(value: float) -> str:
    """A GPU (or CPU, or GiB) amount: at most 2 decimals, trailing zeros dropped (``2.14``,
    ``0.5``, ``3``); ``<0.01`` for a positive amount too small to show, ``—`` for none."""
    if not math.isfinite(value):
        return "—"
    if 0 < abs(value) < 0.005:
        return "<0.01" if value > 0 else "-<0.01"
    if abs(value) >= 1e9:
        return ">999,999,999" if value > 0 else "<-999,999,999"
    if abs(value) >= 100_000:
        return f"{value:,.0f}"
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def percent(fraction: float | None) -> str:
    """A fraction as a percentage: whole percents from 10 % (``25%``), one decimal below
    (``2.5%``), ``<0.1%`` below that, and never more than ``>999,999%``."""
    if fraction is None or not math.isfinite(fraction):
        return "—"
    if fraction < 0:
        return "-" + percent(-fraction)
    p = fraction * 100
    if p == 0:
        return "0%"
    if 0 < p < 0.1:
        return "<0.1%"
    if p < 10:
        return f"{p:.1f}".rstrip("0").rstrip(".") + "%"
    if p < 1_000_000:
        return f"{p:,.0f}%"
    return ">999,999%"


def number(value: float | None) -> str:
    """A plain figure such as a ratio: 2 decimals below 100, whole numbers up to a
    million, ``>999,999`` beyond; ``—`` for none."""
    if value is None or not math.isfinite(value):
        return "—"
    if abs(value) < 100:
        return f"{value:.2f}"
    if abs(value) < 1_000_000:
        return f"{value:,.0f}"
    return ">999,999" if value > 0 else "<-999,999"


def plural(n: float, word: str, many: str | None = None) -> str:
    """``1 request``, ``2 requests`` (``many``: the plural when it is not ``word + s``)."""
    text = amount(n) if isinstance(n, float) and not n.is_integer() else f"{n:g}"
    return f"{text} {word if n == 1 else (many or word + 's')}"


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
    team_status: TeamStatus | None = None
    """The team's holdings in the pool now, against its share and burst."""


@dataclass(frozen=True, slots=True)
class TeamStatus:
    """What a team holds in one pool now, against its share, and its window budget."""

    team: str
    pool: str
    unit: str
    """GPU (GPU-equivalents) or CPU (cores)."""
    funded: float
    """What its funded sessions hold now."""
    unallocated: float
    """What its unallocated sessions hold now."""
    share: float
    """Its share of the pool, in units: what is funded whatever the window says."""
    burst: float | None
    """The most its funded sessions may hold while within its window budget (None: no cap)."""
    budget_used: float | None
    """Charged usage over the window, as a fraction of its budget (None: no budget)."""
    window_days: float

    def line(self) -> str:
        """One line: ``gpu: holds 2 GPU funded (+1 unallocated) of a 2 GPU share (bursts to
        2.5 GPU); 1% of its 7-day budget used``."""
        extra = f" (+{amount(self.unallocated)} unallocated)" if self.unallocated > 0 else ""
        if self.share <= 0:
            held = f"holds {amount(self.unallocated)} {self.unit} unallocated" if extra else ""
            return f"{self.pool}: no share here (its work runs unallocated){held and '; '}{held}"
        burst = f" (bursts to {amount(self.burst)} {self.unit})" if self.burst else ""
        used = (
            f"; {percent(self.budget_used)} of its {self.window_days:g}-day budget used"
            if self.budget_used is not None
            else ""
        )
        return (
            f"{self.pool}: holds {amount(self.funded)} {self.unit} funded{extra} of a "
            f"{amount(self.share)} {self.unit} share{burst}{used}"
        )


@dataclass(frozen=True, slots=True)
class Outlook:
    """What a session asked for now would get: funding, place in the queue, estimate."""

    funded: bool
    protected_s: float
    """Its protected window if funded (0 when unallocated)."""
    why: str
    """Why it would run unallocated, in words (empty when funded)."""
    position: int
    """Its place among the pool's waiting requests if asked for now (1-based)."""
    waiting: int
    """How many would wait in the pool with it."""
    free_now: int
    """How many sessions of this shape the pool's free slices hold now (at most 99)."""
    estimated_start: float | None
    """Now if it fits and nothing is ahead; else the same estimate queue messages give;
    None when running sessions ending at their protection would not free enough."""
    team_status: TeamStatus


def unallocated_why(status: TeamStatus, who: str = "your team") -> str:
    """Why a request of the team would run unallocated (the queue message's words; the
    budget service's My budget and Queue pages say the same)."""
    if status.share <= 0:
        return f"{who} has no share of the {status.pool} pool"
    return (
        f"over what {who}'s allocation funds now (its funded sessions hold "
        f"{amount(status.funded)} {status.unit}, its share is {amount(status.share)} {status.unit}"
        + (
            f"; {percent(status.budget_used)} of its {status.window_days:g}-day budget used"
            if status.budget_used is not None
            else ""
        )
        + ")"
    )


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
            self._order = dict.fromkeys(admission_order(core.view(now), now))
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
            team_status=self.team_status(request.team, pool),
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

    def team_status(self, team: str, pool: str) -> TeamStatus:
        """What the team holds in the pool now against its share and burst."""
        core = self.core
        kind = core.pools[pool].kind
        share = core.teams.share(team, pool) * core.capacity[pool]
        unallocated = sum(
            a.request.charge_rate(kind)
            for a in core.running.values()
            if a.pool == pool and a.request.team == team and not a.funded
        )
        burst = core.settings.funded_burst
        return TeamStatus(
            team=team,
            pool=pool,
            unit="CPU" if kind is PoolKind.CPU else "GPU",
            funded=core.funded_rate(team, pool),
            unallocated=unallocated,
            share=share,
            burst=burst * share if burst and share > 0 else None,
            budget_used=self.budget_used(team, pool),
            window_days=core.settings.lookback / 86400,
        )

    def outlook(self, request: Request) -> Outlook:
        """What ``request`` (not queued) would get if asked for now: funded or not (the
        policy's rule, with the team's charges as they stand), its place in the projected
        admission order, how many of its shape fit on free slices, and the estimate."""
        core = self.core
        now = time.time()
        view = core.view(now)
        pool = request.pool
        kind = core.pools[pool].kind
        entry = Queued.of(request, core.settings, kind)
        ranking_units, ranking_budget = _leaf(view, pool, request.team, now)
        status = self.team_status(request.team, pool)
        window = view.window
        funded = funds(
            ranking_budget > 0.0 and (ranking_units + entry.units) / ranking_budget <= 1.0,
            status.funded,
            entry.rate,
            ranking_budget / window if window > 0 else 0.0,
            core.settings,
        )
        asked = dataclasses.replace(view, pending=(*view.pending, request), index=None)
        order = [
            r
            for r in admission_order(asked, now)
            if r == request.id or (r in core.pending and core.pending[r].pool == pool)
        ]
        position = order.index(request.id) + 1 if request.id in order else len(order) + 1
        ahead = [core.pending[r] for r in order[: position - 1]]
        free_now = self.free_count(request, view)
        if free_now and not ahead:
            estimated: float | None = now
        else:
            estimated = self.estimate(request, ahead)
        return Outlook(
            funded=funded,
            protected_s=entry.min_runtime if funded else 0.0,
            why="" if funded else unallocated_why(status),
            position=position,
            waiting=max(len(order), position),
            free_now=free_now,
            estimated_start=estimated,
            team_status=status,
        )

    def free_count(self, request: Request, view: ClusterView | None = None, most: int = 99) -> int:
        """How many sessions shaped like ``request`` the pool's free slices hold now, on
        nodes that take new work (held nodes count too: a hint, not a promise)."""
        view = view if view is not None else self.core.view(time.time())
        free = view.free or {}
        count = 0
        for node in self.core.nodes.values():
            if node.pool != request.pool or node.health is not Health.READY:
                continue
            room = free.get(node.name)
            if room is None:
                continue
            room = room.copy()
            while count < most:
                slices = room.slices_for(request)
                if slices is None:
                    break
                room.take(NodeGrant(node.name, slices, request.cpus, request.memory_gib))
                count += 1
        return count

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
                parts.append(f"{pool_name}: {percent(used)} of budget used")
        return f"({'; '.join(parts)})" if parts else ""


def _leaf(view: ClusterView, pool: str, team: str, now: float) -> tuple[float, float]:
    """The team's charged units and budget at its own level in the pool (what funding
    is decided on), as the policy's ranking counts them."""
    return PoolRanking(view, pool, now).leaf(team)
