"""The queue and budget read model: where a request is, why it waits, what a team's
budget looks like, and the notices a user still has to read.

The one place that answers these, for the Hub's pages and the budget service, so
both always agree. It only reads the core's state (and the event log, for notices);
it changes nothing.

Why a request waits is said in one way only: the codes of its verdict (where it went
or why not, and its funding ground) in the words of `scheduler_core.verdict.MESSAGES`,
through `verdict_words`. No page writes a reason of its own.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from sqlalchemy import select

from scheduler_core.forecast import (
    Forecast,
    ForwardRun,
    History,
    forecast,
    history_key,
    run_forward,
    standing,
)
from scheduler_core.ledger import UsageLedger
from scheduler_core.model import Health, NodeGrant, PoolKind, Request, RequestClass
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import EventRecord, Store
from scheduler_core.store.models import AllocationRow, RequestRow
from scheduler_core.verdict import NO_SHARE, NOT_WEIGHED, message
from scheduler_core.view import ClusterView, Decisions
from spawner.hubapi import split_request_id
from spawner.readmodel.elsewhere import HeldCheck

NOTICE_EVENTS = ("submit", "preempt", "exit", "notice-seen")
HISTORY_TTL = 60.0
SLURM_USAGE = "slurm-usage"
"""The event of a stretch of other users' Slurm jobs charged to a team (written by
`spawner.runtime.foreign.ForeignUsage`; the read model imports no runtime)."""
SLURM_TTL = 5.0
"""Seconds one read of those events serves the budget lines."""
"""Seconds past sessions' lengths are kept before the store is asked again."""
HISTORY_DAYS = 30
"""How far back past sessions' lengths are read."""


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


def verdict_words(*codes: str) -> str:
    """Why a request waits, or would run unallocated: the words of its verdict codes
    (`verdict.MESSAGES`, through `verdict.message`), joined by ``; ``. The one way every
    page, the JSON API and the queue message say why; with no code, the words of
    `verdict.NOT_WEIGHED` (no cycle looked at it)."""
    said = [message(code) for code in codes if code]
    return "; ".join(said) if said else message(NOT_WEIGHED)


def not_funded_words(ground: str) -> str:
    """Why a request is not funded, in its verdict's words without their ``not funded:``
    lead (the sentence around them says so)."""
    return verdict_words(ground).removeprefix("not funded: ")


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


def estimate_words(
    funded: bool | None,
    estimated: float | None,
    now: float,
    *,
    starts_now: bool = False,
    basis: str = "",
) -> str:
    """When it should start and what that rests on, in words (the queue message, the
    form and the Hub's pages say the same): the next cycle run dry starts it now, or
    the scheduler run forward from the live state starts it at ``estimated``
    (`scheduler_core.forecast`); for work that would run unallocated that is no promise."""
    if starts_now:
        return "starts now"
    if estimated is None and funded is False:
        return "no start time can be promised: it starts when running sessions end"
    if estimated is None:
        return "no estimate: the scheduler run forward does not start it within 14 days"
    rests = f", if {basis}" if basis else " (the scheduler run forward)"
    if estimated <= now + 60:
        when = "starts within a minute"
    else:
        when = f"estimated start about {_clock(estimated)}"
    if funded is False:
        return f"{when}, not promised (it would run unallocated){rests}"
    return f"{when}{rests}"


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
    other_teams: bool = False
    """Requests of other teams wait in the pool too (so the order can move)."""
    team_status: TeamStatus | None = None
    """The team's holdings in the pool now, against its share and burst."""
    starts_now: bool = False
    """The next cycle, run dry, admits it."""
    basis: str = ""
    """What ``estimated_start`` rests on, in words (`History.basis`)."""
    ground: str = ""
    """The verdict's funding ground or why not funded (a `verdict` code; "": none)."""
    reason: str = ""
    """The verdict's placement, or why it was not placed (a `verdict` code; "": none)."""

    @property
    def why(self) -> str:
        """Why it waits: its verdict's placement and funding codes in their words."""
        return verdict_words(self.reason, self.ground)

    @property
    def label(self) -> str:
        return f"queued, position {self.position} of {self.waiting}"

    @property
    def estimate(self) -> str:
        """When it should start, in words, as of now (`estimate_words`)."""
        return estimate_words(
            self.funded,
            self.estimated_start,
            time.time(),
            starts_now=self.starts_now,
            basis=self.basis,
        )


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
    slurm_units: float = 0.0
    """Of the charged usage over the window, unit-seconds of batch jobs that budgethub did
    not start, seen in Slurm under the team's account."""

    def line(self) -> str:
        """One line: ``gpu: holds 2 GPU funded (+1 unallocated) of a 2 GPU share (bursts to
        2.5 GPU); 1% of its 7-day budget used``."""
        unallocated = f"{amount(self.unallocated)} {self.unit} unallocated"
        extra = f" (+{unallocated})" if self.unallocated > 0 else ""
        if self.share <= 0:  # the verdict's words (NO_SHARE), as the queue says them
            held = f"; it holds {unallocated}" if extra else ""
            return f"{self.pool}: {not_funded_words(NO_SHARE)}, so its work runs unallocated{held}"
        burst = f" (bursts to {amount(self.burst)} {self.unit})" if self.burst else ""
        used = (
            f"; {percent(self.budget_used)} of its {self.window_days:g}-day budget used"
            if self.budget_used is not None
            else ""
        )
        used += f" ({self.slurm_words()})" if self.slurm_units > 0 else ""
        return (
            f"{self.pool}: holds {amount(self.funded)} {self.unit} funded{extra} of a "
            f"{amount(self.share)} {self.unit} share{burst}{used}"
        )

    def slurm_words(self) -> str:
        """``2.5 GPU·h of it batch work seen in Slurm``."""
        return f"{amount(self.slurm_units / 3600)} {self.unit}·h of it batch work seen in Slurm"


