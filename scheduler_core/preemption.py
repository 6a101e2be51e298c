"""Choosing preemption victims (R4 of the scheduling contract, docs/architecture.md),
without side effects.

`find_targets` reads the cycle's capacity and the running allocations and says
which sessions to stop so a funded request fits; the policy applies the answer
and the actuator carries it out. Victims come from one node (or, for a
multi-node request, a set of nodes): unallocated sessions past their grace
first, then funded sessions past their protected window whose team ranks below
the requester's once the requester's protected time is counted, only while their
stop is worth its price (R8, `Victims.worth`). Among the sets that work, the one
that loses the least work wins (`lost_work`: the price of a preemption,
`Request.lost_seconds`, at the victim's size); per node the cheapest set of all
(`_cheapest_set`, an exact search over a node's few victims), with no victim it
does not need. The session that stopped the requester is spared (S10, ``spare``).
A gang (a session over several nodes) also counts ``gang_wait`` at its size (the
policy passes ``max_min_runtime``; S8 of docs/architecture.md, with its evidence):
resumable, it would otherwise look cheap to stop, yet to start again it must find
as many whole nodes free together.
Idle sessions (the actuator's or the simulator's `Scheduler.mark_activity`) go
before busy ones, and with ``idle_release`` a funded session idle that long counts
like an unallocated one: any funded request may stop it (it is snapshotted). With
nobody idle, nothing of this changes a decision.

A cycle's `Victims` start from the exposed sessions (past their protected
window) that the scheduler keeps between cycles (`ExposedSessions`, kept.py),
without looking at every running session; each node's victims are put in order
only when a search first reaches that node, because the order (lost work)
depends on the time. Nothing here outlives the cycle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, TypeVar

from scheduler_core.capacity import Capacity
from scheduler_core.kept import ExposedSessions, Tally, gpu_totals, held_gpus
from scheduler_core.model import MILLI, Allocation, Request, RequestClass, Slice, since_checkpoint
from scheduler_core.nodefree import NodeFree

Cost = tuple[float, float, float, float]
"""What stopping a set of victims costs (`set_cost`), compared as a tuple."""


@dataclass(frozen=True, slots=True, init=False)
class Target:
    """Victims on one node and what stopping them costs."""

    node: str
    victims: tuple[Allocation, ...]
    slices: tuple[Slice, ...]
    cost: Cost
    """Funded (and not releasable) victims at all, busy victims (when any is idle), work
    lost (`lost_work`, a gang's place included), victims."""

    def __init__(
        self, node: str, victims: tuple[Allocation, ...], slices: tuple[Slice, ...], cost: Cost
    ) -> None:
        # Written out: compiled, a generated __init__ runs interpreted (view.py).
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "victims", victims)
        object.__setattr__(self, "slices", slices)
        object.__setattr__(self, "cost", cost)


def lost_work(allocation: Allocation, now: float, gang_wait: float = 0.0) -> float:
    """GPU- or core-seconds a preemption costs: the work it throws away
    (`Request.lost_seconds`: since its last checkpoint, or its snapshot's taking and
    restoring, or its whole run, and its restart cost, at its size), and for a session
    over several nodes (a gang), ``gang_wait`` seconds of its size as well.

    A gang keeps its progress too but loses its place: to start again it needs as many
    whole nodes free at once, which may take until the protected windows on them end.
    """
    place = allocation.charge_rate * gang_wait if allocation.request.nodes > 1 else 0.0
    return allocation.request.lost_seconds(now - allocation.start) * allocation.charge_rate + place


def victim_order(
    allocation: Allocation,
    now: float,
    idle: Mapping[str, float] | None = None,
    releasable: frozenset[str] | set[str] = frozenset(),
    gang_wait: float = 0.0,
) -> tuple[int, int, float, float, str]:
    """Cheapest victim first: unallocated (or idle past ``idle_release``) before funded,
    then idle before busy, then least work lost (`lost_work`)."""
    return (
        int(allocation.funded and allocation.id not in releasable),
        int(idle is None or allocation.id not in idle),
        lost_work(allocation, now, gang_wait),
        -allocation.start,
        allocation.id,
    )


