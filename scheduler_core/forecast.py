"""Forecasts: what the policy would do, asked before anything is done.

Every forecast the Hub shows is the policy itself, run dry. Funding, "starts now" and
the place in the queue are `decide` on the live view with the hypothetical request
added and nothing applied (`dry_run`); the estimated start is the same `Scheduler`
run forward on a virtual clock from a copy of the live state (`run_forward`), with
running sessions ending when they are expected to (`History`). A second derivation
of the order (the old outlook's own loop) drifted from the policy with every rule added
(issue 40); a dry run cannot. Pure: no I/O.

Why the expected end is "the profile's median, at least the protection": a session
cannot be stopped before its protection ends, and most end later (a notebook runs on
past its minimum runtime); the median of the profile's past sessions that ran at least
as long as this one has so far is the one figure the Hub has for "later" (the plain
median would end every session older than it at once). A declared duration, where one
is given, wins over both.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from scheduler_core.model import Allocation, PoolKind, Request
from scheduler_core.registry import decide
from scheduler_core.scheduler import Scheduler
from scheduler_core.verdict import NOT_WEIGHED
from scheduler_core.view import ClusterView, Decisions

HORIZON_S = 14 * 86400.0
"""How far forward an estimate looks; a request not started by then has no estimate."""
MAX_STEPS = 2000
"""Most schedulable moments one forward run visits (keeps an estimate cheap)."""
EXACT_S = 3600.0
"""A forward run visits every moment up to this far ahead."""
COARSEN = 0.02
"""Beyond `EXACT_S`, it takes the moments within this fraction of their distance past it
as one: a start estimated a day ahead may be up to half an hour late, and a deep queue
costs fewer cycles."""
_EMPTY: Mapping[str, float] = MappingProxyType({})
_NONE: Mapping[str, tuple[float, ...]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Forecast:
    """What the next cycle would do with one request (a dry run of the policy)."""

    request_id: str
    funded: bool
    """Funded if it started now (the admission's funding when it starts now)."""
    starts_now: bool
    """The cycle admits it."""
    position: int
    """1-based place among its pool's entries in the order the cycle used."""
    waiting: int
    """How many of its pool's entries that order holds (itself included)."""
    ahead: tuple[str, ...]
    """Entries before it in that order that the cycle leaves waiting."""
    protected_s: float
    """How long it would be protected if funded (0 when it would run unallocated)."""
    ground: str = ""
    """The verdict's funding ground, or why not funded (`verdict` codes): `NOT_WEIGHED`
    when the cycle gave it no verdict (its pool takes no work, or a policy that gives
    none) and it is not funded; "" when funded with no verdict."""
    reason: str = ""
    """The verdict's placement, or why not placed (`verdict` codes)."""


def with_request(view: ClusterView, request: Request) -> ClusterView:
    """The view with ``request`` waiting too. The cycle index is dropped: it holds the
    queues without the request, and `decide` without one decides from the rest of the
    view (exactly as it would with one, `view.py`). A view over part of the queue (new
    arrivals) stays one, with the request among the queued."""
    queued = None if view.queued is None else view.queued | {request.id}
    return replace(view, pending=(*view.pending, request), index=None, queued=queued)


def dry_run(view: ClusterView, now: float, request: Request | None = None) -> Decisions:
    """`decide` on ``view`` (with ``request`` added, if given); nothing is applied."""
    return decide(view if request is None else with_request(view, request), now)


class Reading:
    """What one `Decisions` says of the requests it may have looked at, read many times:
    each pool's order, the admitted and who each entry has ahead of it are worked out
    once, so reading the whole queue (`standing`) costs one pass over the order, not one
    per request. ``pools``: request id → pool, for every request the cycle may have
    looked at."""

    __slots__ = ("admitted", "decisions", "orders")

    def __init__(self, decisions: Decisions, pools: Mapping[str, str]) -> None:
        self.decisions = decisions
        self.admitted = {a.request.id: a for a in decisions.admissions}
        self.orders: dict[str, _PoolOrder] = {}
        for request_id in decisions.order:
            pool = pools.get(request_id)
            if pool is not None:
                found = self.orders.get(pool)
                if found is None:
                    found = self.orders[pool] = _PoolOrder()
                found.add(request_id, request_id in self.admitted)

    def read(self, request: Request, now: float) -> Forecast:
        """What the decisions say of ``request``."""
        decisions = self.decisions
        order = self.orders.get(request.pool) or _PoolOrder()
        place = order.first.get(request.id)
        if place is None:  # not looked at (its pool takes no work now): it comes last
            place, waiting = order.length, order.length + 1
        else:
            waiting = order.length
        admission = self.admitted.get(request.id)
        verdict = decisions.verdicts.get(request.id)
        ground = reason = ""
        if verdict is not None:  # the policy's own answer
            funded, ground, reason = verdict.funded, verdict.ground, verdict.reason
            protected = verdict.protected_s if funded else 0.0
        elif admission is not None:
            funded = admission.funded
            protected = max(0.0, admission.protected_until - now) if funded else 0.0
        else:
            funded = bool(decisions.funded.get(request.id, False))
            protected = request.min_runtime if funded else 0.0
        if verdict is None and not funded:  # why not funded: no cycle weighed it
            ground = NOT_WEIGHED
        return Forecast(
            request_id=request.id,
            funded=funded,
            starts_now=admission is not None,
            position=place + 1,
            waiting=waiting,
            ahead=order.ahead(place),
            protected_s=protected,
            ground=ground,
            reason=reason,
        )


class _PoolOrder:
    """One pool's entries in the order the cycle used, with what `Reading.read` asks of
    them kept as they are added."""

    __slots__ = ("before", "first", "left", "length")

    def __init__(self) -> None:
        self.length = 0
        """Entries in the order (an id listed twice counts twice)."""
        self.first: dict[str, int] = {}
        """Request id → its first place (0-based)."""
        self.left: list[str] = []
        """The entries the cycle leaves waiting, in order."""
        self.before: list[int] = []
        """Place → how many of ``left`` come before it."""

    def add(self, request_id: str, admitted: bool) -> None:
        self.first.setdefault(request_id, self.length)
        self.before.append(len(self.left))
        if not admitted:
            self.left.append(request_id)
        self.length += 1

    def ahead(self, place: int) -> tuple[str, ...]:
        """The entries before ``place`` that the cycle leaves waiting (``place`` past the
        end: all of them)."""
        count = self.before[place] if place < self.length else len(self.left)
        return tuple(self.left[:count])


def read(decisions: Decisions, request: Request, pools: Mapping[str, str], now: float) -> Forecast:
    """What ``decisions`` say of ``request``. ``pools``: request id → pool, for every
    request the cycle may have looked at (`Reading`, to read many)."""
    return Reading(decisions, pools).read(request, now)


def forecast(view: ClusterView, now: float, request: Request) -> Forecast:
    """What the next cycle does with ``request`` asked for now (a dry run); its minimum
    runtime is capped first, as `Scheduler.submit` caps it."""
    capped = view.settings.capped_min_runtime(request.min_runtime, request.klass)
    if capped != request.min_runtime:
        request = replace(request, min_runtime=capped)
    pools = {r.id: r.pool for r in view.pending}
    pools[request.id] = request.pool
    return read(dry_run(view, now, request), request, pools, now)


def standing(view: ClusterView, now: float) -> tuple[Decisions, dict[str, Forecast]]:
    """The next cycle over the waiting requests as they stand, and each one's forecast."""
    decisions = dry_run(view, now)
    reading = Reading(decisions, {r.id: r.pool for r in view.pending})
    return decisions, {r.id: reading.read(r, now) for r in view.pending}


# -- when: the scheduler run forward -----------------------------------------------


def history_key(request: Request) -> str:
    """What a session's length is learnt by: its profile, else its class."""
    return request.profile or f"class:{request.klass.value}"


@dataclass(frozen=True)
class History:
    """How long sessions ran, per profile (or class): what expected ends rest on."""

    lengths: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: _NONE)
    """Profile → the lengths of its past sessions, seconds, sorted."""
    declared: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    """Request id → the length its user declared, seconds."""

    @classmethod
    def of(
        cls, lengths: Iterable[tuple[str, float]], declared: Mapping[str, float] | None = None
    ) -> History:
        """From (profile or class key, seconds) of past sessions."""
        by_key: dict[str, list[float]] = {}
        for key, seconds in lengths:
            if seconds > 0:
                by_key.setdefault(key, []).append(seconds)
        return cls(
            MappingProxyType({k: tuple(sorted(v)) for k, v in by_key.items()}),
            MappingProxyType(dict(declared or {})),
        )

    def length(self, request: Request, elapsed: float = 0.0) -> float | None:
        """The expected length of a session of ``request`` that has run ``elapsed``
        seconds: its declared length, else the median of its profile's past sessions
        that ran longer than that (None: nothing to go on)."""
        declared = self.declared.get(request.id)
        if declared is not None:
            return declared
        past = self.lengths.get(history_key(request), ())
        longer = past[bisect.bisect_right(past, elapsed) :]
        return statistics.median(longer) if longer else None

    def end(self, allocation: Allocation, now: float | None = None) -> float:
        """When a running session is expected to end: its declared length, else its
        profile's median length among sessions that ran at least as long as it has by
        ``now``, and at least the end of its protection (and of the minimum runtime its
        user asked for)."""
        floor = max(allocation.protected_until, allocation.start + allocation.request.min_runtime)
        elapsed = 0.0 if now is None else max(0.0, now - allocation.start)
        length = self.length(allocation.request, elapsed)
        return floor if length is None else max(floor, allocation.start + length)

    def basis(self) -> str:
        """What the estimates rest on, in words."""
        if not self.lengths and not self.declared:
            return "running sessions end when their protection ends (no past sessions to go by)"
        seen = sum(len(v) for v in self.lengths.values())
        return (
            "running sessions end after their profile's median length (of "
            f"{seen} past sessions), at least when their protection ends"
        )