@dataclass(frozen=True, slots=True)
class Outlook:
    """What a session asked for now would get: funding, place in the queue, estimate."""

    funded: bool
    protected_s: float
    """Its protected window if funded (0 when unallocated)."""
    why: str
    """Why it would run unallocated, in words (empty when funded)."""
    position: int
    """1 + how many of the pool's requests the next cycle, run dry with it added, looks
    at before it and leaves waiting."""
    waiting: int
    """How many of the pool's requests that cycle looks at (itself included)."""
    free_now: int
    """How many sessions of this shape the pool's free slices hold now (at most 99)."""
    estimated_start: float | None
    """Now if the dry run starts it; else its first start when the scheduler runs
    forward with it queued; None when that run does not start it (`forecast.HORIZON_S`)."""
    team_status: TeamStatus
    starts_now: bool = False
    """The next cycle, run dry with it added, admits it."""
    basis: str = ""
    """What ``estimated_start`` rests on, in words (`History.basis`)."""


def unallocated_why(status: TeamStatus, ground: str = "") -> str:
    """Why a request of the team would run unallocated: its verdict's funding code in
    its words (`not_funded_words`), with the team's figures beside them."""
    words = not_funded_words(ground)
    if status.share <= 0:
        return words
    used = (
        f"; {percent(status.budget_used)} of its {status.window_days:g}-day budget used"
        if status.budget_used is not None
        else ""
    )
    return (
        f"{words} (its funded sessions hold {amount(status.funded)} {status.unit}, its share "
        f"is {amount(status.share)} {status.unit}{used})"
    )


def usage_ledger(store: Store, since: float) -> UsageLedger:
    """The charged usage the store recorded since ``since``, replayed into a ledger (the
    Hub's core at its start and the budget service's model both start from it)."""
    ledger = UsageLedger()
    for team, pool, start, end, units in store.usage_records(since):
        if end > start:
            rate = units / (end - start)
            ledger.start_charging(team, pool, start, rate)
            ledger.stop_charging(team, pool, end, rate)
        else:
            ledger.add(team, pool, end, units)
    return ledger


def notices_from(events: Iterable[EventRecord]) -> dict[tuple[str, str], str]:
    """The "your session was stopped" notices still to show, per (user, server name),
    from the event log in order: a preemption (or a session that ended badly) sets
    its server's notice, a later submit for that server (the user started again)
    clears it, and so does a ``notice-seen`` (a notice shown once, as an admin's cancel,
    that its user has seen)."""
    notices: dict[tuple[str, str], str] = {}
    for event in events:
        if event.kind not in NOTICE_EVENTS:
            continue
        try:
            session = split_request_id(str(event.payload.get("request", "")))
        except ValueError:
            continue
        if event.kind in ("submit", "notice-seen"):
            notices.pop(session, None)
        elif event.kind == "exit" and not event.payload.get("notify"):
            continue
        elif event.payload.get("message"):
            notices[session] = str(event.payload["message"])
    return notices


