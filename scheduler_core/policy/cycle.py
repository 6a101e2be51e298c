"""Phases 1 and 5 of a cycle: its start (what stops before anything is placed) and its
decisions (admissions, preemptions, holds and a verdict per request looked at).

`Cycle` holds what one cycle knows so far: its what-if `Capacity`, the funded
charge rates, what it stopped and admitted; `Pass` what one pool's pass knows. The
units that decide (funding.py, placement.py, victims.py, holds.py) read and change
them; nothing here outlives the cycle, and the view is never changed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

from scheduler_core.capacity import Capacity
from scheduler_core.kept import KnownFailures, Queued
from scheduler_core.model import Allocation, NodeGrant
from scheduler_core.policy.day import DayUsage
from scheduler_core.policy.failures import Failures
from scheduler_core.preemption import (
    GANG_CHECKPOINT_SLACK,
    PRICE_CAP,
    Victims,
    at_checkpoint,
    checkpoint_slack,
)
from scheduler_core.ranking import Key, PoolRanking
from scheduler_core.rules import funded_rates, health_preemptions, kept_reservations
from scheduler_core.verdict import Verdict, Verdicts, Victim
from scheduler_core.view import Admission, ClusterView, Decisions, Preemption

__all__ = ["Cycle", "Pass", "Result"]


class Result:
    """An entry's answer: funded, its funding ground (`verdict`), the protection it gets if
    funded (a day slice may cut it), and its placement outcome (`verdict`). An object,
    not a tuple: compiled, a tuple read from a memo was boxed again for every entry
    that took it (two tuples and a float per entry of a steady cycle)."""

    __slots__ = ("funded", "ground", "protect", "outcome")

    def __init__(self, funded: bool, ground: str, protect: float, outcome: str) -> None:
        self.funded = funded
        self.ground = ground
        self.protect = protect
        self.outcome = outcome


class Pass:
    """What one pool's pass over its queue knows so far."""

    __slots__ = (
        "name",
        "ranking",
        "held",
        "no_fit",
        "no_victims",
        "no_burst",
        "no_backfill",
        "team_keys",
        "team_keys_at",
        "waiting",
        "draining",
        "deferring",
        "deferred",
        "epoch",
    )

    def __init__(self, name: str, ranking: PoolRanking, held: set[str]) -> None:
        self.name = name
        self.ranking = ranking
        self.held = held
        """Requests holding nodes of the pool."""
        self.no_fit = Failures()
        """Shapes with no room on free slices."""
        self.no_victims = Failures()
        """Shapes, with the team key they had, for which no victims made room."""
        self.no_burst = Failures()
        """Shapes for which no unallocated sessions made room (what burst work may stop)."""
        self.no_backfill = Failures()
        """Shapes with no room on free slices, held nodes' included."""
        self.team_keys: list[tuple[str, Key]] = []
        """Every team's key, as of ``team_keys_at`` charges of the ranking."""
        self.team_keys_at = -1
        self.waiting: dict[str, float] = {}
        """Per team, the charge rate of its requests waiting in the pool (`day.lent`)."""
        self.draining: set[str] = set()
        """Teams whose job waits to slice the team (S6, `funding.own_slice`)."""
        self.deferring = True
        """R11: while true (the teams' turns), work dear to reclaim does not borrow."""
        self.deferred: list[tuple[int, Queued, int, bool]] = []
        """R11: entries that would have borrowed, dear to reclaim, with the index of their
        note in ``Cycle.notes``, the ``epoch`` their funding was found at (-1: not to be
        reused) and whether their team was ``draining`` then: judged again once every
        team's turn is over."""
        self.epoch = 0
        """Counts the pass's changes (an admission, a hold made or ended): while it and
        a team's ``draining`` stand still, the funding of the team's entries stands too
        (`order.place_deferred` reuses it)."""

    def room_grew(self) -> None:
        """Room was made (victims stopped, a hold ended): shapes may fit again."""
        self.no_fit.clear()
        self.no_victims.clear()
        self.no_burst.clear()


