"""R4 of docs/architecture.md, victims: a funded request with no room on free slices
stops the sessions that lose the least work, within the rules at saturation that
limit whom it may stop: the debug fast lane (S1), burst work that yields (S4), a day
slice shorter than an hour (S5), a team slicing itself (S6), a holder ranked as its
team stands (S7), no stop worth less than its price (R8), no turns (S10). The search
itself is preemption.py's; here are who may be stopped, and what the cycle does with
the answer: each victim's code and cost (`victim_code`) for the verdict."""

from __future__ import annotations

from scheduler_core.kept import Queued, SearchKey
from scheduler_core.model import Allocation, NodeGrant
from scheduler_core.policy.cycle import Cycle, Pass
from scheduler_core.preemption import Lane, Victims, lost_work, offers, search_targets
from scheduler_core.ranking import Key
from scheduler_core.verdict import VICTIM_BELOW, VICTIM_BORROWED, VICTIM_IDLE, VICTIM_OWN
from scheduler_core.view import Preemption

__all__ = ["evict", "lane", "over_share", "own_swappable", "stop_for", "victim_code"]

Found = tuple[tuple[NodeGrant, ...], tuple[str, ...]]
"""An entry's grants and the ids of the sessions stopped for them."""


def evict(
    cycle: Cycle,
    entry: Queued,
    after: Key,
    holder: bool,
    state: Pass,
    burst: bool,
    swap: bool = False,
    short: bool = False,
) -> Found | None:
    """R4: for a funded entry with no room on free slices, stop the sessions that lose
    the least work and make room: unallocated ones past their grace, funded ones past
    their protected window of teams whose key is above ``after`` (the team's key with
    the entry charged). None, with the shape remembered in ``state.no_victims``
    unless the entry holds nodes (and the search in `KnownFailures`), if no set of
    victims makes room. A ``burst`` entry (funded beyond its team's share next to
    other funded work of the team) may stop only unallocated sessions (S4); a
    ``swap`` entry (a job that slices its own team) may stop its own team's sessions
    past protection as well (S6); a ``swap`` or ``short`` entry (a day slice shorter
    than ``default_min_runtime``) stops only sessions that resume (S5, S6)."""
    team = entry.request.team
    ranking = state.ranking
    if not state.team_keys or state.team_keys_at != ranking.charges:
        state.team_keys = [(t, ranking.key(t)) for t in cycle.view.teams.teams]
        state.team_keys_at = ranking.charges
    if burst:
        # Funded beyond its share next to other funded work: like unallocated work,
        # it may stop only unallocated sessions (else it and the fast lane take
        # turns stopping each other). A team's only funded job may be larger than
        # its share: that is how a small team runs a large job.
        below: frozenset[str] = frozenset()
    else:
        below = ranking.below(team, after, state.team_keys)
    if swap:
        below |= {team}
    limit = None
    if entry.debug:  # the fast lane
        limit = Lane(below)
        below |= over_share(cycle, state) | {team}
    elif swap or short:
        # A team's own time slice, or a day slice shorter than an hour: it throws
        # no one's work away (`Lane`).
        limit = Lane(None, resumable=True)
    # A search under a lane's limit speaks for no other entry of its shape.
    found = stop_for(
        cycle,
        entry,
        below,
        holder,
        state,
        None if burst or limit is not None or ranking.related(team) else after,
        limit,
    )
    if found is None and burst and limit is None and not holder:
        if not (cycle.spared and entry.request.id in cycle.spared):
            # One that spares its stopper (S10) speaks for no other entry of its shape.
            state.no_burst.add(entry.shape, (), entry.shape_id)
    return found


def lane(cycle: Cycle, entry: Queued, holder: bool, state: Pass) -> Found | None:
    """S1, the fast lane for a debug entry its team's budget does not fund: it may stop
    unallocated sessions past their grace (borrowed capacity) and its own team's
    funded sessions past their protected window (which may then fund it)."""
    below = over_share(cycle, state) | {entry.request.team}
    return stop_for(cycle, entry, below, holder, state, None, Lane(None))