def _could_fit(node_free: NodeFree, request: Request, candidates: Sequence[Allocation]) -> bool:
    """A cheap upper bound: could stopping every candidate make room at all?"""
    name = node_free.node.name
    cpus, memory, whole = node_free.cpus, node_free.memory_gib, len(node_free.whole)
    whole += len(node_free.shared)
    for victim in candidates:
        for grant in victim.grants:
            if grant.node == name:
                cpus += grant.cpus
                memory += grant.memory_gib
                whole += sum(1 for piece in grant.slices if piece.milli == MILLI)
    if cpus + 1e-9 < request.cpus or memory + 1e-9 < request.memory_gib:
        return False
    if request.mig is None and (request.gpus or request.gpu_milli):
        return whole >= max(1, request.gpus)
    return True


def _freed(node_free: NodeFree, victims: Sequence[Allocation]) -> NodeFree:
    name = node_free.node.name
    trial = node_free.copy()
    for victim in victims:
        for grant in victim.grants:
            if grant.node == name:
                trial.give(grant)
    return trial


EXACT_CANDIDATES: Final = 12
"""`_cheapest_set` looks at every set of a node's victims only where it has at most this
many; beyond, it improves on the greedy set for at most `EXACT_TRIES` fit checks."""
EXACT_TRIES: Final = 256
PRICE_CAP: Final = 900.0
"""R8: funded work whose preemption would throw away more than this many seconds of its
size is not stopped by the rank rule (R4) or a day slice's end (S5). Why 900 s and not
a setting: docs/policy.md (R8) has the runs that chose it."""
LANE_PRICE_CAP: Final = 4 * PRICE_CAP
"""R8 for the debug fast lane (S1)."""
CHECKPOINT_SLACK: Final = 60.0
"""R10: a run that checkpoints is stopped by the rank rule or a reclaim (R4), a holder
(S7) or its day slice's end (S5) only within this many seconds after a checkpoint, so
it loses its restart and little more. The scheduler wakes at each checkpoint of a
running session while work waits, so a cycle sees each such moment."""
GANG_CHECKPOINT_SLACK: Final = 600.0
"""R10 for a request over several nodes: its nodes' victims must all be near a checkpoint
at once, which within `CHECKPOINT_SLACK` they almost never are (docs/policy.md, R10)."""
NO_WAIT: Final = math.inf
"""A slack that never waits: the fast lane's (S1) and the baselines'."""


def checkpoint_slack(cycle_tick: float) -> float:
    """R10's slack: `CHECKPOINT_SLACK`, or two cycle ticks if longer (a cycle that the
    checkpoint's wake-up runs over part of the queue leaves the rest to the next tick)."""
    return max(CHECKPOINT_SLACK, 2.0 * cycle_tick)


def at_checkpoint(request: Request, elapsed: float, slack: float) -> bool:
    """R10: may a run ``elapsed`` seconds old be stopped now? Always, unless it checkpoints
    (`Request.saved_seconds`); then only within ``slack`` seconds after a checkpoint."""
    every = request.checkpoint_every
    return every <= 0 or not request.resumable or since_checkpoint(elapsed, every) <= slack


def set_cost(chosen: Sequence[Allocation], now: float, victims: Victims) -> Cost:
    """What stopping ``chosen`` costs, compared as a tuple (`Target.cost`): funded victims
    at all, busy victims (when any is idle), work lost, victims."""
    return (
        float(max(victims.tier(v) for v in chosen)),
        float(sum(1 for v in chosen if victims.is_busy(v))),
        sum(lost_work(v, now, victims.gang_wait) for v in chosen),
        float(len(chosen)),
    )


def _cheapest_set(
    node_free: NodeFree,
    request: Request,
    candidates: Sequence[Allocation],
    best: list[Allocation],
    now: float,
    victims: Victims,
) -> list[Allocation]:
    """The cheapest set of ``candidates`` whose stopping makes room, starting from a set
    that does (``best``): a depth-first search in the candidates' order that drops any
    branch costing no less than the best found (a set's cost only grows as it grows),
    and a branch that fits is not grown (so no victim of the answer is unneeded)."""
    name = node_free.node.name
    best_cost = set_cost(best, now, victims)
    tries = 0 if len(candidates) <= EXACT_CANDIDATES else EXACT_TRIES
    stack: list[tuple[int, list[Allocation], NodeFree]] = [(0, [], node_free)]
    while stack:
        start, chosen, free = stack.pop()
        for i in range(len(candidates) - 1, start - 1, -1):
            grown = [*chosen, candidates[i]]
            if set_cost(grown, now, victims) >= best_cost:
                continue
            trial = free.copy()
            for grant in candidates[i].grants:
                if grant.node == name:
                    trial.give(grant)
            if trial.fits(request):
                best, best_cost = grown, set_cost(grown, now, victims)
            else:
                stack.append((i + 1, grown, trial))
        if tries:
            tries -= 1
            if not tries:
                break
    return best


