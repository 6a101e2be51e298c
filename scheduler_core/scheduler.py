"""The scheduler: queue and running allocations, driven cycle by cycle.

The same class runs live (wall clock, Docker actuator) and in the simulator
(virtual clock, simulated actuator); only the injected Clock and Actuator
differ. Each cycle copies its state into a frozen view, asks the policy for
decisions and carries them out: preemptions first (so their slices are free),
then admissions, booked here before the actuator's slow start ("reserve, then
confirm"); a start that fails hands its slices back and requeues the request.

Between cycles the scheduler keeps, event by event, what a cycle would
otherwise rebuild from every running session: the queue sorted per pool and
team, the funded sessions still protected, the exposed ones, nodes by free
whole GPUs, and a log of the nodes where room grew, against which victim
searches that failed are re-checked. That data is a `Kept` (kept.py), handed
to each cycle as a read-only `CycleIndex`. ``pending`` and ``running`` are for
reading: change them only through the methods, or that data goes stale.

After a step, `settle` runs the follow-up cycles a cycle that freed room calls
for; the live scheduler and the simulator both call it.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final, Protocol

from mypy_extensions import mypyc_attr

from scheduler_core.capacity import copied
from scheduler_core.kept import Kept
from scheduler_core.ledger import UsageLedger
from scheduler_core.model import (
    CHECKPOINT_ROUNDING_S,
    Allocation,
    Health,
    Node,
    Pool,
    PoolKind,
    Request,
    RequestClass,
    Team,
)
from scheduler_core.policy import partial_cycle_safe
from scheduler_core.registry import decide
from scheduler_core.settings import Settings
from scheduler_core.teams import TeamTree
from scheduler_core.view import ClusterView, Decisions

log = logging.getLogger(__name__)

_NO_PAIRS: Final[Mapping[str, str]] = MappingProxyType({})


class Clock(Protocol):
    def now(self) -> float: ...


class Actuator(Protocol):
    """Carries out decisions: the only part with side effects on sessions."""

    def launch(self, allocation: Allocation) -> None:
        """Start the session (asynchronously where starting is slow)."""

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        """Snapshot and stop the session; True if its request should be queued again."""
        ...


class WallClock:
    def now(self) -> float:
        return time.time()


@dataclass
class CycleStats:
    """Timings of the last cycles, for logs and metrics."""

    cycles: int = 0
    last_view_s: float = 0.0
    last_decide_s: float = 0.0
    last_apply_s: float = 0.0


MAX_FOLLOW_UPS: Final = 5
"""Most cycles `Scheduler.settle` runs at once, the first included (see
`Decisions.follow_up`)."""


def _in_hierarchy(tree: TeamTree) -> frozenset[str]:
    """The teams with a parent or sub-teams."""
    return frozenset(
        t for t, team in tree.teams.items() if team.parent is not None or tree.has_children(t)
    )


@mypyc_attr(allow_interpreted_subclasses=True)
class Scheduler:
    """Pending requests and running allocations of one cluster.

    Open to subclasses in the compiled build (scheduler_core/native.py), as a test
    scripts its `step` and `cycle`."""

    def __init__(
        self,
        settings: Settings,
        pools: Iterable[Pool],
        nodes: Iterable[Node],
        teams: Iterable[Team],
        clock: Clock,
        actuator: Actuator,
        ledger: UsageLedger | None = None,
    ) -> None:
        self.settings = settings
        self.pools = {p.name: p for p in pools}
        self.nodes = {n.name: n for n in nodes}
        self.teams = TeamTree.build(teams)
        self._related = _in_hierarchy(self.teams)
        """Teams in a hierarchy: their funding may depend on their relatives' queues."""
        self.clock = clock
        self.actuator = actuator
        self.ledger = ledger or UsageLedger()
        self.pending: dict[str, Request] = {}
        self.running: dict[str, Allocation] = {}
        self.reservations: MappingProxyType[str, tuple[str, ...]] = MappingProxyType({})
        self.stats = CycleStats()
        self._capacity = self._pool_capacity()
        self._node_tuple = tuple(self.nodes.values())
        self._draining_of: tuple[Node, ...] | None = None
        """The node tuple ``_draining`` was found for (`_any_draining`)."""
        self._draining = False
        self._kept = Kept(settings, self.pools, self.nodes.values())
        """The data kept between cycles for them (kept.py)."""
        self._allocations: tuple[Allocation, ...] | None = None
        self._changed = True
        """Something freed room or changed nodes or holds: the whole queue must be looked at."""
        self._fresh: set[str] = set()
        """Requests submitted since the last cycle."""
        self._expiries: list[tuple[float, str]] = []
        self._checkpoints: list[tuple[float, str, float]] = []
        """(next checkpoint, request id, its run's start) of running sessions that
        checkpoint: the policy stops such a run only just after one (R10), so a
        checkpoint is a moment to look at the funded waiting requests, as a protected
        window's end is."""
        self._starving: list[tuple[float, str]] = []
        self._funded: dict[str, bool] = {}
        self._last_cycle: float | None = None
        self.idle: dict[str, float] = {}
        """Running request id → when its session went idle (`mark_activity`)."""
        self.stops: dict[str, int] = {}
        """Debug request id → times it was preempted before it ran its course
        (`ClusterView.stops`); forgotten when it ends or is cancelled, and counted again
        from the event log after a restart (`submit`'s ``stops``)."""
        self._idle_due: list[tuple[float, str]] = []
        """When idle sessions become free to release (``idle_release``)."""
        self.stopped_by: dict[str, str] = {}
        """Waiting request id → the request whose admission stopped it, while that one runs
        (S10; `ClusterView.stopped_by` has the pairs whose stopper is past protection);
        forgotten when either ends, is stopped or is cancelled. Not kept over a
        restart: at worst one more turn."""
        self._stopped_for: dict[str, list[str]] = {}
        """Stopper id → the requests it stopped (the other way of ``stopped_by``)."""
        self._stopped_view: Mapping[str, str] = MappingProxyType(self.stopped_by)

    def _pool_capacity(self) -> dict[str, float]:
        capacity = dict.fromkeys(self.pools, 0.0)
        for node in self.nodes.values():
            kind = self.pools[node.pool].kind
            capacity[node.pool] += node.gpu_capacity if kind is PoolKind.GPU else node.cpus
        return capacity

    # -- events ------------------------------------------------------------

    def submit(self, request: Request, stops: int = 0) -> Request:
        """Queue a request; its minimum runtime is capped by the settings. ``stops``: times
        a debug request was already stopped before it ran its course (a queue taken back
        after a restart; see `stops`)."""
        if request.id in self.pending or request.id in self.running:
            raise ValueError(f"request {request.id} is already queued or running")
        if stops < 0:
            raise ValueError(f"stops of request {request.id} must be 0 or more, not {stops}")
        capped = self.settings.capped_min_runtime(request.min_runtime, request.klass)
        if capped != request.min_runtime:
            request = replace(request, min_runtime=capped)
        self.pending[request.id] = request
        self._kept.enqueue(request)
        self._fresh.add(request.id)
        if stops and request.klass is RequestClass.DEBUG:
            self.stops[request.id] = stops
        heapq.heappush(
            self._starving, (request.submit + self.settings.starvation_bound, request.id)
        )
        return request

    def cancel(self, request_id: str) -> bool:
        """Remove a pending request; False if it was not pending."""
        self._changed = True
        self._fresh.discard(request_id)
        self._funded.pop(request_id, None)
        self.stops.pop(request_id, None)
        self.stopped_by.pop(request_id, None)
        request = self.pending.pop(request_id, None)
        if request is None:
            return False
        self._kept.dequeue(request)
        return True

    def finish(self, request_id: str) -> Allocation:
        """A session ended by itself: free its slices and stop charging."""
        allocation = self.running.pop(request_id)
        self._release(allocation)
        self.stops.pop(request_id, None)
        self.stopped_by.pop(request_id, None)
        self._forget_stopper(request_id)
        return allocation

    def launch_failed(self, request_id: str) -> None:
        """The actuator could not start a session: hand back its slices and requeue it."""
        allocation = self.running.pop(request_id)
        self._release(allocation)
        self._forget_stopper(request_id)
        self.pending[request_id] = allocation.request
        self._kept.enqueue(allocation.request)

    def adopt(self, allocation: Allocation) -> None:
        """Take in a session that is already running (found again after a restart):
        its slices are held and, if funded, its team is charged from its start."""
        if allocation.id in self.pending or allocation.id in self.running:
            raise ValueError(f"request {allocation.id} is already queued or running")
        self.running[allocation.id] = allocation
        self._book(allocation)
        self._changed = True
        heapq.heappush(self._expiries, (allocation.protected_until, allocation.id))
        self._watch_checkpoints(allocation)
        if allocation.funded:
            self.ledger.start_charging(
                allocation.team, allocation.pool, allocation.start, allocation.charge_rate
            )

    def mark_activity(self, request_id: str, idle_since: float | None) -> None:
        """What a running session is doing: idle since ``idle_since``, or busy (None).

        Idle sessions are the first victims; with ``idle_release`` set, one idle long
        enough may be stopped for any team's funded request. Reports for requests that
        are not running are ignored (the session may have ended meanwhile)."""
        if request_id not in self.running:
            return
        before = self.idle.get(request_id)
        if idle_since is None:
            self.idle.pop(request_id, None)
        else:
            self.idle[request_id] = idle_since
            if self.settings.idle_release > 0:
                due = idle_since + self.settings.idle_release
                heapq.heappush(self._idle_due, (due, request_id))
        if before != idle_since:
            self._changed = True

    def set_health(self, node_name: str, health: Health) -> None:
        node = replace(self.nodes[node_name], health=health)
        self.nodes[node_name] = node
        self._node_tuple = tuple(self.nodes.values())
        self._kept.node_changed(node)
        self._changed = True

    def reconfigure(
        self,
        *,
        settings: Settings | None = None,
        teams: Iterable[Team] | None = None,
        ledger: UsageLedger | None = None,
    ) -> None:
        """Swap the settings, the team tree or the ledger between cycles (an admin's
        change, picked up without a restart). The kept data is built again from the
        queue and the running sessions, and the next cycle looks at the whole queue;
        waiting requests are capped again by the new settings."""
        if settings is not None:
            self.settings = settings
        if teams is not None:
            self.teams = TeamTree.build(teams)
            self._related = _in_hierarchy(self.teams)
        if ledger is not None:
            self.ledger = ledger
        self._kept = Kept(self.settings, self.pools, self.nodes.values())
        for allocation in self.running.values():
            self._kept.book(allocation)
        for request_id, request in list(self.pending.items()):
            capped = self.settings.capped_min_runtime(request.min_runtime, request.klass)
            if capped != request.min_runtime:
                request = self.pending[request_id] = replace(request, min_runtime=capped)
            self._kept.enqueue(request)
        self._changed = True

    @property
    def capacity(self) -> Mapping[str, float]:
        """Budget units per second each pool delivers (GPU-equivalents or cores)."""
        return MappingProxyType(self._capacity)

    @property
    def funded(self) -> Mapping[str, bool]:
        """Would each waiting request be funded, as its last cycle judged."""
        return MappingProxyType(self._funded)

    def funded_rate(self, team: str, pool: str) -> float:
        """Budget units per second the team's running funded sessions in the pool hold."""
        return self._kept.funded_rates.get((team, pool), 0.0)

    def step(self) -> Decisions | None:
        """Run the cycle that what happened since the last one calls for, if any.

        Called on every event and on the periodic tick. After a cycle every
        waiting request has failed against the state it left, so: new
        submissions alone need only themselves looked at; a protected window
        ending needs only the funded waiting requests (only they may preempt);
        freed room, node changes, a request reaching the starvation bound, or
        ``budget_recheck`` passing (budgets drift slowly) need the whole queue.
        """
        now = self.clock.now()
        expired = False
        ended: set[tuple[str, str]] = set()  # (team, pool) of windows that ended
        while self._expiries and self._expiries[0][0] <= now:
            _, request_id = heapq.heappop(self._expiries)
            allocation = self.running.get(request_id)
            if allocation is not None:
                expired = True
                ended.add((allocation.team, allocation.pool))
        checkpoints = self._checkpoints
        while checkpoints and checkpoints[0][0] <= now:
            at, request_id, start = heapq.heappop(checkpoints)
            allocation = self.running.get(request_id)
            if allocation is not None and allocation.start == start:
                expired = True  # R10: it may be stopped now, for a while
                every = allocation.request.checkpoint_every
                heapq.heappush(
                    checkpoints, (at + every * ((now - at) // every + 1), request_id, start)
                )
        while self._idle_due and self._idle_due[0][0] <= now:
            # An idle session became free to release: like a protected window ending.
            _, request_id = heapq.heappop(self._idle_due)
            expired = expired or request_id in self.idle
        starving = False
        while self._starving and self._starving[0][0] <= now:
            _, request_id = heapq.heappop(self._starving)
            starving = starving or request_id in self.pending
        last = self._last_cycle
        if self._changed or starving or last is None or now - last >= self.settings.budget_recheck:
            return self.cycle()
        if not partial_cycle_safe(
            self.settings,
            now,
            self.pending,
            self._fresh,
            ended,
            self.teams,
            self._capacity,
            self.pools,
        ):
            return self.cycle()
        scope = set(self._fresh)
        if expired:
            scope.update(r for r in self.pending if self._funded.get(r))
        if self._related and any(
            (r := self.pending.get(i)) is not None and r.team in self._related for i in scope
        ):
            # A sub-team's job may be funded from its parent's day beside what its
            # relatives wait for, which a cycle over part of the queue does not see.
            return self.cycle()
        draining = expired and self._any_draining()
        if scope or draining:
            return self.cycle(scope)
        return None

    def _any_draining(self) -> bool:
        """Is any node draining? Looked at again only after a node changed."""
        nodes = self._node_tuple
        if self._draining_of is not nodes:
            self._draining = any(n.health is Health.DRAINING for n in nodes)
            self._draining_of = nodes
        return self._draining

    def settle(self, observe: Callable[[Decisions], None] | None = None) -> Decisions | None:
        """`step`, then at once the follow-up cycles it calls for.

        While the last cycle freed room that requests it had passed over could
        use (`Decisions.follow_up`), another full cycle runs, up to
        `MAX_FOLLOW_UPS` cycles in all. ``observe`` sees each cycle's decisions
        in turn. Returns the first cycle's decisions; None if the step called
        for no cycle. The live scheduler and the simulator both settle after
        every event and tick.
        """
        first = decisions = self.step()
        rounds = 0
        while decisions is not None:
            if observe is not None:
                observe(decisions)
            rounds += 1
            if not decisions.follow_up or rounds >= MAX_FOLLOW_UPS:
                break
            decisions = self.cycle()
        return first

    def next_wake(self) -> float | None:
        """When step() next has something time-driven to look at (a protected
        window ending, a request reaching the starvation bound, an idle session
        becoming free to release), if ever."""
        # The earliest head, compared one by one (the simulator asks after every event).
        found: float | None = None
        for heap in (self._expiries, self._starving, self._idle_due):
            if heap:
                at = heap[0][0]
                if found is None or at < found:
                    found = at
        if self._checkpoints and self.pending:
            at = self._checkpoints[0][0]
            if found is None or at < found:
                found = at
        return found

    # -- one cycle ---------------------------------------------------------

    @property
    def last_full_cycle(self) -> float | None:
        """When the last cycle over the whole queue ran (None: none yet). A cycle over
        part of the queue (`step`'s ``scope``) promises nothing of the rest of it."""
        return self._last_cycle

    def view(self, now: float, scope: Iterable[str] | None = None) -> ClusterView:
        """The frozen state the policy sees; ``scope`` limits which waiting requests it weighs."""
        start = now - self.settings.lookback
        kept = self._kept
        if scope is None:
            pending = tuple(self.pending.values())
            queued = None
        else:
            pending = tuple(self.pending[r] for r in scope if r in self.pending)
            # The kept ids of the queue: the same set, made again only after it changed.
            queued = kept.waiting()
        index = kept.index(now, self.running, None if scope is None else pending)
        usage = kept.usage(self.ledger, start, now)
        return ClusterView(
            settings=self.settings,
            pools=self.pools,
            nodes=self._node_tuple,
            allocations=self._running_tuple(),
            pending=pending,
            teams=self.teams,
            usage=usage,
            window=self.settings.lookback,
            capacity=self._capacity,
            reservations=self.reservations,
            free=kept.free_view(),
            queued=queued,
            index=index,
            funded_rates=kept.rates_view(),
            stops=MappingProxyType(self.stops.copy()),
            stopped_by=self._spared(now),
            idle=tuple((self.running[r], since) for r, since in self.idle.items()),
        )

    def _spared(self, now: float) -> Mapping[str, str]:
        """The pairs of `stopped_by` whose stopper is past its protection: only those
        could be stopped in return (S10). The others are left out, so that their
        waiting requests take the memo's answers as any other (`order.judge_all`)."""
        if not self.stopped_by:
            return self._stopped_view
        running = self.running
        found = {}
        for waiting, stopper in self.stopped_by.items():
            allocation = running.get(stopper)
            if allocation is not None and allocation.protected_until <= now:
                found[waiting] = stopper
        return MappingProxyType(found) if found else _NO_PAIRS

    def _forget_stopper(self, request_id: str) -> None:
        """``request_id`` no longer runs: the requests it stopped may stop it again (S10)."""
        for waiting in self._stopped_for.pop(request_id, ()):
            if self.stopped_by.get(waiting) == request_id:
                del self.stopped_by[waiting]

    def _running_tuple(self) -> tuple[Allocation, ...]:
        """``running``'s allocations in order, made again only after one was booked or
        released (every change to ``running`` goes through `_book` or `_release`)."""
        found = self._allocations
        if found is None:
            found = self._allocations = tuple(self.running.values())
        return found

    def cycle(self, scope: Iterable[str] | None = None) -> Decisions:
        """Decide and carry out one scheduling cycle (over ``scope`` only, if given)."""
        now = self.clock.now()
        t0 = time.perf_counter()
        view = self.view(now, scope)
        if scope is None:
            self._last_cycle = now
            self._changed = False
        self._fresh.clear()
        t1 = time.perf_counter()
        decisions = decide(view, now)
        t2 = time.perf_counter()
        self.apply(decisions, now)
        t3 = time.perf_counter()
        stats = self.stats
        stats.cycles += 1
        stats.last_view_s, stats.last_decide_s, stats.last_apply_s = t1 - t0, t2 - t1, t3 - t2
        if decisions.admissions or decisions.preemptions:
            log.debug(
                "cycle %d: %d admitted, %d preempted, %d pending "
                "(view %.1f ms, decide %.1f ms, apply %.1f ms)",
                stats.cycles,
                len(decisions.admissions),
                len(decisions.preemptions),
                len(self.pending),
                (t1 - t0) * 1e3,
                (t2 - t1) * 1e3,
                (t3 - t2) * 1e3,
            )
        return decisions

    def apply(self, decisions: Decisions, now: float) -> None:
        for preemption in decisions.preemptions:
            allocation = self.running.pop(preemption.allocation_id)
            self._release(allocation)
            self._forget_stopper(allocation.id)
            if self.actuator.preempt(allocation, preemption.reason):
                self.pending[allocation.id] = allocation.request
                self._kept.enqueue(allocation.request)
                if allocation.request.klass is RequestClass.DEBUG:
                    self.stops[allocation.id] = self.stops.get(allocation.id, 0) + 1
                stopper = preemption.for_request
                if stopper is not None:
                    self.stopped_by[allocation.id] = stopper
                    self._stopped_for.setdefault(stopper, []).append(allocation.id)
            else:
                self.stops.pop(allocation.id, None)  # not queued again: it has ended
                self.stopped_by.pop(allocation.id, None)
        for admission in decisions.admissions:
            request = self.pending.pop(admission.request.id)
            self._kept.dequeue(request)
            allocation = Allocation(
                request=request,
                grants=admission.grants,
                start=now,
                funded=admission.funded,
                protected_until=admission.protected_until,
                charge_rate=admission.charge_rate,
            )
            self.running[request.id] = allocation
            self._book(allocation)
            heapq.heappush(self._expiries, (allocation.protected_until, request.id))
            self._watch_checkpoints(allocation)
            if allocation.funded:
                self.ledger.start_charging(request.team, request.pool, now, allocation.charge_rate)
            self.actuator.launch(allocation)
        self._funded.update(copied(decisions.funded))
        for admission in decisions.admissions:
            self._funded.pop(admission.request.id, None)
        reservations = copied(decisions.reservations)
        if reservations != copied(self.reservations):
            self._changed = True
            self._kept.holds_ended(self.reservations, decisions.reservations)
        self._kept.searches_failed(decisions.searches)
        self.reservations = MappingProxyType(reservations)

    def _watch_checkpoints(self, allocation: Allocation) -> None:
        """Wake at the run's checkpoints (R10: it may be stopped just after one), from the
        first after its protected window: no rule stops a protected session, and the
        window's own end (`_expiries`) sees a checkpoint it falls just after."""
        request = allocation.request
        every = request.checkpoint_every
        if request.resumable and every > 0:
            start = allocation.start
            # The checkpoints the window covers; one due within `CHECKPOINT_ROUNDING_S`
            # after its end counts as on it (the end's wake-up sees it taken), so that a
            # history replayed from a store, its times a few ulps off, wakes as it woke.
            covered = int((allocation.protected_until - start + CHECKPOINT_ROUNDING_S) / every)
            first = start + every * (max(covered, 0) + 1)
            heapq.heappush(self._checkpoints, (first, request.id, start))

    def _book(self, allocation: Allocation) -> None:
        self._allocations = None
        self._kept.book(allocation)

    def _release(self, allocation: Allocation) -> None:
        self._allocations = None
        self._changed = True
        self.idle.pop(allocation.id, None)
        self._kept.release(allocation)
        if allocation.funded:
            self.ledger.stop_charging(
                allocation.team, allocation.pool, self.clock.now(), allocation.charge_rate
            )
