"""The budget policy: ``decide(snapshot, now) -> Decisions``, pure.

One cycle: handle unhealthy nodes (rule 6), keep last cycle's reservations
(rule 7), then for each pool take the pending requests team by team, the team
with the lowest occupancy ratio first (rule 1; declared priority and submit
time order only a team's own queue), fund them while the team is under its
allocation (rule 2, see `funds`), place them on free slices (rule 3) or, when
funded, on slices freed by preemption (rule 4). Policies are registered by name
in `POLICIES` (registry.py); the rules the baselines share with it (node
health, kept holds, funding) are in rules.py.

Why funding has two tests and reservations go only to funded requests: with the
window budget alone, a team that was quiet could fund several times its share at
once, and then, its budget spent, run nothing funded for days while still owed its
share hour by hour (on the seed-like month, funded use above a team's share came
to twice the GPU-hours teams were short). So a team is always funded within its
share of the pool now (`guaranteed_share`), and the window budget funds work beyond
that only up to `funded_burst` times the share. Holding nodes for a request that
would run unallocated drained them for work that must yield to the first funded
request: most idle GPUs sat on such nodes.

A team at the head of the queue keeps it, without a trip through the heap,
while its next request still sorts first: the order is the heap's, only cheaper.
When the snapshot carries a `CycleIndex` the sorted queues, protected sessions
and victims come from it instead of being rebuilt from every running session,
and victim searches that failed in earlier cycles are only re-checked on the
nodes that grew since (`KnownFailures`): a search's answer is monotone in room
and victims, so that check is exact, not a heuristic.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping
from types import MappingProxyType

from scheduler_core.capacity import Capacity, could_hold
from scheduler_core.model import Allocation, NodeGrant, PoolKind, Request
from scheduler_core.preemption import Victims, offers, search_targets
from scheduler_core.ranking import Key, PoolRanking
from scheduler_core.registry import POLICIES, Policy, decide, register
from scheduler_core.rules import funded_rates, funds, health_preemptions, kept_reservations
from scheduler_core.snapshot import (
    Admission,
    CycleIndex,
    Decisions,
    Preemption,
    Queued,
    SearchKey,
    Shape,
    Snapshot,
    queue_key,
    shape_of,
)

__all__ = [
    "POLICIES",
    "Failures",
    "KnownFailures",
    "Policy",
    "Shape",
    "budget_policy",
    "choose_reservation",
    "decide",
    "queue_order",
    "register",
    "shape_of",
]
# POLICIES, Policy, decide and register live in registry.py; they are named here too
# for the callers that import them from the policy.


def queue_order(requests: list[Request]) -> list[Request]:
    """Order inside one team: declared priority (high first), then submit time."""
    return sorted(requests, key=queue_key)


class Failures:
    """Shapes that found no room this cycle, with the after-swap key they had.

    Capacity only shrinks while a cycle places work, so a shape that did not fit
    keeps not fitting, and so does any larger one; a preemption frees slices and
    clears the record. For victim searches, a team whose key is no lower may
    preempt a subset of the sessions, so it fails as well. Answers are also
    remembered by shape number (`Queued.shape_id`), the common case of a queue
    holding many requests of one shape.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[object, ...], list[tuple[Shape, tuple[float, ...]]]] = {}
        self.exact: dict[int, tuple[float, ...]] = {}
        """Shape number → the lowest key at which that very shape is known to fail
        (read it directly for speed; it is only ever cleared in place)."""

    def add(self, shape: Shape, key: tuple[float, ...] = (), number: int | None = None) -> None:
        if not self.known(shape, key, number):
            self._seen.setdefault(shape.kind, []).append((shape, key))
            if number is not None:
                self.exact[number] = key

    def known(self, shape: Shape, key: tuple[float, ...] = (), number: int | None = None) -> bool:
        at: tuple[float, ...] | None = None
        if number is not None:
            at = self.exact.get(number)
            if at is not None and key >= at:
                return True
        for failed, failed_at in self._seen.get(shape.kind, ()):
            if key >= failed_at and failed.covers(shape):
                if number is not None and (at is None or key < at):
                    self.exact[number] = key
                return True
        return False

    def clear(self) -> None:
        self._seen.clear()
        self.exact.clear()