def _node_target(
    node_free: NodeFree,
    request: Request,
    candidates: Sequence[Allocation],
    now: float,
    victims: Victims,
) -> Target | None:
    """The cheapest victims on one node; ``candidates`` come cheapest first. Taken
    cheapest first until the request fits, less any that turn out not to be needed;
    where that took more than one, the cheapest set of all (`_cheapest_set`)."""
    if not _could_fit(node_free, request, candidates):
        return None
    trial = node_free.copy()
    name = node_free.node.name
    chosen: list[Allocation] = []
    for victim in candidates:
        chosen.append(victim)
        for grant in victim.grants:
            if grant.node == name:
                trial.give(grant)
        if trial.fits(request):
            break
    else:
        return None
    if len(chosen) > 1:
        chosen = _needed(node_free, request, chosen)
    if len(chosen) > 1:
        # Cheapest first is not cheapest overall: two small victims may cost more than
        # one larger one that frees as much.
        chosen = _needed(
            node_free, request, _cheapest_set(node_free, request, candidates, chosen, now, victims)
        )
    slices = _freed(node_free, chosen).slices_for(request)
    assert slices is not None
    return Target(name, tuple(chosen), slices, set_cost(chosen, now, victims))


def _needed(node_free: NodeFree, request: Request, chosen: list[Allocation]) -> list[Allocation]:
    """``chosen`` less any victim the request fits without, latest-added first."""
    for victim in reversed(chosen[:-1]):
        rest = [v for v in chosen if v is not victim]
        if _freed(node_free, rest).fits(request):
            chosen = rest
    return chosen


class _Roomy:
    """Nodes that could reach a GPU count, and how far the change logs were read."""

    __slots__ = ("capacity", "capacity_read", "victims_read", "names")

    def __init__(self, capacity: Capacity, victims_read: int, names: dict[str, None]) -> None:
        self.capacity = capacity
        self.capacity_read = len(capacity.touched)
        self.victims_read = victims_read
        self.names = names


_ROOMY_START: Final[
    dict[tuple[str, int], tuple[dict[str, int], tuple[str, ...], dict[str, None]]]
] = {}
"""Per pool and GPU count, the nodes whose reach (`CycleIndex.reach`) holds them, with the
reach and the pool's names they were found from (`_roomy_start`)."""


def _roomy_start(
    reach: dict[str, int], names: tuple[str, ...], pool: str, gpus: int
) -> dict[str, None]:
    """The pool's nodes (``names``) whose ``reach`` is at least ``gpus``, in their order: a
    new dict the caller may change. The scheduler hands each cycle the same reach until a
    node's changes (`Kept.index`: replaced, never changed), so the answer is kept and
    copied while the reach and the names are the objects it was found from."""
    key = (pool, gpus)
    kept = _ROOMY_START.get(key)
    if kept is not None and kept[0] is reach and kept[1] is names:
        return kept[2].copy()
    found = {name: None for name in names if reach[name] >= gpus}
    if len(_ROOMY_START) >= 256:
        _ROOMY_START.clear()
    _ROOMY_START[key] = (reach, names, found.copy())
    return found