class _Clock:
    def __init__(self, time: float) -> None:
        self.time = time

    def now(self) -> float:
        return self.time


class _Forward:
    """The actuator of a forward run: starts are noted, each session ends when expected."""

    def __init__(self, clock: _Clock, history: History) -> None:
        self.clock = clock
        self.history = history
        self.starts: dict[str, float] = {}
        """Request id → its first start in the run."""
        self.ends: list[tuple[float, int, str, int]] = []
        """(expected end, tie-break, request id, generation)."""
        self.generation: dict[str, int] = {}
        self._seq = itertools.count()

    def expect(self, allocation: Allocation) -> None:
        generation = self.generation[allocation.id] = self.generation.get(allocation.id, 0) + 1
        end = self.history.end(allocation, self.clock.now())
        heapq.heappush(self.ends, (end, next(self._seq), allocation.id, generation))

    def launch(self, allocation: Allocation) -> None:
        self.starts.setdefault(allocation.id, self.clock.now())
        self.expect(allocation)

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        self.generation[allocation.id] = self.generation.get(allocation.id, 0) + 1
        return True  # it waits again, as the simulator's preempted requests do

    def next_end(self) -> float | None:
        return self.ends[0][0] if self.ends else None


def fork(
    core: Scheduler, now: float, history: History, extra: Request | None = None
) -> tuple[Scheduler, _Forward]:
    """A scheduler on a virtual clock at ``now`` holding what ``core`` holds (running
    sessions, queue, holds, idle sessions, the window's usage), ``extra`` queued too."""
    clock = _Clock(now)
    forward = _Forward(clock, history)
    copy = Scheduler(
        core.settings,
        core.pools.values(),
        core.nodes.values(),
        core.teams.teams.values(),
        clock,
        forward,
    )
    for allocation in core.running.values():
        copy.adopt(allocation)
        forward.expect(allocation)
    # Adopting charged the copy's own ledger from each start; the live ledger already
    # holds those charges, so the copy reads a copy of it instead (no view was built yet).
    settings = core.settings
    copy.ledger = core.ledger.copy(now - max(settings.lookback, 86400.0) - 86400.0)
    for request in core.pending.values():
        copy.submit(request, core.stops.get(request.id, 0))
    for request_id, since in core.idle.items():
        copy.mark_activity(request_id, since)
    copy.apply(Decisions(reservations=core.reservations, funded=core.funded), now)
    if extra is not None and extra.id not in core.pending and extra.id not in core.running:
        copy.submit(extra)
    return copy, forward