def store_history(store: Store, now: float, days: float = HISTORY_DAYS) -> History:
    """The lengths of sessions that ended in the last ``days``, per profile (or class),
    from the store: what estimated starts rest on."""
    ended = AllocationRow.end_time
    query = (
        select(RequestRow.profile, RequestRow.klass, AllocationRow.start_time, ended)
        .join(RequestRow, AllocationRow.request_id == RequestRow.id)
        .where(ended.is_not(None), ended > now - days * 86400)
    )
    lengths = []
    with store.engine.connect() as connection:
        for profile, klass, start, end in connection.execute(query):
            shape = Request("", "", "", "", 0.0, profile=profile, klass=RequestClass(klass))
            lengths.append((history_key(shape), float(end or start) - float(start)))
    return History.of(lengths)


class QueueView:
    """Read-only answers about the queue and budgets of one running core.

    Positions, funding and "starts now" are a dry run of the policy on the live state
    (`scheduler_core.forecast`), estimates the scheduler run forward from it; both are
    kept until the next cycle (`changed`), so a page asked many times costs one run."""

    def __init__(
        self,
        core: Scheduler,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = core
        self.store = store
        self.clock = clock
        """The time answers are given for (the wall clock; a store's model, its build time)."""
        """Where past sessions' lengths are read (None: estimates rest on protection)."""
        self._stale = True
        self._decisions = Decisions()
        self._forecasts: dict[str, Forecast] = {}
        self._order: dict[str, list[str]] = {}
        """Per pool, the waiting requests in the order the dry run's cycle used (those
        it did not look at last)."""
        self._statuses: dict[str, QueueStatus] | None = None
        self._forward: ForwardRun | None = None
        self._outlooks: dict[tuple[object, ...], Outlook] = {}
        self._history: tuple[float, History] | None = None
        self._slurm: tuple[float, dict[tuple[str, str], float]] | None = None

    def changed(self) -> None:
        """A cycle ran: forecasts are worked out again when next asked."""
        self._stale = True

    def _fresh(self) -> float:
        """The dry run of the next cycle, made again if a cycle ran since (or a waiting
        request is not in it yet); returns the time it is made for."""
        now = self.clock()
        pending = self.core.pending
        if self._stale or any(r not in self._forecasts for r in pending):
            self._decisions, self._forecasts = standing(self.core.view(now), now)
            check = HeldCheck(self.core)  # where other jobs hold the room: say so
            if check.pools:
                self._forecasts = {
                    r: replace(f, reason=check.reason(pending[r], f.reason))
                    for r, f in self._forecasts.items()
                }
            self._order = {}
            listed = set()
            for request_id in (*self._decisions.order, *pending):
                if request_id in pending and request_id not in listed:
                    listed.add(request_id)
                    self._order.setdefault(pending[request_id].pool, []).append(request_id)
            self._statuses = None
            self._forward = None
            self._outlooks = {}
            self._stale = False
        return now

    def dry_run(self) -> Decisions:
        """The next cycle, run dry on the live state (what positions and funding rest on)."""
        self._fresh()
        return self._decisions

    def history(self) -> History:
        """Past sessions' lengths per profile, from the store (read again each minute)."""
        now = self.clock()
        if self._history is None or now - self._history[0] > HISTORY_TTL:
            found = store_history(self.store, now) if self.store is not None else History()
            self._history = (now, found)
        return self._history[1]

    def estimate(self, request_id: str) -> float | None:
        """A waiting request's estimated start: the scheduler run forward from the live
        state (one run per cycle, as far as the requests asked for need)."""
        now = self._fresh()
        if self._forward is None:
            self._forward = ForwardRun(self.core, now, self.history())
        return self._forward.start(request_id)

    def queue_status(self, request_id: str) -> QueueStatus | None:
        """Position in the queue (overall in the pool, inside the team), why it waits and
        its estimate."""
        if request_id not in self.core.pending:
            return None
        found = self.statuses().get(request_id)
        if found is None:
            return None
        return replace(found, estimated_start=self.estimate(request_id))

    def statuses(self) -> dict[str, QueueStatus]:
        """Every waiting request's status, worked out for the whole queue in one pass over
        the dry run's order and kept until the next cycle; without estimates (the forward
        run, `estimate`, is asked per request)."""
        self._fresh()
        if self._statuses is None:
            self._statuses = self._all_statuses()
        return self._statuses

    def _all_statuses(self) -> dict[str, QueueStatus]:
        pending = self.core.pending
        basis = self.history().basis()
        teams: dict[tuple[str, str], TeamStatus] = {}
        found: dict[str, QueueStatus] = {}
        for pool, ids in self._order.items():
            in_team = Counter(pending[r].team for r in ids)
            seen: Counter[str] = Counter()
            for request_id in ids:
                team_name = pending[request_id].team
                said = self._forecasts[request_id]
                seen[team_name] += 1
                team = teams.get((team_name, pool))
                if team is None:
                    team = teams[(team_name, pool)] = self.team_status(team_name, pool)
                found[request_id] = QueueStatus(
                    position=said.position,
                    waiting=said.waiting,
                    team_position=seen[team_name],
                    team_waiting=in_team[team_name],
                    funded=said.funded,
                    protected_s=said.protected_s,
                    estimated_start=None,
                    unit=team.unit,
                    team_funded=team.funded,
                    team_share=team.share,
                    budget_used=team.budget_used,
                    window_days=team.window_days,
                    other_teams=in_team[team_name] < said.waiting,
                    team_status=team,
                    starts_now=said.starts_now,
                    basis=basis,
                    ground=said.ground,
                    reason=said.reason,
                )
        return found

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
            slurm_units=self.slurm_usage().get((team, pool), 0.0),
        )

    def slurm_usage(self) -> dict[tuple[str, str], float]:
        """Per (team, pool), unit-seconds of other users' Slurm jobs charged to it within
        the window, from the store's events (read again after `SLURM_TTL`)."""
        now = self.clock()
        if self._slurm is not None and now - self._slurm[0] <= SLURM_TTL:
            return self._slurm[1]
        found: dict[tuple[str, str], float] = {}
        start = now - self.core.settings.lookback
        events = self.store.list_events(kind=SLURM_USAGE, since=start) if self.store else []
        for event in events:
            payload = event.payload
            try:
                key = (str(payload["team"]), str(payload["pool"]))
                begin, end = float(payload["start"]), float(payload["end"])
                units = float(payload["units"])
            except (KeyError, TypeError, ValueError):
                continue
            if end > begin:  # the part within the window
                units *= max(0.0, min(end, now) - max(begin, start)) / (end - begin)
            found[key] = found.get(key, 0.0) + units
        self._slurm = (now, found)
        return found

    def outlook(self, request: Request) -> Outlook:
        """What ``request`` (not queued) would get if asked for now: the policy's next
        cycle run dry with it added (funded or not, starts now or not, its place in the
        order the cycle uses), how many of its shape fit on free slices, and its
        estimated start (the scheduler run forward with it queued). Kept until the next
        cycle, per shape, team and user."""
        key = (
            request.pool,
            request.team,
            request.user,
            request.klass,
            request.profile,
            request.gpus,
            request.nodes,
            request.gpu_milli,
            request.mig,
            request.cpus,
            request.memory_gib,
            tuple(sorted(request.labels.items())),
            request.min_runtime,
            request.priority,
            request.resumable,
        )
        now = self._fresh()
        found = self._outlooks.get(key)
        if found is not None:
            return found
        core = self.core
        view = core.view(now)
        said = forecast(view, now, request)
        status = self.team_status(request.team, request.pool)
        if said.starts_now:
            estimated: float | None = now
        else:
            estimated = run_forward(core, now, self.history(), request, [request.id]).get(
                request.id
            )
        found = self._outlooks[key] = Outlook(
            funded=said.funded,
            protected_s=said.protected_s,
            why="" if said.funded else unallocated_why(status, said.ground),
            position=len(said.ahead) + 1,
            waiting=said.waiting,
            free_now=self.free_count(request, view),
            estimated_start=estimated,
            team_status=status,
            starts_now=said.starts_now,
            basis=self.history().basis(),
        )
        return found

    def free_count(
        self,
        request: Request,
        view: ClusterView | None = None,
        most: int = 99,
        *,
        slices_only: bool = False,
    ) -> int:
        """How many sessions shaped like ``request`` the pool's free slices hold now, on
        nodes that take new work (held nodes count too: a hint, not a promise). With
        ``slices_only``, a GPU request counts its free GPU slices alone (the form's "7
        free now" of MIG instances), not the CPU and memory beside them."""
        view = view if view is not None else self.core.view(self.clock())
        if slices_only and request.gpu_weight > 0:
            request = replace(request, cpus=0.0, memory_gib=0.0)
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
        now = self.clock()
        return core.ledger.charged(team, pool, now - lookback, now) / budget

    def team_hint(self, team: str, pools: Iterable[str]) -> str:
        """A short line about a team's budget: how much of it is used, per pool."""
        parts = []
        for pool_name in pools:
            used = self.budget_used(team, pool_name)
            if used is not None:
                parts.append(f"{pool_name}: {percent(used)} of budget used")
        return f"({'; '.join(parts)})" if parts else ""