class KnownFailures:
    """Victim searches known to fail, carried from cycle to cycle (`CycleIndex.searches`).

    A search fails for want of nodes where the request could go once the
    permitted victims stop. A node gains that only if room, eligibility or
    victims grew there, so a search that failed keeps failing, for the same
    permitted teams, until some node that grew since then could take the
    request: checking those few nodes stands in for the whole search.
    """

    FOCUS_LIMIT = 8
    """More grown nodes than this and the whole search is cheaper."""
    REACH = 32
    """A failure recorded more than this many log entries ago is not looked at."""

    def __init__(self, index: CycleIndex | None, capacity: Capacity) -> None:
        self._capacity = capacity
        self._earlier: Mapping[SearchKey, int] = index.searches if index is not None else {}
        self._log = index.growth if index is not None else ()
        self._start = index.growth_start if index is not None else 0
        self._end = index.growth_end if index is not None else 0
        self.grown: list[str] = []
        """Nodes this cycle made eligible again (holds dropped or released)."""
        self._here: dict[SearchKey, tuple[int, int]] = {}
        self.found: dict[SearchKey, int] = {}
        """Failures this cycle, as of the log position the cycle started at."""

    def fails(self, request: Request, key: SearchKey, victims: Victims) -> bool:
        """Is the search for ``request`` (shape and permitted teams ``key``) known to fail?"""
        capacity = self._capacity
        here = self._here.get(key)
        if here is not None:
            focus = set(self.grown[here[0] :])
            focus.update(capacity.grown[here[1] :])
        else:
            stamp = self._earlier.get(key)
            if stamp is None or not self._start <= stamp <= self._end:
                return False
            if self._end - stamp > self.REACH:
                return False
            focus = set(self._log[stamp - self._start : self._end - self._start])
            focus.update(self.grown)
            focus.update(capacity.grown)
        if len(focus) > self.FOCUS_LIMIT:
            return False
        free = capacity.free
        for name in focus:
            node_free = free.get(name)
            if (
                node_free is not None
                and node_free.node.pool == request.pool
                and offers(capacity, victims, request, key[1], node_free)
            ):
                return False
        return True

    def failed(self, key: SearchKey) -> None:
        """The search for ``key`` fails now (for want of nodes)."""
        self._here[key] = (len(self.grown), len(self._capacity.grown))
        self.found[key] = self._end


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


def _drop_hold(capacity: Capacity, request_id: str, grown: list[str]) -> None:
    """Give back the nodes held for ``request_id`` (noting them as grown)."""
    for node in [n for n, r in capacity.reserved.items() if r == request_id]:
        del capacity.reserved[node]
        grown.append(node)


def _queues(snapshot: Snapshot) -> Mapping[str, Mapping[str, tuple[Queued, ...]]]:
    """The pending requests per pool and team, in queue order, with their figures."""
    grouped: dict[str, dict[str, list[Request]]] = defaultdict(lambda: defaultdict(list))
    for request in snapshot.pending:
        grouped[request.pool][request.team].append(request)
    settings = snapshot.settings
    kinds = {name: pool.kind for name, pool in snapshot.pools.items()}
    out: dict[str, dict[str, tuple[Queued, ...]]] = {}
    for pool, teams in grouped.items():
        kind = kinds.get(pool, PoolKind.GPU)
        out[pool] = {
            team: tuple(Queued.of(r, settings, kind) for r in sorted(requests, key=queue_key))
            for team, requests in teams.items()
        }
    return out


