"""Phases 3 and 4, team order and fit / evict / hold: one pool's pass over its queue.

Team order (R1, S1 of docs/architecture.md): every team's debug entries first (the
fast lane across teams), then teams by rank, the lowest first, ranked again after
each funded admission; a team's own entries in queue order. Each entry is judged
for funding (funding.py), then fitted on free slices (R3), else backfilled on held
nodes (S3), else given victims (R4, or the fast lane S1), else a hold (R7); one
that found room is admitted. An entry that would borrow (run unallocated) but is dear
to reclaim waits until every team's turns are over, then takes what they left (R11,
`place_deferred`).

Why R11 is a second phase and not a place in the order: teams take turns by rank, and
a dear entry of the team ranked first must still not take room that a cheaper
borrower of the team ranked last would use; after the turns, nothing cheaper wants it.

Why a team keeps its turn without a trip through the heap, and why an entry may get
the answer of the one before it: in a steady cycle nearly every one of 2,000
entries fails the same cheap checks. While nothing changed since (no admission,
hold, preemption or new S6 state), an entry of the same kind (`Queued.kind`: shape,
protection, rate, class, resumability, R11's `dear`) and age class in the same team's turn gets
exactly the same answer, so it is taken from `Turn.known` (and every such entry
still gets its own verdict).

That memo is exact only while every rule reads no more of an entry than its kind
and age class: a rule that reads another field of the request must add it to the
kind (docs/policy.md, "Adding a rule"). With the memo off (`Cycle.memo`: the
``memo`` argument of `budget_policy`, or ``BUDGETHUB_NO_MEMO=1``) every entry is
judged afresh; tests/unit/test_memo.py decides random cycles both ways.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Final

from scheduler_core.kept import Queued
from scheduler_core.model import NodeGrant
from scheduler_core.policy.cycle import Cycle, Pass, Result
from scheduler_core.policy.funding import Funding, Turn, fund, window_funding
from scheduler_core.policy.holds import end_hold, hold
from scheduler_core.policy.placement import backfill, fit
from scheduler_core.policy.victims import Found, evict, lane
from scheduler_core.ranking import PoolRanking
from scheduler_core.verdict import (
    BACKFILLED,
    FUNDED_GROUNDS,
    HOLDING,
    NO_ROOM,
    NO_VICTIMS,
    PLACED,
    PREEMPTS,
)

__all__ = [
    "DEFERRED",
    "find_room",
    "judge",
    "place_deferred",
    "pool_pass",
    "settle",
    "victims_for",
]

DEFERRED: Final = "deferred"
"""R11: an entry's placement outcome while it waits for the teams' turns to end
(`place_deferred` judges it again, so no verdict carries it)."""


def pool_pass(cycle: Cycle, pool: str, team_queues: Mapping[str, tuple[Queued, ...]]) -> None:
    """Team order: every entry of the pool's queues is looked at once, team by team (R1,
    S1), and judged (`judge_all`); ``cycle.order`` and ``cycle.notes`` record each."""
    index = cycle.index
    ranking = PoolRanking(
        cycle.view, pool, cycle.now, index.protected.get(pool, ()) if index else None
    )
    state = Pass(pool, ranking, cycle.held[pool])
    heads = dict.fromkeys(team_queues, 0)
    # Debug entries of every team come before any team's other work (the fast lane
    # across teams): (not debug, key, submit, team).
    heap = [
        (not q[0].debug, ranking.key(team), q[0].request.submit, team)
        for team, q in team_queues.items()
    ]
    heapq.heapify(heap)
    while heap:
        later, key, _, team = heapq.heappop(heap)
        current = ranking.key(team)
        if current > key:
            # Funded admissions elsewhere in this team's subtree moved it back.
            head = team_queues[team][heads[team]]
            heapq.heappush(heap, (later, current, head.request.submit, team))
            continue
        heads[team] = judge_all(cycle, state, team, team_queues, heads[team], heap, current)
    if state.deferred:
        place_deferred(cycle, state, team_queues)


def place_deferred(
    cycle: Cycle, state: Pass, team_queues: Mapping[str, tuple[Queued, ...]]
) -> None:
    """R11: once every team has had its turns, the entries that would have borrowed but
    are dear to reclaim (`Queued.dear`) are judged again, in the order they were first
    judged, on what the turns left; each one's note replaces the one that deferred it.
    While nothing changes, an entry of a team, kind and age class already judged here
    gets the same answer, as in a team's turn (`judge_all`): a new `Turn` for the same
    team on the same state gives the same answers."""
    state.deferring = False
    notes = cycle.notes
    memo = cycle.memo
    now = cycle.now
    starving_after = cycle.settings.starvation_bound
    slicing_after = cycle.settings.own_slice_after
    known: dict[tuple[str, int], Result] = {}
    turn: Turn | None = None
    draining = state.draining
    for index, entry, epoch, was_draining in state.deferred:
        request = entry.request
        team = request.team
        age = now - request.submit
        key = (team, (entry.kind << 2) | ((age >= starving_after) << 1) | (age >= slicing_after))
        found = known.get(key) if memo else None
        if found is None:
            if turn is None or turn.team != team:
                turn = Turn(cycle, state, team)
            if epoch == state.epoch and (was_draining or team not in draining):
                # Nothing changed since its turn deferred it (no admission or hold, its
                # team no more draining, S6): `fund` would answer as then, so its
                # funding stands (unfunded and never debug: its units, beside and swap
                # are not read) and only its room is looked for.
                first = notes[index][1]
                funding = (first.ground, first.protect, entry.units, False, False)
                result, changed, charged = settle(cycle, state, turn, entry, funding)
            else:
                result, changed, charged = judge(cycle, state, turn, entry, team_queues)
            if charged:
                turn = None
            if changed or charged:
                known.clear()
            elif memo:
                known[key] = result
        else:
            result = found
            cycle.funded[request.id] = found.funded
        notes[index] = (entry, result)


def judge_all(
    cycle: Cycle,
    state: Pass,
    team: str,
    team_queues: Mapping[str, tuple[Queued, ...]],
    at: int,
    heap: list[tuple[bool, tuple[float, ...], float, str]],
    current: tuple[float, ...],
) -> int:
    """One team's turn from entry ``at`` of its queue: each entry judged, until the team
    is charged or its next entry no longer sorts first (it goes back on the heap);
    where the turn ended."""
    queue = team_queues[team]
    end = len(queue)
    turn = Turn(cycle, state, team)
    known = turn.known
    memo = cycle.memo
    held = state.held
    spared = cycle.spared
    now = cycle.now
    starving_after = cycle.settings.starvation_bound
    slicing_after = cycle.settings.own_slice_after
    # Plain method calls, not bound-method locals: compiled (native.py), these are direct.
    order, notes, funded = cycle.order, cycle.notes, cycle.funded
    top = heap[0] if heap else None
    # The heap's head is fixed for the turn: (later, key) of the team that sorts next.
    first_later = top[0] if top is not None else True
    ahead = top is not None and current < top[1]  # its key sorts before the head's
    while True:
        entry = queue[at]
        at += 1
        request = entry.request
        request_id = request.id
        order.append(request_id)
        charged = False
        epoch = -1  # the epoch its answer was found at, in the memo's path only
        if held and request_id in held:
            result, _, charged = judge(cycle, state, turn, entry, team_queues)
            known.clear()
        elif spared and request_id in spared:
            # It may not stop its stopper (S10): its answer is its own, not remembered
            # for others of its kind (which it may not give either).
            result, changed, charged = judge(cycle, state, turn, entry, team_queues)
            if changed:
                known.clear()
        elif not memo:
            result, _, charged = judge(cycle, state, turn, entry, team_queues)
        else:
            epoch = state.epoch
            age = now - request.submit
            kind = (entry.kind << 2) | ((age >= starving_after) << 1) | (age >= slicing_after)
            found = known.get(kind)
            if found is None:
                result, changed, charged = judge(cycle, state, turn, entry, team_queues)
                if changed:
                    known.clear()
                else:
                    known[kind] = result
            else:
                result = found
                funded[request_id] = found.funded
        notes.append((entry, result))
        if result.outcome == DEFERRED:
            epoch = epoch if epoch == state.epoch else -1  # nothing changed meanwhile
            state.deferred.append((len(notes) - 1, entry, epoch, team in state.draining))
        # The team keeps its turn while its next entry still sorts first.
        if at >= end:
            return at
        following = queue[at]
        next_later = not following.debug
        if not charged and (
            top is None or next_later < first_later or (next_later == first_later and ahead)
        ):
            continue
        pushed = (next_later, current, following.request.submit, team)
        if charged or (top is not None and not pushed < top):
            heapq.heappush(heap, pushed)
            return at


def judge(
    cycle: Cycle,
    state: Pass,
    turn: Turn,
    entry: Queued,
    team_queues: Mapping[str, tuple[Queued, ...]],
) -> tuple[Result, bool, bool]:
    """One entry: funding (`fund`), then room and admission or a hold (`settle`).
    Returns its result, whether anything changed (capacity, holds, stops), and
    whether its team was charged (which ends the turn)."""
    return settle(cycle, state, turn, entry, fund(cycle, state, turn, entry, team_queues))


def settle(
    cycle: Cycle, state: Pass, turn: Turn, entry: Queued, funding: Funding
) -> tuple[Result, bool, bool]:
    """An entry funded as ``funding`` says: room (`find_room`), then admission or a
    hold (R7); as `judge`."""
    request = entry.request
    request_id = request.id
    ground, protect, units, beside, swap = funding
    funded = cycle.funded[request_id] = ground in FUNDED_GROUNDS
    held = state.held
    holder = bool(held) and request_id in held
    if not funded and entry.dear and state.deferring:
        # R11: dear to reclaim, it borrows only what the teams' turns leave
        # (`place_deferred`); a hold it had goes back to everyone.
        if holder:
            end_hold(cycle, request_id, state)
        return Result(funded, ground, protect, DEFERRED), holder, False
    changed = holder
    if holder and not funded:
        # It would run unallocated: its nodes go back to everyone.
        end_hold(cycle, request_id, state)
        holder = False
    grants, preempts, outcome, ground = find_room(
        cycle, state, turn, entry, ground, protect, units, holder, swap
    )
    funded = ground in FUNDED_GROUNDS
    charged = False
    if grants is not None:
        if holder:
            end_hold(cycle, request_id, state)
        charged = cycle.admit(entry, grants, funded, preempts, state, protect, units)
        changed = True
    elif (
        funded
        and cycle.now - request.submit >= cycle.settings.starvation_bound
        and not holder
        and not beside
        and len(held) < cycle.settings.max_reservations_per_pool
    ):
        if hold(cycle, entry, held):
            outcome = HOLDING
            changed = True
            state.epoch += 1
    elif holder:
        outcome = HOLDING
    return Result(funded, ground, protect, outcome), changed, charged


def find_room(
    cycle: Cycle,
    state: Pass,
    turn: Turn,
    entry: Queued,
    ground: str,
    protect: float,
    units: float,
    holder: bool,
    swap: bool,
) -> tuple[tuple[NodeGrant, ...] | None, tuple[str, ...], str, str]:
    """Fit (R3), else backfill (S3), else victims (R4) for a funded entry or the fast
    lane (S1) for a debug one, each only where it may find something. Returns the
    grants (None: no room), the sessions stopped, the placement outcome and the
    funding ground (the lane's victims may fund a debug entry)."""
    request = entry.request
    funded = ground in FUNDED_GROUNDS
    no_fit, no_backfill = state.no_fit, state.no_backfill
    grants: tuple[NodeGrant, ...] | None = None
    found: Found | None = None
    outcome = NO_ROOM
    if holder or (
        entry.shape_id not in no_fit.exact and not no_fit.known(entry.shape, (), entry.shape_id)
    ):
        grants = fit(cycle, entry, holder, no_fit)
        if grants is not None:
            return grants, (), PLACED, ground
    if (
        cycle.capacity.reserved
        and ((entry.debug and not holder) or (not funded and request.resumable))
        and not no_backfill.known(entry.shape, (), entry.shape_id)
    ):
        # Held nodes' free slices, before any victims: a debug session takes them
        # rather than stop someone's work, and resumable work that would run
        # unallocated may stop no one anyway.
        grants = backfill(cycle, entry, no_backfill)
        if grants is not None:
            return grants, (), BACKFILLED, ground
    if funded:
        outcome = NO_VICTIMS
        found = victims_for(cycle, state, turn, entry, protect, units, holder, swap)
    elif entry.debug:
        outcome = NO_VICTIMS
        found = lane(cycle, entry, holder, state)
        if found is not None:
            # Its own team's work stopped may fund it now.
            running = cycle.rates[turn.rate_key]
            ground = window_funding(cycle, turn, entry, running, units)
            cycle.funded[request.id] = ground in FUNDED_GROUNDS
    if found is None:
        return None, (), outcome, ground
    grants, preempts = found
    return grants, preempts, PREEMPTS if preempts else PLACED, ground


def victims_for(
    cycle: Cycle,
    state: Pass,
    turn: Turn,
    entry: Queued,
    protect: float,
    units: float,
    holder: bool,
    swap: bool,
) -> Found | None:
    """R4 for a funded entry (`victims.evict`), unless the pass already knows it fails:
    at the team key it would have after its charge, or, holding nodes, at the key its
    team has now (S7); burst work (S4) only against unallocated sessions."""
    team = turn.team
    ranking = state.ranking
    after = ranking.key(team) if holder else turn.afters.get(units)
    if after is None:
        after = turn.afters[units] = ranking.key(team, units)
    # A team with relatives compares with them at its own level: another team's
    # failure at a key says nothing of its victims, nor its of theirs.
    related = ranking.related(team)
    no_victims = state.no_victims
    failed_at = None if related else no_victims.exact.get(entry.shape_id)
    running = cycle.rates[turn.rate_key]
    burst = running > 1e-9 and running + entry.rate > turn.share_limit
    # A holder's search counts its own held nodes: no other entry's failure speaks
    # for it, nor its failure for them (see `victims.stop_for`). Nor for a job that
    # slices its own team (S6, ``swap``): it may stop its own team's sessions, which
    # the failures recorded did not count.
    if not (
        entry.debug
        or holder
        or swap
        or (
            (failed_at is None or after < failed_at)
            and (related or not no_victims.known(entry.shape, after, entry.shape_id))
            and not (burst and state.no_burst.known(entry.shape, (), entry.shape_id))
        )
    ):
        return None
    # A day slice (its protection cut to what the day pays) shorter than
    # default_min_runtime throws no one's work away (`evict`).
    short = protect < entry.min_runtime and protect < cycle.settings.default_min_runtime - 1e-9
    return evict(cycle, entry, after, holder, state, burst and not swap, swap, short)