class ForwardRun:
    """The same scheduler run forward from ``core``'s state at ``now`` (``extra`` queued
    too), as far as the starts asked for need: settled at each expected end, each
    time-driven wake and each tick that can run a cycle, as the simulator settles. It
    stops for good past ``horizon`` seconds, after ``steps`` moments, or once nothing
    waits; a request not started by then has no estimate. Asking for a request deeper
    in the queue goes on from where the last question left it."""

    def __init__(
        self,
        core: Scheduler,
        now: float,
        history: History,
        extra: Request | None = None,
        *,
        horizon: float = HORIZON_S,
        steps: int = MAX_STEPS,
    ) -> None:
        self.copy, self.forward = fork(core, now, history, extra)
        self.now = now
        self.end = now + horizon
        self.steps = steps
        # Between events a tick runs a cycle only each budget_recheck (`Scheduler.step`):
        # the forward run visits those ticks alone, not every cycle_tick.
        self.tick = max(core.settings.cycle_tick, core.settings.budget_recheck)
        self.done = False
        self.copy.settle()

    def start(self, request_id: str) -> float | None:
        """When ``request_id`` first starts in the run (None: not within its bounds)."""
        starts = self.forward.starts
        while request_id not in starts and not self.done:
            self._advance()
        return starts.get(request_id)

    def _advance(self) -> None:
        copy, forward = self.copy, self.forward
        clock, t = forward.clock, forward.clock.time
        moments = [forward.next_end(), copy.next_wake()]
        if copy.pending:
            moments.append(t + self.tick)
        later = [m for m in moments if m is not None and m > t]
        self.steps -= 1
        if not copy.pending or not later or min(later) > self.end or self.steps < 0:
            self.done = True
            return
        # Far moments are taken together: past EXACT_S ahead, what falls within COARSEN
        # of the distance beyond it is one moment.
        first = min(later)
        t = clock.time = first + max(0.0, first - self.now - EXACT_S) * COARSEN
        ends = forward.ends
        while ends and ends[0][0] <= t:
            _, _, request_id, generation = heapq.heappop(ends)
            if forward.generation.get(request_id) == generation and request_id in copy.running:
                copy.finish(request_id)
        copy.settle()


