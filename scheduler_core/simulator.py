"""The simulator: the live Scheduler with a virtual clock and a simulated actuator.

It jumps from one schedulable moment to the next: submissions, sessions
ending, node events, the end of a protected window or grace (a pending funded
request may now preempt), a request reaching the starvation bound, and the
policy's cycle tick while requests wait; at each it settles the scheduler
(`Scheduler.settle`: the step, then any follow-up cycles, as live).

A preemption keeps what `Request.saved_seconds` says of the run: all of it for a
snapshotted session, up to the last checkpoint for a run that checkpoints (every
``checkpoint_every`` seconds from the run's start, as the policy's price counts them),
nothing for any other; less the run's own restart, which made no progress. The next run
first spends `Request.restart_seconds` (restart cost, restore) doing no new work. Lost
GPU time is the run time that left no progress (the part not kept, and a finished run's
restart), and a snapshot's taking, which the simulator does not hold GPUs for.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler_core.model import Allocation, PoolKind
from scheduler_core.scenario import Scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.view import Decisions

# Event kinds; at equal times, submissions are seen before sessions end. Final
# literals: compiled, each is built into the code, not looked up in the module's
# globals per event.
_SUBMIT: Final = 0
_FINISH: Final = 1
_NODE: Final = 2
_WAKE: Final = 3
_TICK: Final = 4
_IDLE: Final = 5


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self.time = start

    def now(self) -> float:
        return self.time


@dataclass
class RequestRecord:
    """What happened to one request (the result's ``requests`` entries)."""

    id: str
    submit: float
    klass: str
    team: str
    pool: str
    weight: float
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    nodes: list[list[str]] = field(default_factory=list)
    funded: list[bool] = field(default_factory=list)
    preemptions: int = 0
    finished: bool = False
    finish_time: float | None = None

    @property
    def wait(self) -> float | None:
        return self.starts[0] - self.submit if self.starts else None


@dataclass(frozen=True, init=False)
class Segment:
    """A stretch of time one request ran, for usage metrics."""

    team: str
    pool: str
    start: float
    end: float
    rate: float
    """GPU-equivalents (GPU pools) or cores (CPU pools)."""
    funded: bool

    def __init__(
        self, team: str, pool: str, start: float, end: float, rate: float, funded: bool
    ) -> None:
        # Written out: compiled, a generated __init__ runs interpreted (view.py).
        object.__setattr__(self, "team", team)
        object.__setattr__(self, "pool", pool)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "funded", funded)


@dataclass
class SimRun:
    """Everything a run produced, before it is reduced to metrics."""

    scenario: Scenario
    records: dict[str, RequestRecord]
    segments: list[Segment]
    lost_units: float
    cycles: int
    wall_s: float
    lost_by_class: dict[str, float] = field(default_factory=dict)
    """GPU-seconds lost to preemption per request class (they sum to ``lost_units``)."""
    lost_by_stop: dict[str, float] = field(default_factory=dict)
    """The same GPU-seconds per stop (`stop_key`: the stop's reason, whether the victim ran
    funded or borrowed, its class and how it resumes); a restart is counted to the stop
    that caused it. They sum to ``lost_units``."""


def stop_key(allocation: Allocation, reason: str) -> str:
    """``reason/funded|borrowed/class/checkpoint|snapshot|whole``: what a stop's lost
    work is counted under in `SimRun.lost_by_stop`."""
    request = allocation.request
    how = (
        "checkpoint"
        if request.checkpoint_every > 0
        else "snapshot"
        if request.snapshotted
        else "whole"
    )
    held = "funded" if allocation.funded else "borrowed"
    return f"{reason}/{held}/{request.klass.value}/{how}"


