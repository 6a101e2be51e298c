"""The budget policy: ``decide(snapshot, now) -> Decisions``, pure.

One cycle: handle unhealthy nodes (rule 6), keep last cycle's reservations
(rule 7), then for each pool take the pending requests team by team, the team
with the lowest occupancy ratio first (rule 1; declared priority and submit
time order only a team's own queue), fund them while the team's budget holds
(rule 2), place them on free slices (rule 3) or, when funded, on slices freed
by preemption (rule 4). Policies are registered by name in `POLICIES`.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from scheduler_core.capacity import Capacity, could_hold
from scheduler_core.model import Allocation, Health, NodeGrant, Request
from scheduler_core.preemption import Victims, find_targets
from scheduler_core.ranking import PoolRanking
from scheduler_core.snapshot import Admission, Decisions, Preemption, Snapshot

Policy = Callable[[Snapshot, float], Decisions]

POLICIES: dict[str, Policy] = {}
"""Policy name → decide function. Baselines register themselves here too."""


def register(name: str) -> Callable[[Policy], Policy]:
    def add(policy: Policy) -> Policy:
        POLICIES[name] = policy
        return policy

    return add


def decide(snapshot: Snapshot, now: float) -> Decisions:
    """Run the policy the snapshot's settings name."""
    try:
        policy = POLICIES[snapshot.settings.name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {snapshot.settings.name!r} (known: {known})") from None
    return policy(snapshot, now)


def queue_order(requests: list[Request]) -> list[Request]:
    """Order inside one team: declared priority (high first), then submit time."""
    return sorted(requests, key=lambda r: (-r.priority, r.submit, r.id))


@dataclass(frozen=True, slots=True)
class Shape:
    """What a request needs on each node; a larger shape fits nowhere a smaller one does not."""

    kind: tuple[object, ...]
    """Pool, labels and MIG profile: shapes of different kinds are not comparable."""
    gpus: int
    nodes: int
    gpu_milli: int
    cpus: float
    memory_gib: float

    def covers(self, other: Shape) -> bool:
        """Is ``other`` at least as large in every dimension (so fails where self fails)?"""
        return (
            self.kind == other.kind
            and other.gpus >= self.gpus
            and other.nodes >= self.nodes
            and other.gpu_milli >= self.gpu_milli
            and other.cpus >= self.cpus
            and other.memory_gib >= self.memory_gib
        )


def shape_of(request: Request) -> Shape:
    labels = tuple(sorted(request.labels.items())) if request.labels else ()
    kind = (request.pool, request.mig, bool(request.gpu_milli), labels)
    return Shape(
        kind, request.gpus, request.nodes, request.gpu_milli, request.cpus, request.memory_gib
    )


class Failures:
    """Shapes that found no room this cycle, with the after-swap key they had.

    Capacity only shrinks while a cycle places work, so a shape that did not fit
    keeps not fitting, and so does any larger one; a preemption frees slices and
    clears the record. For victim searches, a team whose key is no lower may
    preempt a subset of the sessions, so it fails as well.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[object, ...], list[tuple[Shape, tuple[float, ...]]]] = {}

    def add(self, shape: Shape, key: tuple[float, ...] = ()) -> None:
        if not self.known(shape, key):
            self._seen.setdefault(shape.kind, []).append((shape, key))

    def known(self, shape: Shape, key: tuple[float, ...] = ()) -> bool:
        return any(
            failed.covers(shape) and key >= at for failed, at in self._seen.get(shape.kind, ())
        )

    def clear(self) -> None:
        self._seen.clear()


def health_preemptions(snapshot: Snapshot, now: float) -> list[Preemption]:
    """Sessions on down nodes end now; on draining nodes, once their protection ends."""
    if all(n.health is Health.READY for n in snapshot.nodes):
        return []
    health = {n.name: n.health for n in snapshot.nodes}
    found: list[Preemption] = []
    for allocation in snapshot.allocations:
        states = {health.get(node, Health.DOWN) for node in allocation.node_names}
        if Health.DOWN in states:
            found.append(Preemption(allocation.id, "node-down"))
        elif Health.DRAINING in states and allocation.protected_until <= now:
            found.append(Preemption(allocation.id, "drain"))
    return found


def kept_reservations(snapshot: Snapshot, capacity: Capacity) -> None:
    """Carry last cycle's holds over while their request waits and their nodes are ready."""
    pending = snapshot.queued if snapshot.queued is not None else {r.id for r in snapshot.pending}
    for request_id, nodes in snapshot.reservations.items():
        if request_id not in pending:
            continue
        if all(n in capacity.free and capacity.free[n].node.health is Health.READY for n in nodes):
            for node in nodes:
                capacity.reserved[node] = request_id


def choose_reservation(capacity: Capacity, request: Request) -> tuple[str, ...] | None:
    """Nodes to hold for a starving request: those closest to fitting it.

    Closest means most free GPUs now, then most free CPUs: what is still running
    there ends or becomes preemptible in time, and nothing new lands meanwhile.
    """
    options = [
        nf
        for nf in capacity.pool_nodes(request.pool)
        if nf.node.name not in capacity.reserved
        and capacity.eligible(nf, request)
        and could_hold(nf.node, request)
    ]
    if len(options) < request.nodes:
        return None
    options.sort(key=lambda nf: (-nf.free_whole, -nf.cpus, nf.node.name))
    return tuple(nf.node.name for nf in options[: request.nodes])


@register("budget")
def budget_policy(snapshot: Snapshot, now: float) -> Decisions:
    """The contract of DESIGN.md §4."""
    settings = snapshot.settings
    capacity = Capacity(snapshot.nodes, snapshot.allocations, snapshot.free)
    preemptions = health_preemptions(snapshot, now)
    stopped = {p.allocation_id for p in preemptions}
    by_id = {a.id: a for a in snapshot.allocations}
    for allocation_id in stopped:
        capacity.give(by_id[allocation_id].grants)

    victim_index: list[Victims] = []

    def victims() -> Victims:
        """Built on first use: most cycles never search for victims."""
        if not victim_index:
            exposed = (
                a for a in snapshot.allocations if a.id not in stopped and a.protected_until <= now
            )
            victim_index.append(Victims(exposed, now))
        return victim_index[0]

    kept_reservations(snapshot, capacity)
    held_per_pool: dict[str, set[str]] = defaultdict(set)
    for node, request_id in capacity.reserved.items():
        held_per_pool[capacity.free[node].node.pool].add(request_id)

    queues: dict[str, dict[str, list[Request]]] = defaultdict(lambda: defaultdict(list))
    for request in snapshot.pending:
        queues[request.pool][request.team].append(request)

    admissions: list[Admission] = []
    released: list[str] = []
    order: list[str] = []
    funded_now: dict[str, bool] = {}
    pool_kind = {name: pool.kind for name, pool in snapshot.pools.items()}
    team_names = tuple(snapshot.teams.teams)

    for pool_name in sorted(queues):
        ranking = PoolRanking(snapshot, pool_name, now)
        team_queues = {team: queue_order(reqs) for team, reqs in queues[pool_name].items()}
        heads = dict.fromkeys(team_queues, 0)
        heap = [(ranking.key(team), reqs[0].submit, team) for team, reqs in team_queues.items()]
        heapq.heapify(heap)
        no_fit = Failures()
        no_victims = Failures()

        while heap:
            key, _, team = heapq.heappop(heap)
            current = ranking.key(team)
            if current > key:
                # Funded admissions elsewhere in this team's subtree moved it back.
                heapq.heappush(heap, (current, team_queues[team][heads[team]].submit, team))
                continue
            request = team_queues[team][heads[team]]
            heads[team] += 1
            if heads[team] < len(team_queues[team]):
                nxt = team_queues[team][heads[team]]
                heapq.heappush(heap, (current, nxt.submit, team))
            order.append(request.id)

            min_runtime = settings.capped_min_runtime(request.min_runtime, request.klass)
            rate = request.charge_rate(pool_kind[pool_name])
            units = rate * min_runtime
            funded = ranking.can_fund(team, units)
            funded_now[request.id] = funded
            shape = shape_of(request)

            grants: tuple[NodeGrant, ...] | None = None
            preempted_ids: tuple[str, ...] = ()
            holder = request.id in held_per_pool[pool_name]
            if holder or not no_fit.known(shape):
                grants = capacity.place(request, settings.placement)
                if grants is None and not holder:
                    no_fit.add(shape)
            after = ranking.key(team, units) if grants is None and funded else ()
            if grants is None and funded and not no_victims.known(shape, after):
                below = frozenset(t for t in team_names if t != team and ranking.key(t) > after)
                targets = find_targets(request, capacity, victims(), below, now)
                if targets is None:
                    no_victims.add(shape, after)
                else:
                    chosen: dict[str, Allocation] = {}
                    for target in targets:
                        for victim in target.victims:
                            chosen[victim.id] = victim
                    for victim in chosen.values():
                        capacity.give(victim.grants)
                        stopped.add(victim.id)
                        preemptions.append(Preemption(victim.id, "funded", request.id))
                        victims().remove(victim)
                    preempted_ids = tuple(chosen)
                    built = tuple(
                        NodeGrant(t.node, t.slices, request.cpus, request.memory_gib)
                        for t in targets
                    )
                    capacity.take(built)
                    grants = built
                    no_fit.clear()
                    no_victims.clear()

            if grants is not None:
                if holder:
                    for node in [n for n, r in capacity.reserved.items() if r == request.id]:
                        del capacity.reserved[node]
                    held_per_pool[pool_name].discard(request.id)
                    released.append(request.id)
                protected = min_runtime if funded else settings.unallocated_grace
                admissions.append(
                    Admission(request, grants, funded, now + protected, rate, preempted_ids)
                )
                if funded:
                    ranking.charge(team, units)
                continue

            starving = now - request.submit >= settings.starvation_bound
            if (
                starving
                and not holder
                and len(held_per_pool[pool_name]) < settings.max_reservations_per_pool
            ):
                nodes = choose_reservation(capacity, request)
                if nodes is not None:
                    for node in nodes:
                        capacity.reserved[node] = request.id
                    held_per_pool[pool_name].add(request.id)

    reservations: dict[str, list[str]] = defaultdict(list)
    for node, request_id in sorted(capacity.reserved.items()):
        reservations[request_id].append(node)
    return Decisions(
        admissions=tuple(admissions),
        preemptions=tuple(preemptions),
        reservations=MappingProxyType({k: tuple(v) for k, v in reservations.items()}),
        order=tuple(order),
        funded=MappingProxyType(funded_now),
        released=tuple(released),
    )