class Cycle:
    """One cycle of the budget policy: its what-if capacity, its charge rates, and what
    it has decided so far."""

    def __init__(self, view: ClusterView, now: float, memo: bool = True) -> None:
        """Start: sessions on unhealthy nodes are stopped and their slices free (R6);
        oversize jobs whose day is spent are time-sliced (S5); last cycle's holds
        stay while their requests wait and their nodes are ready (R7); charge rates
        are those of the funded sessions left running. ``memo``: whether an entry may
        take the answer of an earlier one of its kind (`order.judge_all`)."""
        self.view = view
        self.now = now
        self.memo = memo
        """Off (``budget_policy(..., memo=False)`` or ``BUDGETHUB_NO_MEMO=1``): every
        entry is judged afresh."""
        self.settings = view.settings
        index = view.index
        if index is not None and index.at != now:
            index = None
        self.index = index
        capacity = self.capacity = Capacity(
            view.nodes,
            view.allocations,
            view.free,
            index.layout if index else None,
            index.whole if index else None,
        )
        settings = self.settings
        self.slack = checkpoint_slack(settings.cycle_tick)
        """R10: how long after a checkpoint a run that checkpoints may be stopped, for a
        request on one node and at a day slice's end; `gang_slack` for a request over
        several nodes."""
        self.gang_slack = max(self.slack, GANG_CHECKPOINT_SLACK)
        self.preemptions: list[Preemption] = health_preemptions(view, now)
        self.stopped = {p.allocation_id for p in self.preemptions}
        self.day = DayUsage(view, now)
        self.preemptions.extend(self.day.slices_over(self.stopped, self.slack))
        self.stopped = {p.allocation_id for p in self.preemptions}
        self._by_id: dict[str, Allocation] = {}
        if self.stopped:
            self._by_id = {a.id: a for a in view.allocations}
            for allocation_id in self.stopped:
                capacity.give(self._by_id[allocation_id].grants)
        self.rates = funded_rates(view, self.stopped)
        self.funded_victims: set[str] = set()
        self.spared: Mapping[str, str] = view.stopped_by
        """S10: per waiting request, the running session that stopped it (not stopped in
        return; the scheduler hands over only the pairs whose stopper runs)."""
        self._victims: Victims | None = None
        kept_reservations(view, capacity, index.waiting if index is not None else None)
        self.known_failures = KnownFailures(index, capacity.free, capacity.grown)
        for held_nodes in view.reservations.values():
            self.known_failures.grown.extend(n for n in held_nodes if n not in capacity.reserved)
        release_after = self.settings.idle_release
        if release_after > 0:
            # Victims that idleness made releasable are new since any remembered failure.
            self.known_failures.grown.extend(
                node
                for allocation, since in view.idle
                if since + release_after <= now
                for node in allocation.node_names
            )
        self.known_failures.grown.extend(cheap_again(view.allocations, now, self.gang_slack))
        self.held: dict[str, set[str]] = defaultdict(set)
        """Per pool, the requests holding nodes there."""
        for node, request_id in capacity.reserved.items():
            self.held[capacity.free[node].node.pool].add(request_id)
        self.admissions: list[Admission] = []
        self.released: list[str] = []
        self.order: list[str] = []
        self.funded: dict[str, bool] = {}
        self.notes: list[tuple[Queued, Result]] = []
        """Per entry looked at, in ``order``: the entry and its `Result` (a verdict's
        makings)."""
        self.over: dict[str, frozenset[str]] = {}
        """Per pool, the teams over their share now (`victims.over_share`)."""
        self.blockers: dict[str, dict[str, list[str]]] | None = None
        """Per pool and team, its funded sessions that keep it from slicing itself
        (`victims.own_swappable`), found on first use."""
        self.node_clears: dict[str, float] | None = None
        """Per node, when its last protected window ends (`holds.clears`)."""
        self._by_pool: dict[str, list[Allocation]] | None = None

    def pool_allocations(self, pool: str) -> Sequence[Allocation]:
        """The view's allocations in the pool, in the view's order: the index's, or
        grouped once per cycle, on first use. The rules that read every session of a
        pool (S1's teams over their share, S6's blockers) then read only that pool's."""
        index = self.index
        if index is not None:
            return index.by_pool.get(pool, ())
        groups = self._by_pool
        if groups is None:
            groups = self._by_pool = {}
            for allocation in self.view.allocations:
                pool_of = allocation.request.pool
                found = groups.get(pool_of)
                if found is None:
                    groups[pool_of] = [allocation]
                else:
                    found.append(allocation)
        return groups.get(pool, [])

    def victims(self) -> Victims:
        """The sessions this cycle may still preempt: past their protected window (or
        grace), not stopped. Built on first use: most cycles never search for victims."""
        found = self._victims
        if found is None:
            index, now = self.index, self.now
            idle = [
                (allocation, since)
                for allocation, since in self.view.idle
                if allocation.protected_until <= now
            ]
            if index is not None:
                found = Victims.of(index.exposed, now, index.reach, self.settings.max_min_runtime)
                found.note_idle(idle, self.settings.idle_release)
                for allocation_id in self.stopped:
                    allocation = self._by_id[allocation_id]
                    if allocation.protected_until <= now:
                        found.remove(allocation)
            else:
                stopped = self.stopped
                found = Victims(
                    (
                        a
                        for a in self.view.allocations
                        if a.id not in stopped and a.protected_until <= now
                    ),
                    now,
                    self.settings.max_min_runtime,
                )
                found.note_idle(
                    [(a, since) for a, since in idle if a.id not in stopped],
                    self.settings.idle_release,
                )
            # R10: a run that checkpoints is stopped just after a checkpoint.
            found.wait_for_checkpoints(self.slack, self.gang_slack)
            self._victims = found
        return found

    def protection(
        self, entry: Queued, funded: bool, protect: float, preempts: tuple[str, ...] = ()
    ) -> float:
        """Seconds the entry is protected if admitted now (after ``preempts`` stop): its
        minimum runtime (``protect``, cut to a day slice where S5 cuts it) if funded,
        else the unallocated grace; at least its restart price (R9); longer for a
        debug session stopped before (S2)."""
        settings = self.settings
        protected = protect if funded else settings.unallocated_grace
        # R9: kept at least as long as stopping it would cost (a snapshot, a restart):
        # else a borrower is stopped before it has paid back its own start.
        request = entry.request
        protected = max(protected, request.restart_seconds + request.take_seconds)
        if not funded and entry.debug and not self.funded_victims.isdisjoint(preempts):
            # An unfunded debug session that stopped funded work keeps its place for its
            # protected window: else the next funded request took it back, and the lane
            # stopped someone else's work for it again, cycle after cycle.
            protected = protect
        if entry.debug:
            stops = self.view.stops.get(entry.request.id, 0)
            if stops:
                # Stopped before it ran its course: twice as long each time (S2).
                doubled = protect * 2.0 ** (stops if funded else stops - 1)
                protected = max(protected, min(doubled, settings.max_min_runtime))
        return protected

    def admit(
        self,
        entry: Queued,
        grants: tuple[NodeGrant, ...],
        funded: bool,
        preempts: tuple[str, ...],
        state: Pass,
        protect: float,
        units: float,
    ) -> bool:
        """Admit the entry on ``grants`` (after ``preempts`` stop), protected as
        `protection` says; a funded one is charged to its team. True if it was (the
        team's rank moved)."""
        request = entry.request
        state.epoch += 1
        protected = self.protection(entry, funded, protect, preempts)
        self.admissions.append(
            Admission(request, grants, funded, self.now + protected, entry.rate, preempts)
        )
        if not funded:
            return False
        self.rates[(request.team, state.name)] += entry.rate
        state.ranking.charge(request.team, units)
        return True

    def verdict(self, position: int, admitted: Mapping[str, Admission]) -> Verdict:
        """The verdict of the entry looked at in ``position`` (built when read)."""
        entry, result = self.notes[position]
        ground, protect, outcome = result.ground, result.protect, result.outcome
        request_id = entry.request.id
        funded = self.funded[request_id]
        admission = admitted.get(request_id)
        if admission is None:
            protected = self.protection(entry, funded, protect)
            return Verdict(request_id, position, funded, ground, protected, outcome)
        return Verdict(
            request_id,
            position,
            funded,
            ground,
            admission.protected_until - self.now,
            outcome,
            admission.grants,
            admission.preempts,
            tuple(
                Victim(p.allocation_id, p.code, p.cost)
                for p in (self.preemptions if admission.preempts else ())
                if p.for_request == request_id and p.code
            ),
        )

    def verdicts(self) -> Verdicts:
        """Every entry's verdict, in ``order``, each built on first read."""
        return Verdicts(self.order, _Builder(self))

    def decisions(self) -> Decisions:
        """Decisions: preemptions and admissions in the order they must be carried out,
        the holds as they stand at the end, and every entry looked at, in order, with
        its verdict."""
        reservations: dict[str, list[str]] = defaultdict(list)
        for node, request_id in sorted(self.capacity.reserved.items()):
            reservations[request_id].append(node)
        return Decisions(
            admissions=tuple(self.admissions),
            preemptions=tuple(self.preemptions),
            reservations=MappingProxyType({k: tuple(v) for k, v in reservations.items()}),
            order=tuple(self.order),
            funded=MappingProxyType(self.funded),
            released=tuple(self.released),
            searches=MappingProxyType(self.known_failures.found),
            verdicts=self.verdicts(),
        )