class Victims:
    """Running allocations that may be preempted this cycle, indexed for the search.

    Per node, cheapest first (ordered on first use); per pool, how many GPUs
    each team's preemptible sessions hold (None: unallocated), so a hopeless
    search stops in O(teams). Removals copy what they change: the sessions
    given to the constructor, or the `ExposedSessions`, are never changed.
    """

    def __init__(
        self, allocations: Iterable[Allocation], now: float, gang_wait: float = 0.0
    ) -> None:
        by_node: dict[str, list[Allocation]] = {}
        gpus: dict[str, dict[str | None, int]] = {}
        node_gpus: dict[str, dict[str | None, int]] = {}
        for allocation in allocations:
            key = allocation.team if allocation.funded else None
            pool = gpus.setdefault(allocation.pool, {})
            for node, held in held_gpus(allocation):
                by_node.setdefault(node, []).append(allocation)
                pool[key] = pool.get(key, 0) + held
                on_node = node_gpus.setdefault(node, {})
                on_node[key] = on_node.get(key, 0) + held
        self._setup(by_node, gpus, node_gpus, None, now, gang_wait)

    @classmethod
    def of(
        cls,
        exposed: ExposedSessions,
        now: float,
        reach: Mapping[str, int] | None = None,
        gang_wait: float = 0.0,
    ) -> Victims:
        """The victims of a cycle at ``now`` from the scheduler's exposed sessions.

        ``reach``, if given, is each node's free whole GPUs plus what the exposed
        sessions there hold, for the capacity the cycle starts from."""
        victims = cls((), now, gang_wait)
        victims._setup(
            exposed.by_node, exposed.gpus, exposed.node_gpus, exposed.totals, now, gang_wait
        )
        victims._reach = None if reach is None else _as_dict(reach)
        return victims

    def _setup(
        self,
        by_node: Mapping[str, Sequence[Allocation]],
        gpus: Mapping[str, Tally],
        node_gpus: Mapping[str, Tally],
        totals: Mapping[str, tuple[int, int]] | None,
        now: float,
        gang_wait: float,
    ) -> None:
        self._now = now
        self.slack = NO_WAIT
        """R10: how long after a checkpoint a run that checkpoints may be stopped, for a
        request on one node (`at_checkpoint`); `NO_WAIT` unless the policy waits
        (`wait_for_checkpoints`)."""
        self.gang_slack = NO_WAIT
        """The same for a request over several nodes."""
        self.gang_wait = gang_wait
        """What stopping a gang costs beyond lost work, in seconds of its size."""
        # Held as dicts (they are dicts, but for a caller's other mapping): compiled,
        # a dict's get is a direct call and a Mapping's a method call through Python.
        self._base: dict[str, Sequence[Allocation]] = _as_dict(by_node)
        self._base_gpus: dict[str, Tally] = _as_dict(gpus)
        self._base_node_gpus: dict[str, Tally] = _as_dict(node_gpus)
        self._base_totals: dict[str, tuple[int, int]] | None = (
            None if totals is None else _as_dict(totals)
        )
        self._sorted: dict[str, list[Allocation]] = {}
        self._gpus: dict[str, dict[str | None, int]] = {}
        """Pool tallies changed by removals (copies; the base is never changed)."""
        self._node_gpus: dict[str, dict[str | None, int]] = {}
        self._totals: dict[str, tuple[int, int]] = {}
        self._permitted: dict[frozenset[str], dict[str, int]] = {}
        self._touched: list[str] = []
        """Nodes whose victims changed, in order (read by `roomy`)."""
        self._roomy: dict[tuple[str, int], _Roomy] = {}
        self._reach: dict[str, int] | None = None
        self._idle: dict[str, float] = {}
        self._releasable: set[str] = set()
        self._rel_pool: dict[str, dict[str, int]] = {}
        """Per pool, GPUs held by releasable idle sessions, per team."""
        self._rel_node: dict[str, dict[str, int]] = {}

    def note_idle(self, idle: Iterable[tuple[Allocation, float]], release_after: float) -> None:
        """Which of the victims are idle (and since when): they go first, and those idle
        for ``release_after`` (> 0) are permitted to every funded request, whatever the
        team. Call before the first search; ``idle`` must name only victims."""
        now = self._now
        self._idle = {allocation.id: since for allocation, since in idle}
        if not self._idle:
            return
        self._sorted.clear()
        self._permitted.clear()
        if release_after <= 0:
            return
        for allocation, since in idle:
            if allocation.funded and since + release_after <= now:
                self._releasable.add(allocation.id)
                self._count_releasable(allocation, 1)

    def _count_releasable(self, allocation: Allocation, sign: int) -> None:
        team = allocation.team
        for node, held in held_gpus(allocation):
            pool = self._rel_pool.setdefault(allocation.pool, {})
            pool[team] = pool.get(team, 0) + sign * held
            on_node = self._rel_node.setdefault(node, {})
            on_node[team] = on_node.get(team, 0) + sign * held

    def tier(self, allocation: Allocation) -> int:
        """0 for victims any funded request may stop, 1 for funded ones (rank rule)."""
        return int(allocation.funded and allocation.id not in self._releasable)

    def is_busy(self, allocation: Allocation) -> bool:
        """Busy while others are idle: only then does it weigh in a victim set's cost, so
        that with nobody idle the cheapest set is the one that loses the least work."""
        return bool(self._idle) and allocation.id not in self._idle

    def permits(self, allocation: Allocation, allowed: frozenset[str]) -> bool:
        """May a funded request that may stop the teams in ``allowed`` stop it? Never a
        session in the instant it started: with no protection (a zero grace or minimum
        runtime) two requests could otherwise take turns stopping each other with no
        time passing."""
        return allocation.start < self._now and (
            not allocation.funded
            or allocation.request.team in allowed
            or allocation.id in self._releasable
        )

    def wait_for_checkpoints(self, slack: float, gang_slack: float) -> None:
        """R10: stop runs that checkpoint only ``slack`` (``gang_slack`` for a request over
        several nodes) seconds after a checkpoint at most."""
        self.slack, self.gang_slack = slack, gang_slack

    def slack_for(self, request: Request) -> float:
        """R10's slack for the victims of ``request``."""
        return self.slack if request.nodes == 1 else self.gang_slack

    def worth(self, allocation: Allocation, cap: float = PRICE_CAP, slack: float = NO_WAIT) -> bool:
        """R8 and R10: may it be stopped at its price now? Idle sessions past
        ``idle_release`` always; funded work only while a preemption throws away at most
        ``cap`` seconds of its size (`Request.lost_seconds`); and a run that checkpoints,
        funded or not, only ``slack`` seconds after a checkpoint at most (`at_checkpoint`)."""
        if allocation.id in self._releasable:
            return True
        request = allocation.request
        elapsed = self._now - allocation.start
        if allocation.funded and request.lost_seconds(elapsed) > cap:
            return False
        return at_checkpoint(request, elapsed, slack)

    def _released_beyond(self, held: Mapping[str, int] | None, allowed: frozenset[str]) -> int:
        if not held:
            return 0
        return sum(count for team, count in held.items() if team not in allowed)

    def on(self, node: str) -> Sequence[Allocation]:
        """The node's victims, cheapest first."""
        found = self._sorted.get(node)
        if found is None:
            base = self._base.get(node)
            if not base:
                return ()
            now, idle, releasable, wait = self._now, self._idle, self._releasable, self.gang_wait
            # Sorted by key pairs, not ``key=lambda``: compiled, the lambda is a call
            # through Python per victim. A key ends with the id, so no two are equal and
            # no allocation is compared (the same order as a stable sort by the key).
            keyed = [(victim_order(a, now, idle, releasable, wait), a) for a in base]
            keyed.sort()
            found = self._sorted[node] = [a for _, a in keyed]
        return found

    def has(self, node: str) -> bool:
        """Does the node hold any victim?"""
        found = self._sorted.get(node)
        return bool(found if found is not None else self._base.get(node))

    def remove(self, allocation: Allocation) -> None:
        if allocation.id in self._releasable:
            self._releasable.discard(allocation.id)
            self._count_releasable(allocation, -1)
        for node in allocation.node_names:
            self._sorted[node] = [a for a in self.on(node) if a is not allocation]
        key = allocation.team if allocation.funded else None
        for node, held in held_gpus(allocation):
            pool = self._gpus.get(allocation.pool)
            if pool is None:
                pool = self._gpus[allocation.pool] = dict(self._base_gpus.get(allocation.pool, {}))
            pool[key] = pool.get(key, 0) - held
            on_node = self._node_gpus.get(node)
            if on_node is None:
                on_node = self._node_gpus[node] = dict(self._base_node_gpus.get(node, {}))
            on_node[key] = on_node.get(key, 0) - held
            self._totals[node] = gpu_totals(on_node)
            self._touched.append(node)
        self._permitted.clear()

    def _node_tally(self, node: str) -> Tally:
        found = self._node_gpus.get(node)
        return found if found is not None else self._base_node_gpus.get(node, _NO_TALLY)

    def gpu_bound(self, pool: str, allowed: frozenset[str]) -> int:
        """GPUs that stopping every permitted victim in the pool could free, at most."""
        found = self._gpus.get(pool)
        held = found if found is not None else self._base_gpus.get(pool, _NO_TALLY)
        return _permitted(held, allowed) + self._released_beyond(self._rel_pool.get(pool), allowed)

    def node_totals(self, node: str) -> tuple[int, int]:
        """GPUs held on the node by every victim, and by those any request may stop
        (unallocated, or idle past ``idle_release``)."""
        totals = self._node_totals(node)
        releases = self._rel_node
        released = releases.get(node) if releases else None
        if released:
            return totals[0], totals[1] + sum(released.values())
        return totals

    def _node_totals(self, node: str) -> tuple[int, int]:
        totals = self._totals
        if totals:  # most cycles remove no victim: one look-up, in the base
            found = totals.get(node)
            if found is not None:
                return found
        base = self._base_totals
        if base is not None:
            # Read from the base each time, not copied into ``_totals`` (which holds
            # what removals changed): compiled, a copy is a new tuple per node (as
            # would be a default passed to ``get``).
            found = base.get(node)
            return (0, 0) if found is None else found
        found = gpu_totals(self._node_tally(node))
        totals[node] = found
        return found

    def roomy(self, capacity: Capacity, pool: str, gpus: int) -> list[NodeFree]:
        """Nodes of the pool whose free whole GPUs and every victim's GPUs reach ``gpus``.

        Kept up to date through the change logs of capacity and of the victims:
        a cycle asks this again for every team and shape it tries.
        """
        free = capacity.free
        found = self._roomy.get((pool, gpus))
        if found is None or found.capacity is not capacity:
            reach = self._reach
            if reach is None:
                names = {
                    name: None
                    for name in capacity.pool_names(pool)
                    if self._reaches(free[name], gpus)
                }
                self._roomy[(pool, gpus)] = _Roomy(capacity, len(self._touched), names)
                return [free[name] for name in names]
            # As the cycle started; the change logs below bring it up to date.
            names = _roomy_start(reach, capacity.pool_names(pool), pool, gpus)
            found = self._roomy[(pool, gpus)] = _Roomy(capacity, 0, names)
            found.capacity_read = 0
        names = found.names
        touched = capacity.touched
        for log, read in ((touched, found.capacity_read), (self._touched, found.victims_read)):
            for name in log[read:]:
                node_free = free.get(name)
                if node_free is None or node_free.node.pool != pool:
                    continue
                if self._reaches(node_free, gpus):
                    names[name] = None
                else:
                    names.pop(name, None)
        found.capacity_read = len(touched)
        found.victims_read = len(self._touched)
        return [free[name] for name in names]

    def _reaches(self, node_free: NodeFree, gpus: int) -> bool:
        short = gpus - len(node_free.whole)
        return short <= 0 or self.node_totals(node_free.node.name)[0] >= short

    def node_gpu_bound(self, node: str, allowed: frozenset[str]) -> int:
        """GPUs that stopping every permitted victim on the node could free, at most."""
        found = self.bounds(allowed)
        bound = found.get(node)
        if bound is None:
            bound = self.bound_into(found, node, allowed)
        return bound

    def bound_into(self, found: dict[str, int], node: str, allowed: frozenset[str]) -> int:
        """`node_gpu_bound`, worked out and written into ``found`` (``bounds(allowed)``,
        which the caller holds and found no answer in)."""
        bound = found[node] = _permitted(self._node_tally(node), allowed) + self._released_beyond(
            self._rel_node.get(node), allowed
        )
        return bound

    def bounds(self, allowed: frozenset[str]) -> dict[str, int]:
        """`node_gpu_bound` answers found so far for ``allowed`` (filled in by it)."""
        found = self._permitted.get(allowed)
        if found is None:
            found = self._permitted[allowed] = {}
        return found

    def node_gpu_bounds(self, allowed: frozenset[str]) -> Mapping[str, int]:
        """Per node, GPUs that stopping every permitted victim there could free, at most."""
        nodes = set(self._base_node_gpus) | set(self._node_gpus)
        return {node: self.node_gpu_bound(node, allowed) for node in nodes}


