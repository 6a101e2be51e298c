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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_core.capacity import Capacity, NodeFree
from scheduler_core.model import MILLI, Allocation, Request, Slice


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


def find_targets(
    request: Request,
    capacity: Capacity,
    preemptible: Mapping[str, Sequence[Allocation]],
    may_preempt: Callable[[Allocation], bool],
    now: float,
) -> tuple[Target, ...] | None:
    """Nodes (one per requested node) and the victims to stop on each, or None.

    ``preemptible`` lists, per node and cheapest first, running allocations past
    their protected window or grace; ``may_preempt`` applies the rank rule.
    A node where the request already fits costs nothing.
    """
    options: list[Target] = []
    free_options = 0
    searched: list[tuple[tuple[float, float, float], NodeFree, list[Allocation]]] = []
    for node_free in capacity.pool_nodes(request.pool):
        if not capacity.eligible(node_free, request):
            continue
        free_slices = node_free.slices_for(request)
        if free_slices is not None:
            options.append(Target(node_free.node.name, (), free_slices, (0.0, 0.0, 0.0)))
            free_options += 1
            continue
        candidates = [a for a in preemptible.get(node_free.node.name, ()) if may_preempt(a)]
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