def own_swappable(cycle: Cycle, team: str, pool: str) -> bool:
    """S6: every funded session of the team in the pool is resumable and past
    protection (so a job of the team that slices it may stop them:
    `Settings.own_slice_after`), or stopped this cycle."""
    blockers = cycle.blockers
    if blockers is None:
        blockers = cycle.blockers = {}
    found = blockers.get(pool)
    if found is None:
        # Once per cycle and pool: sessions only leave the set (stopped), never join it.
        now = cycle.now
        found = blockers[pool] = {}
        for allocation in cycle.pool_allocations(pool):
            if allocation.funded and (
                allocation.protected_until > now or not allocation.request.resumable
            ):
                request = allocation.request
                ids = found.get(request.team)
                if ids is None:
                    found[request.team] = [request.id]
                else:
                    ids.append(request.id)
    stopped = cycle.stopped
    return all(i in stopped for i in found.get(team, ()))


def over_share(cycle: Cycle, state: Pass) -> frozenset[str]:
    """S1: teams that hold more of the pool than their share now, funded or unallocated
    (worked out once per pool pass, on first use: only debug entries ask)."""
    found = cycle.over.get(state.name)
    if found is None:
        held: dict[str, float] = {}
        stopped = cycle.stopped
        name = state.name
        for allocation in cycle.pool_allocations(name):
            request = allocation.request  # its fields, not the properties: every session
            if request.id not in stopped:
                held[request.team] = held.get(request.team, 0.0) + allocation.charge_rate
        window = cycle.view.window
        found = frozenset(
            t
            for t, rate in held.items()
            if window > 0 and rate > state.ranking.leaf(t)[1] / window + 1e-9
        )
        cycle.over[state.name] = found
    return found


def stop_for(
    cycle: Cycle,
    entry: Queued,
    below: frozenset[str],
    holder: bool,
    state: Pass,
    after: Key | None,
    limit: Lane | None = None,
) -> Found | None:
    """R4: stop the cheapest victims that make room for the entry: unallocated sessions
    past their grace and funded ones of the teams in ``below`` past their protected
    window (within the ``limit``, for a debug entry); their grants go to the entry,
    or None (the search remembered as failed, and with ``after``, the key it was
    made at, the shape in ``state.no_victims``, unless the entry holds nodes: its
    held nodes are its alone). A lane search is remembered under its lane's teams as
    well: its answer depends on them."""
    request = entry.request
    spare = cycle.spared.get(request.id) if cycle.spared else None
    # A holder's search also counts its held nodes, and one that spares its stopper
    # (S10) leaves a victim out, so each is remembered apart.
    search: SearchKey = (
        entry.shape_id,
        below,
        None if limit is None else limit.normal,
        "" if limit is None else "resumable" if limit.resumable else "lane",
        request.id if holder or spare is not None else "",
    )
    capacity = cycle.capacity
    victims = cycle.victims()
    known_failures = cycle.known_failures
    if known_failures.fails(
        request, search, lambda nf: offers(capacity, victims, request, below, nf, limit, spare)
    ):
        targets, for_want = None, True
    else:
        targets, for_want = search_targets(
            request, capacity, victims, below, cycle.now, limit, spare
        )
    if targets is None:
        if for_want:
            known_failures.failed(search)
        if after is not None and not entry.debug and not holder and spare is None:
            state.no_victims.add(entry.shape, after, entry.shape_id)
        return None
    chosen: dict[str, Allocation] = {}
    for target in targets:
        for victim in target.victims:
            chosen[victim.id] = victim
    rates = cycle.rates
    reason = "funded" if cycle.funded.get(request.id) else "debug"
    for victim in chosen.values():
        if victim.funded:
            rates[(victim.team, victim.pool)] -= victim.charge_rate
            cycle.funded_victims.add(victim.id)
        capacity.give(victim.grants)
        cycle.stopped.add(victim.id)
        cost = lost_work(victim, cycle.now, victims.gang_wait)
        code = victim_code(victims, victim, request.team)
        cycle.preemptions.append(Preemption(victim.id, reason, request.id, code, cost))
        victims.remove(victim)
    grants = tuple(NodeGrant(t.node, t.slices, request.cpus, request.memory_gib) for t in targets)
    capacity.take(grants)
    state.room_grew()
    return grants, tuple(chosen)


def victim_code(victims: Victims, victim: Allocation, team: str) -> str:
    """Why the victim could be stopped for a request of ``team`` (a verdict.VICTIM_* code);
    among those that could, it was chosen for its cost."""
    if not victim.funded:
        return VICTIM_BORROWED
    if victims.tier(victim) == 0:
        return VICTIM_IDLE
    return VICTIM_OWN if victim.team == team else VICTIM_BELOW