@dataclass(frozen=True, slots=True, init=False)
class Lane:
    """A limit on the victims of one search (policy/victims.py).

    The fast lane's: a debug request stops debug sessions only with the rights a
    funded request has anyway (``normal``: the teams the rank rule permits; None for a
    request its budget does not fund, which has no such rights). Every other victim it
    may stop is work that cannot itself take the lane, so two debug sessions never take
    turns stopping each other.

    A team's own time slice (``resumable``): a job that slices its own team stops only
    sessions that are snapshotted and resume where they stopped, so its turn throws
    no one's work away."""

    normal: frozenset[str] | None
    resumable: bool = False

    def __init__(self, normal: frozenset[str] | None, resumable: bool = False) -> None:
        # Written out: compiled, a generated __init__ runs interpreted (view.py); the
        # fast lane makes one per debug request it looks at.
        object.__setattr__(self, "normal", normal)
        object.__setattr__(self, "resumable", resumable)

    def may_stop(self, victims: Victims, allocation: Allocation) -> bool:
        if self.resumable:
            return allocation.request.resumable
        if allocation.request.klass is not RequestClass.DEBUG:
            return True
        return self.normal is not None and victims.permits(allocation, self.normal)


def _permits(
    victims: Victims,
    allocation: Allocation,
    allowed: frozenset[str],
    lane: Lane | None,
    spare: str | None = None,
    slack: float = NO_WAIT,
) -> bool:
    if allocation.id == spare:
        return False  # S10: the session that stopped the requester is not stopped in return
    if lane is None or lane.resumable:
        return victims.permits(allocation, allowed) and (
            (lane is None or lane.may_stop(victims, allocation))
            and victims.worth(allocation, PRICE_CAP, slack)
        )
    # The fast lane (S1) may pay more: a debug session waits seconds, not until a long
    # run reaches its next checkpoint.
    return (
        victims.permits(allocation, allowed)
        and lane.may_stop(victims, allocation)
        and victims.worth(allocation, LANE_PRICE_CAP)
    )