@register("budget")
def budget_policy(snapshot: Snapshot, now: float) -> Decisions:
    """The contract of DESIGN.md §4."""
    settings = snapshot.settings
    placement = settings.placement
    index = snapshot.index
    if index is not None and index.at != now:
        index = None
    capacity = Capacity(
        snapshot.nodes,
        snapshot.allocations,
        snapshot.free,
        index.layout if index else None,
        index.whole if index else None,
    )
    preemptions = health_preemptions(snapshot, now)
    stopped = {p.allocation_id for p in preemptions}
    by_id: dict[str, Allocation] = {}
    if stopped:
        by_id = {a.id: a for a in snapshot.allocations}
        for allocation_id in stopped:
            capacity.give(by_id[allocation_id].grants)

    rates = funded_rates(snapshot, stopped)
    window = snapshot.window

    victim_index: list[Victims] = []

    def victims() -> Victims:
        """Built on first use: most cycles never search for victims."""
        if not victim_index:
            if index is not None:
                found = Victims.of(index.exposed, now, index.reach)
                for allocation_id in stopped:
                    allocation = by_id[allocation_id]
                    if allocation.protected_until <= now:
                        found.remove(allocation)
            else:
                found = Victims(
                    (
                        a
                        for a in snapshot.allocations
                        if a.id not in stopped and a.protected_until <= now
                    ),
                    now,
                )
            victim_index.append(found)
        return victim_index[0]

    kept_reservations(snapshot, capacity)
    known_failures = KnownFailures(index, capacity)
    for held_nodes in snapshot.reservations.values():
        known_failures.grown.extend(n for n in held_nodes if n not in capacity.reserved)
    held_per_pool: dict[str, set[str]] = defaultdict(set)
    for node, request_id in capacity.reserved.items():
        held_per_pool[capacity.free[node].node.pool].add(request_id)

    queues = index.queues if index is not None and index.queues is not None else None
    if queues is None:
        queues = _queues(snapshot)

    admissions: list[Admission] = []
    released: list[str] = []
    order: list[str] = []
    funded_now: dict[str, bool] = {}
    team_names = tuple(snapshot.teams.teams)
    unallocated_grace = settings.unallocated_grace
    starvation_bound = settings.starvation_bound
    max_reservations = settings.max_reservations_per_pool
    heappush, heappop = heapq.heappush, heapq.heappop

    for pool_name in sorted(queues):
        team_queues = queues[pool_name]
        if not team_queues:
            continue
        ranking = PoolRanking(
            snapshot, pool_name, now, index.protected.get(pool_name, ()) if index else None
        )
        heads = dict.fromkeys(team_queues, 0)
        heap = [(ranking.key(team), q[0].request.submit, team) for team, q in team_queues.items()]
        heapq.heapify(heap)
        no_fit = Failures()
        no_victims = Failures()
        no_fit_exact = no_fit.exact
        no_victims_exact = no_victims.exact
        team_keys: list[tuple[str, Key]] = []
        team_keys_at = -1
        held = held_per_pool[pool_name]

        while heap:
            key, _, team = heappop(heap)
            current = ranking.key(team)
            if current > key:
                # Funded admissions elsewhere in this team's subtree moved it back.
                heappush(heap, (current, team_queues[team][heads[team]].request.submit, team))
                continue
            queue = team_queues[team]
            at = heads[team]
            end = len(queue)
            # Until this team is charged (which ends the run), its ratios stand still.
            leaf_units, leaf_budget = ranking.leaf(team)
            share_rate = leaf_budget / window if window > 0 else 0.0
            rate_key = (team, pool_name)
            afters: dict[float, Key] = {}
            if team_keys_at != ranking.charges:
                team_keys = []
            top = heap[0] if heap else None
            while True:
                entry = queue[at]
                at += 1
                request = entry.request
                request_id = request.id
                order.append(request_id)
                units = entry.units
                funded = funds(
                    leaf_budget > 0.0 and (leaf_units + units) / leaf_budget <= 1.0,
                    rates[rate_key],
                    entry.rate,
                    share_rate,
                    settings,
                )
                funded_now[request_id] = funded
                charged = False

                grants: tuple[NodeGrant, ...] | None = None
                preempted_ids: tuple[str, ...] = ()
                holder = bool(held) and request_id in held
                if holder and not funded:
                    # It would run unallocated: its nodes go back to everyone.
                    _drop_hold(capacity, request_id, known_failures.grown)
                    held.discard(request_id)
                    released.append(request_id)
                    holder = False
                if holder or (
                    entry.shape_id not in no_fit_exact
                    and not no_fit.known(entry.shape, (), entry.shape_id)
                ):
                    grants = capacity.place(request, placement)
                    if grants is None and not holder:
                        no_fit.add(entry.shape, (), entry.shape_id)
                if grants is None and funded:
                    after = afters.get(units)
                    if after is None:
                        after = afters[units] = ranking.key(team, units)
                    failed_at = no_victims_exact.get(entry.shape_id)
                    if (failed_at is None or after < failed_at) and not no_victims.known(
                        entry.shape, after, entry.shape_id
                    ):
                        if not team_keys:
                            team_keys = [(t, ranking.key(t)) for t in team_names]
                            team_keys_at = ranking.charges
                        below = frozenset(t for t, k in team_keys if t != team and k > after)
                        search = (entry.shape_id, below)
                        if not holder and known_failures.fails(request, search, victims()):
                            targets, for_want = None, True
                        else:
                            targets, for_want = search_targets(
                                request, capacity, victims(), below, now
                            )
                        if targets is None:
                            if for_want and not holder:
                                known_failures.failed(search)
                            no_victims.add(entry.shape, after, entry.shape_id)
                        else:
                            chosen: dict[str, Allocation] = {}
                            for target in targets:
                                for victim in target.victims:
                                    chosen[victim.id] = victim
                            for victim in chosen.values():
                                if victim.funded:
                                    lost = (victim.team, victim.pool)
                                    rates[lost] -= victim.charge_rate
                                capacity.give(victim.grants)
                                stopped.add(victim.id)
                                preemptions.append(Preemption(victim.id, "funded", request_id))
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
                        _drop_hold(capacity, request_id, known_failures.grown)
                        held.discard(request_id)
                        released.append(request_id)
                    protected = entry.min_runtime if funded else unallocated_grace
                    admissions.append(
                        Admission(
                            request, grants, funded, now + protected, entry.rate, preempted_ids
                        )
                    )
                    if funded:
                        rates[rate_key] += entry.rate
                        ranking.charge(team, units)
                        charged = True
                elif (
                    funded
                    and now - request.submit >= starvation_bound
                    and not holder
                    and len(held) < max_reservations
                ):
                    nodes = choose_reservation(capacity, request)
                    if nodes is not None:
                        for node in nodes:
                            capacity.reserved[node] = request_id
                        held.add(request_id)

                if at >= end:
                    break
                if not charged and (top is None or current < top[0]):
                    continue
                following = (current, queue[at].request.submit, team)
                if charged or (top is not None and not following < top):
                    heappush(heap, following)
                    break
            heads[team] = at

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
        searches=MappingProxyType(known_failures.found),
    )
