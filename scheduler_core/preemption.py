"""Choosing preemption victims (DESIGN.md §4 rule 4), without side effects.

`find_targets` reads the cycle's capacity and the running allocations and says
which sessions to stop so a funded request fits; the policy applies the answer
and the actuator carries it out. Victims come from one node (or, for a
multi-node request, a set of nodes): unallocated sessions past their grace
first, then funded sessions past their protected window whose team ranks below
the requester's once the requester's protected time is counted. Among the sets
that work, the one that loses the least work wins.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_core.capacity import Capacity, NodeFree
from scheduler_core.model import MILLI, Allocation, Request, Slice, SliceKind


@dataclass(frozen=True, slots=True)
class Target:
    """Victims on one node and what stopping them costs."""

    node: str
    victims: tuple[Allocation, ...]
    slices: tuple[Slice, ...]
    cost: tuple[float, float, float]


def lost_work(allocation: Allocation, now: float) -> float:
    """GPU- or core-seconds of work a preemption throws away.

    Resumable work is snapshotted and keeps its progress; anything else starts over.
    """
    if allocation.request.resumable:
        return 0.0
    return max(0.0, now - allocation.start) * allocation.charge_rate


def victim_order(allocation: Allocation, now: float) -> tuple[int, float, float, str]:
    """Cheapest victim first: unallocated before funded, then least work lost."""
    return (int(allocation.funded), lost_work(allocation, now), -allocation.start, allocation.id)


def _could_fit(node_free: NodeFree, request: Request, candidates: Sequence[Allocation]) -> bool:
    """A cheap upper bound: could stopping every candidate make room at all?"""
    name = node_free.node.name
    cpus, memory, whole = node_free.cpus, node_free.memory_gib, node_free.free_whole
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


def _node_target(
    node_free: NodeFree,
    request: Request,
    candidates: Sequence[Allocation],
    now: float,
) -> Target | None:
    """The cheapest victims on one node; ``candidates`` come cheapest first."""
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
        if trial.slices_for(request) is not None:
            break
    else:
        return None
    # Drop any victim that turned out not to be needed, latest-added first.
    for victim in reversed(chosen[:-1]):
        rest = [v for v in chosen if v is not victim]
        if _freed(node_free, rest).slices_for(request) is not None:
            chosen = rest
    slices = _freed(node_free, chosen).slices_for(request)
    assert slices is not None
    cost = (
        float(max(int(v.funded) for v in chosen)),
        sum(lost_work(v, now) for v in chosen),
        float(len(chosen)),
    )
    return Target(name, tuple(chosen), slices, cost)


class Victims:
    """Running allocations that may be preempted this cycle, indexed for the search.

    Per node, cheapest first; per pool, how many GPUs each team's preemptible
    sessions hold (None: unallocated), so a hopeless search stops in O(teams).
    """

    def __init__(self, allocations: Iterable[Allocation], now: float) -> None:
        self.by_node: dict[str, list[Allocation]] = defaultdict(list)
        self.gpus: dict[str, dict[str | None, int]] = defaultdict(lambda: defaultdict(int))
        self.node_gpus: dict[str, dict[str | None, int]] = defaultdict(lambda: defaultdict(int))
        self._permitted: dict[frozenset[str], dict[str, int]] = {}
        for allocation in sorted(allocations, key=lambda a: victim_order(a, now)):
            for node in allocation.node_names:
                self.by_node[node].append(allocation)
            self._tally(allocation, 1)

    def _tally(self, allocation: Allocation, sign: int) -> None:
        key = allocation.team if allocation.funded else None
        for grant in allocation.grants:
            held = sum(1 for piece in grant.slices if piece.kind is not SliceKind.MIG)
            self.gpus[allocation.pool][key] += sign * held
            self.node_gpus[grant.node][key] += sign * held

    def remove(self, allocation: Allocation) -> None:
        for node in allocation.node_names:
            self.by_node[node] = [a for a in self.by_node[node] if a is not allocation]
        self._tally(allocation, -1)
        self._permitted.clear()

    def gpu_bound(self, pool: str, allowed: frozenset[str]) -> int:
        """GPUs that stopping every permitted victim in the pool could free, at most."""
        return _permitted(self.gpus.get(pool, {}), allowed)

    def node_gpu_bounds(self, allowed: frozenset[str]) -> Mapping[str, int]:
        """Per node, GPUs that stopping every permitted victim there could free, at most."""
        found = self._permitted.get(allowed)
        if found is None:
            found = {node: _permitted(held, allowed) for node, held in self.node_gpus.items()}
            self._permitted[allowed] = found
        return found


def _permitted(held: Mapping[str | None, int], allowed: frozenset[str]) -> int:
    return held.get(None, 0) + sum(n for team, n in held.items() if team in allowed)


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
    whole = request.mig is None and not request.gpu_milli and request.gpus > 0
    nodes = capacity.pool_nodes(request.pool)
    if whole:
        need = request.gpus * request.nodes
        if (
            capacity.free_whole_total(request.pool) + victims.gpu_bound(request.pool, allowed)
            < need
        ):
            return None
        bounds = victims.node_gpu_bounds(allowed)
        nodes = [nf for nf in nodes if len(nf.whole) + bounds.get(nf.node.name, 0) >= request.gpus]
        if len(nodes) < request.nodes:
            return None
    options: list[Target] = []
    free_options = 0
    searched: list[tuple[tuple[float, float, float], NodeFree, list[Allocation]]] = []
    single = request.nodes == 1
    for node_free in nodes:
        name = node_free.node.name
        on_node = victims.by_node.get(name)
        if single and not on_node:
            continue
        if not capacity.eligible(node_free, request):
            continue
        if not single:
            free_slices = node_free.slices_for(request)
            if free_slices is not None:
                options.append(Target(name, (), free_slices, (0.0, 0.0, 0.0)))
                free_options += 1
                continue
        if not on_node:
            continue
        candidates = [a for a in on_node if not a.funded or a.request.team in allowed]
        if candidates:
            first = candidates[0]
            bound = (float(first.funded), lost_work(first, now), 1.0)
            searched.append((bound, node_free, candidates))
    if free_options >= request.nodes:
        return None
    # Branch and bound: a node's cost is at least that of its cheapest victim,
    # so once `request.nodes` options cost no more than the next bound, stop.
    searched.sort(key=lambda item: (item[0], item[1].node.name))
    for bound, node_free, candidates in searched:
        if len(options) >= request.nodes:
            options.sort(key=lambda t: (t.cost, t.node))
            if options[request.nodes - 1].cost <= bound:
                break
        target = _node_target(node_free, request, candidates, now)
        if target is not None:
            options.append(target)
    if len(options) < request.nodes:
        return None
    options.sort(key=lambda t: (t.cost, t.node))
    return tuple(options[: request.nodes])