def _permitted(held: Tally, allowed: frozenset[str]) -> int:
    total = 0
    if isinstance(held, dict):  # as it is: iterated directly when compiled
        for team, count in held.items():
            if team is None or team in allowed:
                total += count
        return total
    for team, count in held.items():
        if team is None or team in allowed:
            total += count
    return total


_K = TypeVar("_K")
_V = TypeVar("_V")

_NO_TALLY: Final[Tally] = MappingProxyType({})
"""A node or pool no victim holds GPUs on (read only)."""


def _as_dict(mapping: Mapping[_K, _V]) -> dict[_K, _V]:
    """``mapping`` itself where it is a dict (never changed here), else a dict copy."""
    return mapping if isinstance(mapping, dict) else dict(mapping)


def offers(
    capacity: Capacity,
    victims: Victims,
    request: Request,
    allowed: frozenset[str],
    node_free: NodeFree,
    lane: Lane | None = None,
    spare: str | None = None,
) -> bool:
    """Could the node be one of `find_targets`'s answers for the request?

    That is: new work may land there, and the request fits once every
    permitted victim there stops (or, for a multi-node request, fits already).
    The more room and victims a node has, the more surely this holds.

    A whole-GPU request first asks what `search_targets` asks of every node
    (`_roomy_nodes`): where the free whole GPUs and every permitted victim's fall short,
    the answer is no after a few look-ups, before the node's victims are sorted and
    freed; so a check of many grown nodes (`KnownFailures.fails`) costs less than the
    search it stands in for.
    """
    if request.mig is None and not request.gpu_milli and request.gpus > 0:
        short = request.gpus - len(node_free.whole)
        if short > 0:
            name = node_free.node.name
            every, anyone = victims.node_totals(name)
            if every < short:
                return False  # not even every victim there frees enough (`Victims.roomy`)
            if anyone < short and victims.node_gpu_bound(name, allowed) < short:
                return False
    if not capacity.eligible(node_free, request):
        return False
    if request.nodes > 1 and node_free.tightness(request) is not None:
        return True
    slack = victims.slack_for(request)
    candidates = [
        a
        for a in victims.on(node_free.node.name)
        if _permits(victims, a, allowed, lane, spare, slack)
    ]
    return bool(candidates) and _freed(node_free, candidates).fits(request)