class SimActuator:
    """Starts and stops sessions in virtual time and remembers what happened."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def launch(self, allocation: Allocation) -> None:
        sim = self.sim
        now = sim.clock.now()
        record = sim.records[allocation.id]
        record.starts.append(now)
        record.nodes.append(list(allocation.node_names))
        record.funded.append(allocation.funded)
        sim.generation[allocation.id] += 1
        sim.run_start[allocation.id] = now
        token = (allocation.id, sim.generation[allocation.id])
        sim.push(now + sim.restart[allocation.id] + sim.remaining[allocation.id], _FINISH, token)
        idle_after = sim.scenario.idle_after.get(allocation.id)
        if idle_after is not None and idle_after < sim.remaining[allocation.id]:
            sim.push(now + idle_after, _IDLE, token)

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        sim = self.sim
        now = sim.clock.now()
        elapsed = now - sim.run_start.pop(allocation.id)
        sim.generation[allocation.id] += 1
        record = sim.records[allocation.id]
        record.ends.append(now)
        record.preemptions += 1
        sim.close_segment(allocation, now)
        request = allocation.request
        restart = sim.restart[allocation.id]
        # Progress kept: what the run saved, less the restart it began with.
        kept = max(0.0, request.saved_seconds(elapsed) - restart)
        sim.remaining[allocation.id] = max(0.0, sim.remaining[allocation.id] - kept)
        sim.restart[allocation.id] = request.restart_seconds
        key = sim.stop[allocation.id] = stop_key(allocation, reason)
        sim.lose(allocation, elapsed - kept + request.take_seconds, key)
        return True


CycleObserver = Callable[[Scheduler, Decisions, float], None]


def _before(submit: tuple[float, int, int, str], event: tuple[float, int, int, Any]) -> bool:
    """Does the submission come before the event, in the heap's order (time, kind,
    sequence)? Times first: comparing whole tuples is slower and rarely needed."""
    if submit[0] != event[0]:
        return submit[0] < event[0]
    return (submit[1], submit[2]) < (event[1], event[2])


class Simulation:
    """One run of a scenario through the real scheduler.

    ``observer`` sees the scheduler and the decisions after every cycle (tests
    use it to check invariants).
    """

    def __init__(self, scenario: Scenario, observer: CycleObserver | None = None) -> None:
        self.scenario = scenario
        self.observer = observer
        self.clock = VirtualClock()
        self.kinds = {p.name: p.kind for p in scenario.pools}
        self.scheduler = Scheduler(
            scenario.settings,
            scenario.pools,
            scenario.nodes,
            scenario.teams,
            self.clock,
            SimActuator(self),
        )
        for seeded in scenario.usage:
            self.scheduler.ledger.add(seeded.team, seeded.pool, seeded.at, seeded.units)
        self.records = {
            r.id: RequestRecord(
                r.id, r.submit, r.klass.value, r.team, r.pool, r.charge_rate(self.kinds[r.pool])
            )
            for r in scenario.requests
        }
        self.remaining = dict(scenario.durations)
        self.generation = dict.fromkeys(self.remaining, 0)
        self.run_start: dict[str, float] = {}
        self.segments: list[Segment] = []
        self.lost_units = 0.0
        self.lost_by_class: dict[str, float] = {}
        self.lost_by_stop: dict[str, float] = {}
        self.stop: dict[str, str] = {}
        """Per request preempted, the `stop_key` of its last stop (its restart's cause)."""
        self.restart = dict.fromkeys(self.remaining, 0.0)
        """Per request, the seconds its next run starts with doing no new work."""
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        """The next event's sequence number (an int: compiled, cheaper than a counter)."""
        self._by_id = {r.id: r for r in scenario.requests}

    def push(self, when: float, kind: int, payload: Any) -> None:
        seq = self._seq
        self._seq = seq + 1
        heapq.heappush(self._events, (when, kind, seq, payload))

    def lose(self, allocation: Allocation, seconds: float, stop: str) -> None:
        """Count ``seconds`` of the allocation's size as lost (GPU pools only), to the
        ``stop`` that threw them away (`stop_key`)."""
        if self.kinds[allocation.pool] is PoolKind.GPU and seconds > 0:
            units = seconds * allocation.charge_rate
            self.lost_units += units
            klass = allocation.request.klass.value
            self.lost_by_class[klass] = self.lost_by_class.get(klass, 0.0) + units
            self.lost_by_stop[stop] = self.lost_by_stop.get(stop, 0.0) + units

    def close_segment(self, allocation: Allocation, now: float) -> None:
        self.segments.append(
            Segment(
                allocation.team,
                allocation.pool,
                allocation.start,
                now,
                allocation.charge_rate,
                allocation.funded,
            )
        )

    def _observe(self, decisions: Decisions) -> None:
        """Show the observer one cycle's decisions (cycles do not move the clock)."""
        assert self.observer is not None
        self.observer(self.scheduler, decisions, self.clock.time)

    def _deliver(self, kind: int, payload: Any, now: float) -> bool:
        """Hand one event to the scheduler; False for one the live scheduler would not see.
        The end or idle report of a run a preemption already ended (its event left in the
        queue) is no event live: a cycle for it alone would be one no live Hub ran, and a
        replay of the run could not repeat it. A tick or a wake-up is the caller's."""
        if kind == _SUBMIT:
            self.scheduler.submit(self._by_id[payload])
        elif kind == _FINISH or kind == _IDLE:
            request_id, generation = payload
            if generation != self.generation[request_id]:
                return False
            if kind == _FINISH:
                self._finish(request_id, now)
            else:
                self.scheduler.mark_activity(request_id, now)
        elif kind == _NODE:
            self.scheduler.set_health(payload.node, payload.health)
        return True

    def run(self) -> SimRun:
        started = time.perf_counter()
        scenario = self.scenario
        horizon = scenario.horizon
        scheduler = self.scheduler
        tick = scenario.settings.cycle_tick
        submits = self._submissions()
        for event in scenario.events:
            self.push(event.at, _NODE, event)
        at = 0
        count = len(submits)
        tick_pending = False
        wakes: set[float] = set()
        """Times already in the event queue at which the scheduler asked to wake."""
        events = self._events
        pending = scheduler.pending
        observe = self._observe if self.observer is not None else None
        payload: Any
        while True:
            if at < count and (not events or _before(submits[at], events[0])):
                now = submits[at][0]
            elif events:
                now = events[0][0]
            else:
                break
            if now > horizon:
                break
            self.clock.time = now
            moved = False
            while True:
                if (
                    at < count
                    and submits[at][0] == now
                    and (not events or _before(submits[at], events[0]))
                ):
                    _, kind, _, payload = submits[at]
                    at += 1
                elif events and events[0][0] == now:
                    _, kind, _, payload = heapq.heappop(events)
                else:
                    break
                if kind == _TICK:
                    tick_pending = False
                elif kind == _WAKE:
                    wakes.discard(now)
                if self._deliver(kind, payload, now):
                    moved = True
            if not moved:
                continue
            scheduler.settle(observe)
            wake = scheduler.next_wake()
            if wake is not None and wake not in wakes:
                self.push(wake, _WAKE, None)
                wakes.add(wake)
            if pending and not tick_pending:
                self.push(now + tick, _TICK, None)
                tick_pending = True
        end = horizon
        self.clock.time = end
        for allocation in scheduler.running.values():
            self.close_segment(allocation, end)
            self.records[allocation.id].ends.append(end)
        return SimRun(
            scenario,
            self.records,
            self.segments,
            self.lost_units,
            scheduler.stats.cycles,
            time.perf_counter() - started,
            dict(self.lost_by_class),
            dict(self.lost_by_stop),
        )

    def _submissions(self) -> list[tuple[float, int, int, str]]:
        """The scenario's submissions in the heap's order, numbered as pushed events are.

        They wait in this sorted list beside the event heap rather than in it, popped in
        the same order (the same keys): the heap holds only what the run adds (a month's
        15,000 submissions made every push and pop of it deeper)."""
        requests = self.scenario.requests
        first = self._seq
        self._seq = first + len(requests)
        return sorted(
            (request.submit, _SUBMIT, first + i, request.id) for i, request in enumerate(requests)
        )

    def _finish(self, request_id: str, now: float) -> None:
        allocation = self.scheduler.finish(request_id)
        del self.run_start[request_id]
        self.remaining[request_id] = 0.0
        if self.restart[request_id] > 0:
            self.lose(allocation, self.restart[request_id], self.stop[request_id])
        record = self.records[request_id]
        record.ends.append(now)
        record.finished = True
        record.finish_time = now
        self.close_segment(allocation, now)