_CHECKPOINTING: Final[list[tuple[tuple[Allocation, ...], list[Allocation]]]] = []
"""The last running tuple seen and its sessions that checkpoint (`cheap_again`): the
scheduler hands over the same tuple until a session starts or ends."""


def cheap_again(allocations: tuple[Allocation, ...], now: float, slack: float) -> list[str]:
    """R8, R10 and the failures kept between cycles (`KnownFailures`): a run that
    checkpoints may be stopped again just after each checkpoint (funded, only while its
    price is within R8's cap), with no node growing, so its nodes count as new since any
    remembered failure while it may (``slack``: the longest, a gang's)."""
    if _CHECKPOINTING and _CHECKPOINTING[0][0] is allocations:
        found = _CHECKPOINTING[0][1]
    else:
        found = [a for a in allocations if a.request.checkpoint_every > 0]
        _CHECKPOINTING[:] = [(allocations, found)]
    out: list[str] = []
    for allocation in found:
        request, elapsed = allocation.request, now - allocation.start
        if at_checkpoint(request, elapsed, slack) and (
            not allocation.funded or request.lost_seconds(elapsed) <= PRICE_CAP
        ):
            out.extend(allocation.node_names)
    return out


class _Builder:
    """Builds the verdict at a position of a cycle's order (`Cycle.verdicts`). An object,
    not a closure: a compiled closure refers to itself, so each cycle's state would
    wait for the garbage collector instead of going when the decisions go."""

    __slots__ = ("admitted", "cycle")

    def __init__(self, cycle: Cycle) -> None:
        self.cycle = cycle
        self.admitted: dict[str, Admission] = {}

    def __call__(self, position: int) -> Verdict:
        cycle, admitted = self.cycle, self.admitted
        if not admitted and cycle.admissions:
            admitted.update((a.request.id, a) for a in cycle.admissions)
        return cycle.verdict(position, admitted)