def find_targets(
    request: Request,
    capacity: Capacity,
    victims: Victims,
    allowed: frozenset[str],
    now: float,
) -> tuple[Target, ...] | None:
    """Nodes (one per requested node) and the victims to stop on each, or None.

    Victims are unallocated sessions past their grace and funded sessions of
    teams in ``allowed`` past their protected window (the caller applies the
    rank rule). A node where the request already fits costs nothing; the
    caller has found that the request does not fit on free slices alone.
    """
    return search_targets(request, capacity, victims, allowed, now)[0]


def _roomy_nodes(
    request: Request, capacity: Capacity, victims: Victims, allowed: frozenset[str]
) -> list[NodeFree] | None:
    """For a whole-GPU request: the nodes where its GPUs could be freed, at most by the
    permitted victims' bounds; None if too few nodes (or GPUs in the pool) could be."""
    gpus = request.gpus
    need = gpus * request.nodes
    if capacity.free_whole_total(request.pool) + victims.gpu_bound(request.pool, allowed) < need:
        return None
    nodes: list[NodeFree] = []
    bounds = victims.bounds(allowed)
    for nf in victims.roomy(capacity, request.pool, gpus):
        short = gpus - len(nf.whole)
        if short > 0:
            # Permitted victims hold at least the unallocated GPUs (a bound found is never
            # below them: asked first, it spares the tally's look-up).
            name = nf.node.name
            freeable = bounds.get(name)
            if freeable is None:
                if victims.node_totals(name)[1] < short:
                    freeable = victims.bound_into(bounds, name, allowed)
                else:
                    freeable = short
            if freeable < short:
                continue
        nodes.append(nf)
    if len(nodes) < request.nodes:
        return None
    return nodes


