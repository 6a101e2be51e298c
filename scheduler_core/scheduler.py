"""The scheduler: queue and running allocations, driven cycle by cycle.

The same class runs live (wall clock, Docker actuator) and in the simulator
(virtual clock, simulated actuator); only the injected Clock and Actuator
differ. Each cycle copies its state into a frozen snapshot, asks the policy for
decisions and carries them out: preemptions first (so their slices are free),
then admissions, booked here before the actuator's slow start ("reserve, then
confirm"); a start that fails hands its slices back and requeues the request.

Between cycles the scheduler keeps, event by event, what a cycle would
otherwise rebuild from every running session: the queue sorted per pool and
team, the funded sessions still protected, the exposed ones, nodes by free
whole GPUs, and a log of the nodes where room grew, against which victim
searches that failed are re-checked (a `CycleIndex`, see snapshot.py).
``pending`` and ``running`` are for reading: change them only through the
methods, or those indexes go stale.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol

from scheduler_core.capacity import Layout, NodeFree, WholeIndex
from scheduler_core.ledger import UsageLedger, WindowUsage
from scheduler_core.model import Allocation, Health, Node, Pool, PoolKind, Request, Team
from scheduler_core.policy import KnownFailures, decide
from scheduler_core.preemption import ExposedIndex
from scheduler_core.settings import Settings
from scheduler_core.snapshot import (
    CycleIndex,
    Decisions,
    Queued,
    SearchKey,
    Snapshot,
    queue_key,
)
from scheduler_core.teams import TeamTree

log = logging.getLogger(__name__)


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
    last_snapshot_s: float = 0.0
    last_decide_s: float = 0.0
    last_apply_s: float = 0.0


class Scheduler:
    """Pending requests and running allocations of one cluster."""

    GROWTH_KEPT = KnownFailures.REACH
    """Entries of the growth log a cycle may need (see `KnownFailures`)."""

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
        self.clock = clock
        self.actuator = actuator
        self.ledger = ledger or UsageLedger()
        self.pending: dict[str, Request] = {}
        self.running: dict[str, Allocation] = {}
        self.reservations: MappingProxyType[str, tuple[str, ...]] = MappingProxyType({})
        self.stats = CycleStats()
        self._capacity = self._pool_capacity()
        self._node_tuple = tuple(self.nodes.values())
        self._free = {name: NodeFree(node) for name, node in self.nodes.items()}
        self._changed = True
        """Something freed room or changed nodes or holds: the whole queue must be looked at."""
        self._fresh: set[str] = set()
        """Requests submitted since the last cycle."""
        self._expiries: list[tuple[float, str]] = []
        self._starving: list[tuple[float, str]] = []
        self._funded: dict[str, bool] = {}
        self._funded_rates: dict[tuple[str, str], float] = {}
        """Per (team, pool), the charge rate of its running funded sessions."""
        self._last_cycle: float | None = None
        self._layout = Layout.of(self.nodes.values())
        self._queues: dict[tuple[str, str], tuple[list[tuple[int, float, str]], list[Queued]]] = {}
        """(pool, team) → sort keys and entries of its waiting requests, in queue order."""
        self._queue_view: dict[str, dict[str, tuple[Queued, ...]]] = {}
        self._queue_dirty: set[tuple[str, str]] = set()
        self._queued: dict[str, tuple[tuple[int, float, str], Queued]] = {}
        """Request id → its sort key and entry in ``_queues``."""
        self._protected: dict[str, dict[str, Allocation]] = {}
        """Per pool, funded sessions whose protected window ends after ``_indexed_at``,
        in start order."""
        self._whole = WholeIndex(self._free)
        self._reach = {name: self._whole.count(name) for name in self._free}
        self._reach_dirty: set[str] = set()
        self._exposed = ExposedIndex()
        """Sessions whose protected window (or grace) ended at or before ``_indexed_at``."""
        self._unexposed: list[tuple[float, int, Allocation]] = []
        self._sequence = itertools.count()
        self._indexed_at = -float("inf")
        self._growth: list[str] = []
        """Nodes where room, eligibility or exposed sessions grew, in order (see
        `CycleIndex.growth`); position ``_growth_start`` is its first entry."""
        self._growth_start = 0
        self._window: WindowUsage | None = None
        self._searches: dict[SearchKey, int] = {}
        """Victim searches known to have failed (see `CycleIndex.searches`)."""

    def _pool_capacity(self) -> dict[str, float]:
        capacity = dict.fromkeys(self.pools, 0.0)
        for node in self.nodes.values():
            kind = self.pools[node.pool].kind
            capacity[node.pool] += node.gpu_capacity if kind is PoolKind.GPU else node.cpus
        return capacity

    # -- events ------------------------------------------------------------

    def submit(self, request: Request) -> Request:
        """Queue a request; its minimum runtime is capped by the settings."""
        if request.id in self.pending or request.id in self.running:
            raise ValueError(f"request {request.id} is already queued or running")
        capped = self.settings.capped_min_runtime(request.min_runtime, request.klass)
        if capped != request.min_runtime:
            request = replace(request, min_runtime=capped)
        self.pending[request.id] = request
        self._enqueue(request)
        self._fresh.add(request.id)
        heapq.heappush(
            self._starving, (request.submit + self.settings.starvation_bound, request.id)
        )
        return request

    def cancel(self, request_id: str) -> bool:
        """Remove a pending request; False if it was not pending."""
        self._changed = True
        self._fresh.discard(request_id)
        self._funded.pop(request_id, None)
        request = self.pending.pop(request_id, None)
        if request is None:
            return False
        self._dequeue(request)
        return True

    def finish(self, request_id: str) -> Allocation:
        """A session ended by itself: free its slices and stop charging."""
        allocation = self.running.pop(request_id)
        self._release(allocation)
        return allocation

    def launch_failed(self, request_id: str) -> None:
        """The actuator could not start a session: hand back its slices and requeue it."""
        allocation = self.running.pop(request_id)
        self._release(allocation)
        self.pending[request_id] = allocation.request
        self._enqueue(allocation.request)

    def adopt(self, allocation: Allocation) -> None:
        """Take in a session that is already running (found again after a restart):
        its slices are held and, if funded, its team is charged from its start."""
        if allocation.id in self.pending or allocation.id in self.running:
            raise ValueError(f"request {allocation.id} is already queued or running")
        self.running[allocation.id] = allocation
        self._book(allocation)
        self._changed = True
        heapq.heappush(self._expiries, (allocation.protected_until, allocation.id))
        if allocation.funded:
            self.ledger.start_charging(
                allocation.team, allocation.pool, allocation.start, allocation.charge_rate
            )

    def set_health(self, node_name: str, health: Health) -> None:
        node = replace(self.nodes[node_name], health=health)
        self.nodes[node_name] = node
        self._node_tuple = tuple(self.nodes.values())
        free = self._free[node_name].copy()
        free.node = node
        self._free[node_name] = free
        self._changed = True
        self._growth.append(node_name)

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
        return self._funded_rates.get((team, pool), 0.0)

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
        while self._expiries and self._expiries[0][0] <= now:
            _, request_id = heapq.heappop(self._expiries)
            expired = expired or request_id in self.running
        starving = False
        while self._starving and self._starving[0][0] <= now:
            _, request_id = heapq.heappop(self._starving)
            starving = starving or request_id in self.pending
        last = self._last_cycle
        if self._changed or starving or last is None or now - last >= self.settings.budget_recheck:
            return self.cycle()
        scope = set(self._fresh)
        if expired:
            scope.update(r for r in self.pending if self._funded.get(r))
        draining = expired and any(n.health is Health.DRAINING for n in self._node_tuple)
        if scope or draining:
            return self.cycle(scope)
        return None

    def next_wake(self) -> float | None:
        """When step() next has something time-driven to look at (a protected
        window ending, a request reaching the starvation bound), if ever."""
        times = [heap[0][0] for heap in (self._expiries, self._starving) if heap]
        return min(times) if times else None

    # -- one cycle ---------------------------------------------------------

    def snapshot(self, now: float, scope: Iterable[str] | None = None) -> Snapshot:
        """The frozen state the policy sees; ``scope`` limits which waiting requests it weighs."""
        start = now - self.settings.lookback
        if scope is None:
            pending = tuple(self.pending.values())
            queued = None
        else:
            pending = tuple(self.pending[r] for r in scope if r in self.pending)
            queued = frozenset(self.pending)
        index = self._index(now, None if scope is None else pending)
        usage = self._window
        if (
            usage is None
            or usage.end != now
            or usage.start != start
            or usage.revision != self.ledger.revision
        ):
            # Charges change only from now on, so a window ending now stays as it is.
            usage = self._window = self.ledger.window(start, now)
        return Snapshot(
            settings=self.settings,
            pools=self.pools,
            nodes=self._node_tuple,
            allocations=tuple(self.running.values()),
            pending=pending,
            teams=self.teams,
            usage=usage,
            window=self.settings.lookback,
            capacity=self._capacity,
            reservations=self.reservations,
            free=MappingProxyType(dict(self._free)),
            queued=queued,
            index=index,
            funded_rates=MappingProxyType(dict(self._funded_rates)),
        )

    def _index(self, now: float, scope: Iterable[Request] | None) -> CycleIndex | None:
        """The indexes brought forward to ``now`` (with the queues of ``scope`` only,
        if given); None if they are already past ``now``."""
        if now < self._indexed_at:
            return None
        unexposed = self._unexposed
        while unexposed and unexposed[0][0] <= now:
            _, _, allocation = heapq.heappop(unexposed)
            if self.running.get(allocation.id) is allocation:
                self._protected.get(allocation.pool, {}).pop(allocation.id, None)
                self._exposed.add(allocation)
                self._reach_dirty.update(allocation.node_names)
                self._growth.extend(allocation.node_names)
        self._indexed_at = now
        for name in self._reach_dirty:
            self._reach[name] = self._whole.count(name) + self._exposed.held(name)
        self._reach_dirty.clear()
        return CycleIndex(
            at=now,
            layout=self._layout,
            whole=self._whole.frozen(),
            protected={pool: tuple(kept.values()) for pool, kept in self._protected.items()},
            exposed=self._exposed.frozen(),
            reach=dict(self._reach),
            growth=tuple(self._growth[-self.GROWTH_KEPT :]),
            growth_start=self._growth_start + max(0, len(self._growth) - self.GROWTH_KEPT),
            growth_end=self._growth_start + len(self._growth),
            searches=MappingProxyType(dict(self._searches)),
            queues=self._queue_snapshot() if scope is None else self._queue_subset(scope),
        )

    def _queue_snapshot(self) -> Mapping[str, Mapping[str, tuple[Queued, ...]]]:
        view = self._queue_view
        for pool, team in self._queue_dirty:
            entries = self._queues.get((pool, team))
            teams = dict(view.get(pool, {}))
            if entries is None or not entries[1]:
                teams.pop(team, None)
            else:
                teams[team] = tuple(entries[1])
            if teams:
                view[pool] = teams
            else:
                view.pop(pool, None)
        self._queue_dirty.clear()
        return MappingProxyType({pool: MappingProxyType(teams) for pool, teams in view.items()})

    def _queue_subset(
        self, requests: Iterable[Request]
    ) -> Mapping[str, Mapping[str, tuple[Queued, ...]]]:
        """The queues of ``requests`` (waiting ones) alone, in queue order."""
        found: dict[tuple[str, str], list[tuple[tuple[int, float, str], Queued]]] = {}
        queued = self._queued
        for request in requests:
            pair = queued[request.id]
            slot = (request.pool, request.team)
            group = found.get(slot)
            if group is None:
                found[slot] = [pair]
            else:
                group.append(pair)
        out: dict[str, dict[str, tuple[Queued, ...]]] = {}
        for (pool, team), pairs in found.items():
            pairs.sort(key=lambda pair: pair[0])
            out.setdefault(pool, {})[team] = tuple(entry for _, entry in pairs)
        return out

    def _enqueue(self, request: Request) -> None:
        slot = (request.pool, request.team)
        keys, entries = self._queues.setdefault(slot, ([], []))
        key = queue_key(request)
        at = bisect_left(keys, key)
        entry = Queued.of(request, self.settings, self.pools[request.pool].kind)
        keys.insert(at, key)
        entries.insert(at, entry)
        self._queued[request.id] = (key, entry)
        self._queue_dirty.add(slot)

    def _dequeue(self, request: Request) -> None:
        slot = (request.pool, request.team)
        keys, entries = self._queues[slot]
        at = bisect_left(keys, queue_key(request))
        assert entries[at].request.id == request.id
        del keys[at]
        del entries[at]
        del self._queued[request.id]
        if not keys:
            del self._queues[slot]
        self._queue_dirty.add(slot)

    def cycle(self, scope: Iterable[str] | None = None) -> Decisions:
        """Decide and carry out one scheduling cycle (over ``scope`` only, if given)."""
        now = self.clock.now()
        t0 = time.perf_counter()
        snapshot = self.snapshot(now, scope)
        if scope is None:
            self._last_cycle = now
            self._changed = False
        self._fresh.clear()
        t1 = time.perf_counter()
        decisions = decide(snapshot, now)
        t2 = time.perf_counter()
        self.apply(decisions, now)
        t3 = time.perf_counter()
        stats = self.stats
        stats.cycles += 1
        stats.last_snapshot_s, stats.last_decide_s, stats.last_apply_s = t1 - t0, t2 - t1, t3 - t2
        if decisions.admissions or decisions.preemptions:
            log.debug(
                "cycle %d: %d admitted, %d preempted, %d pending "
                "(snapshot %.1f ms, decide %.1f ms, apply %.1f ms)",
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
            if self.actuator.preempt(allocation, preemption.reason):
                self.pending[allocation.id] = allocation.request
                self._enqueue(allocation.request)
        for admission in decisions.admissions:
            request = self.pending.pop(admission.request.id)
            self._dequeue(request)
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
            if allocation.funded:
                self.ledger.start_charging(request.team, request.pool, now, allocation.charge_rate)
            self.actuator.launch(allocation)
        self._funded.update(decisions.funded)
        for admission in decisions.admissions:
            self._funded.pop(admission.request.id, None)
        if dict(decisions.reservations) != dict(self.reservations):
            self._changed = True
            kept = {node for nodes in decisions.reservations.values() for node in nodes}
            for nodes in self.reservations.values():
                self._growth.extend(node for node in nodes if node not in kept)
        self._searches.update(decisions.searches)
        if len(self._growth) > 4 * self.GROWTH_KEPT:
            drop = len(self._growth) - self.GROWTH_KEPT
            del self._growth[:drop]
            self._growth_start += drop
        if len(self._searches) > 64:
            # Failures recorded before the log entries a cycle looks at are no use.
            oldest = self._growth_start + len(self._growth) - self.GROWTH_KEPT
            self._searches = {k: at for k, at in self._searches.items() if at >= oldest}
        self.reservations = MappingProxyType(dict(decisions.reservations))

    def _book(self, allocation: Allocation) -> None:
        if allocation.funded:
            key = (allocation.team, allocation.pool)
            self._funded_rates[key] = self._funded_rates.get(key, 0.0) + allocation.charge_rate
        for grant in allocation.grants:
            free = self._free[grant.node].copy()
            free.take(grant)
            self._free[grant.node] = free
            self._whole.update(free)
            self._reach_dirty.add(grant.node)
        if allocation.protected_until <= self._indexed_at:
            self._exposed.add(allocation)
            self._growth.extend(allocation.node_names)
        else:
            if allocation.funded:
                self._protected.setdefault(allocation.pool, {})[allocation.id] = allocation
            entry = (allocation.protected_until, next(self._sequence), allocation)
            heapq.heappush(self._unexposed, entry)

    def _release(self, allocation: Allocation) -> None:
        self._changed = True
        self._protected.get(allocation.pool, {}).pop(allocation.id, None)
        self._exposed.remove(allocation)
        self._growth.extend(allocation.node_names)
        for grant in allocation.grants:
            free = self._free[grant.node].copy()
            free.give(grant)
            self._free[grant.node] = free
            self._whole.update(free)
            self._reach_dirty.add(grant.node)
        if allocation.funded:
            key = (allocation.team, allocation.pool)
            left = self._funded_rates.get(key, 0.0) - allocation.charge_rate
            if left > 1e-9:
                self._funded_rates[key] = left
            else:
                self._funded_rates.pop(key, None)
            self.ledger.stop_charging(
                allocation.team, allocation.pool, self.clock.now(), allocation.charge_rate
            )