def run_forward(
    core: Scheduler,
    now: float,
    history: History,
    extra: Request | None = None,
    targets: Iterable[str] | None = None,
    *,
    horizon: float = HORIZON_S,
    steps: int = MAX_STEPS,
) -> dict[str, float]:
    """Each target's first start (every waiting request and ``extra`` by default) in a
    `ForwardRun`; a target it does not start is left out."""
    run = ForwardRun(core, now, history, extra, horizon=horizon, steps=steps)
    wanted = list(run.copy.pending) if targets is None else list(targets)
    wanted += [r for r in run.forward.starts if targets is None and r not in wanted]
    found = {r: run.start(r) for r in wanted}
    return {r: t for r, t in found.items() if t is not None}


# -- what a team would get: one unit asked for now ------------------------------------


def probe_request(team: str, pool: str, view: ClusterView, runtime: float, now: float) -> Request:
    """A session of one unit of ``pool`` (a GPU, or a core) for ``team``, asked for now."""
    gpu = view.pools[pool].kind is PoolKind.GPU
    return Request(
        f"budgethub-probe/{team}/{pool}",
        "",
        team,
        pool,
        now,
        gpus=1 if gpu else 0,
        cpus=1.0,
        memory_gib=1.0,
        min_runtime=runtime,
    )


def probes(
    view: ClusterView, now: float, pool: str, teams: Iterable[str], runtime: float
) -> dict[str, Forecast]:
    """For each team, what a session of one unit asked for now would get, as the cycle
    over new arrivals that follows it decides (the queue's holds kept, no one else
    weighed). Each team is asked in a dry run of its own: asked together, one team's
    probe changed another's funding (a day slice, S5), as a property test found."""
    queued = frozenset(r.id for r in view.pending)
    scoped = replace(view, pending=(), queued=queued, index=None)
    return {
        team: forecast(scoped, now, probe_request(team, pool, view, runtime, now)) for team in teams
    }