def search_targets(
    request: Request,
    capacity: Capacity,
    victims: Victims,
    allowed: frozenset[str],
    now: float,
    lane: Lane | None = None,
    spare: str | None = None,
) -> tuple[tuple[Target, ...] | None, bool]:
    """`find_targets`, and whether a failure was for want of nodes that `offers`
    (fewer than the request needs): then it fails again until one of them grows.
    ``lane``: the fast lane's limit on victims, for a debug request (bounds stay
    upper bounds: they count every session ``allowed`` permits). ``spare``: a session
    that is no victim of this request (S10)."""
    whole = request.mig is None and not request.gpu_milli and request.gpus > 0
    if whole:
        roomy = _roomy_nodes(request, capacity, victims, allowed)
        if roomy is None:
            return None, True
        nodes = roomy
    else:
        nodes = capacity.pool_nodes(request.pool)
    options: list[Target] = []
    free_options = 0
    searched: list[tuple[tuple[float, float, float, float], str, NodeFree]] = []
    single = request.nodes == 1
    slack = victims.slack_for(request)
    for node_free in nodes:
        name = node_free.node.name
        if single and not victims.has(name):
            continue
        if not capacity.eligible(node_free, request):
            continue
        if not single:
            free_slices = node_free.slices_for(request)
            if free_slices is not None:
                options.append(Target(name, (), free_slices, (0.0, 0.0, 0.0, 0.0)))
                free_options += 1
                continue
        for first in victims.on(name):
            if _permits(victims, first, allowed, lane, spare, slack):
                bound = (
                    float(victims.tier(first)),
                    float(victims.is_busy(first)),
                    lost_work(first, now, victims.gang_wait),
                    1.0,
                )
                searched.append((bound, name, node_free))
                break
    if free_options >= request.nodes:
        return None, False
    # Branch and bound: a node's cost is at least that of its cheapest victim,
    # so once `request.nodes` options cost no more than the next bound, stop.
    # Sorted as tuples, not by ``key=lambda``: each node is searched once, so no two
    # (bound, name) pairs are equal and no NodeFree is compared (the same order).
    searched.sort()
    for bound, name, node_free in searched:
        if len(options) >= request.nodes:
            options.sort(key=lambda t: (t.cost, t.node))
            if options[request.nodes - 1].cost <= bound:
                break
        candidates = [
            a for a in victims.on(name) if _permits(victims, a, allowed, lane, spare, slack)
        ]
        target = _node_target(node_free, request, candidates, now, victims)
        if target is not None:
            options.append(target)
    if len(options) < request.nodes:
        return None, True
    options.sort(key=lambda t: (t.cost, t.node))
    return tuple(options[: request.nodes]), False
