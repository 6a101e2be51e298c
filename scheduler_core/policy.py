"""The budget policy: ``decide(view, now) -> Decisions``, pure.

It carries out the scheduling contract of docs/architecture.md, whose rule IDs the
docstrings here cite: team order (R1), funding (R2, with `rules.funds`), placement
(R3, in capacity.py), preemption (R4, with preemption.py), node health (R6) and
holds (R7), and the rules at saturation: the debug fast lane (S1) and its doubled
protection (S2), backfill of held nodes (S3), burst work that yields (S4), day
slices (S5, `_DayUsage`), a team slicing itself (S6), a holder ranked as its team
stands (S7), a gang's place (S8, `preemption.lost_work`), and nothing stopped in
the instant it started (S9). Why each rule is there, with the measurements, is in
docs/architecture.md ("Evidence"). The rules the baselines share are in rules.py,
and policies are found by name in registry.py.

The cycle runs in phases, as Kueue's ``schedule()`` does, each a function here:

1. start (`_Cycle`): health preemptions (R6), time-slice stops (S5), kept holds
   (R7), funded charge rates;
2. heads of the queue (`queue_heads`): per pool and team, the queue in order;
3. team order (`_Cycle.pool`): every team's debug entries first (S1), then teams
   by rank (R1), re-ranked after each funded admission; each entry is judged for
   funding (R2, S5, S6), then
4. fit (`_Cycle.fit`, R3), else backfill (`_Cycle.backfill`, S3), else victims
   (`_Cycle.evict`, funded entries, R4; `_Cycle.lane` for unfunded debug ones, S1),
   else hold (`_Cycle.hold`, funded entries past the starvation bound, R7); an
   entry that found room is admitted (`_Cycle.admit`);
5. decisions (`_Cycle.decisions`).

Speed: a team at the head of the queue keeps it, without a trip through the
heap, while its next request still sorts first: the order is the heap's, only
cheaper. The loop over entries stays in `_Cycle.pool` with the checks that skip
hopeless work (shapes that found no room, no victims) inline, so a phase is
called only when it may find something: in a steady cycle nearly every entry
stops at those checks, and a call per entry would cost a tenth of the cycle.
When the view carries a `CycleIndex` (kept.py) the sorted queues, protected
sessions and victims come from it instead of being rebuilt from every running
session, and victim searches that failed in earlier cycles are only re-checked
on the nodes that grew since (`KnownFailures`): a search's answer is monotone in
room and victims, so that check is exact, not a heuristic. Debug entries and holders
skip the shape records, so that check is all that stops them searching again; a
holder's search is remembered under its own id, since its held nodes are its alone.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping
from types import MappingProxyType

from scheduler_core.capacity import Capacity, could_hold
from scheduler_core.kept import CycleIndex, KnownFailures, Queued, SearchKey, Shape, queue_key
from scheduler_core.ledger import WindowUsage
from scheduler_core.model import Allocation, NodeGrant, PoolKind, Request, RequestClass
from scheduler_core.preemption import Lane, Victims, offers, search_targets
from scheduler_core.ranking import Key, PoolRanking
from scheduler_core.registry import register
from scheduler_core.rules import (
    funded_rates,
    funding,
    health_preemptions,
    kept_reservations,
    oversize_above,
)
from scheduler_core.settings import Settings
from scheduler_core.verdict import (
    BACKFILLED,
    DAY_SLICE,
    DAY_SPENT,
    FUNDED_GROUNDS,
    HOLDING,
    NO_ROOM,
    NO_SHARE,
    NO_VICTIMS,
    OVER_SHARE_BESIDE,
    PLACED,
    PREEMPTS,
    TEAM_SLICING,
    Verdict,
    Verdicts,
)
from scheduler_core.view import Admission, ClusterView, Decisions, Preemption

_DAY = 86400.0

__all__ = ["Failures", "budget_policy", "choose_reservation", "queue_heads", "queue_order"]


def _slice_pays(sliced: float, protect: float, settings: Settings) -> bool:
    """Does a day slice of ``sliced`` seconds fund a request protected for ``protect``:
    at least a cycle tick, or its protected window if shorter than
    ``debug_min_runtime`` (the shortest run the contract protects). A slice shorter
    than ``default_min_runtime`` stops only sessions that resume (S5 of
    docs/architecture.md)."""
    return sliced >= min(max(protect, settings.cycle_tick), settings.debug_min_runtime) - 1e-9


def queue_order(requests: list[Request]) -> list[Request]:
    """Order inside one team: declared priority (high first), then submit time."""
    return sorted(requests, key=queue_key)


class Failures:
    """Shapes that found no room this cycle, with the after-swap key they had.

    Capacity only shrinks while a cycle places work, so a shape that did not fit
    keeps not fitting, and so does any larger one; a preemption frees slices, and a
    hold that ends gives its nodes back to everyone, and both clear the record. For
    victim searches, a team whose key is no lower may preempt a subset of the
    sessions, so it fails as well. Answers are also
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


def choose_reservation(
    capacity: Capacity, request: Request, clears: Mapping[str, float]
) -> tuple[str, ...] | None:
    """Nodes to hold for a starving request: those closest to fitting it.

    Closest means the nodes that clear soonest (``clears``: per node, when the last
    protected window of what runs there ends; a node not listed has none), then most
    free GPUs now, then most free CPUs: what still runs there ends or becomes
    preemptible in time, and nothing new lands meanwhile. For a gang of several
    nodes, the most free GPUs now often means a node kept busy for hours by a
    notebook's protected window.
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
    options.sort(
        key=lambda nf: (clears.get(nf.node.name, 0.0), -nf.free_whole, -nf.cpus, nf.node.name)
    )
    return tuple(nf.node.name for nf in options[: request.nodes])


def _drop_hold(capacity: Capacity, request_id: str, grown: list[str]) -> None:
    """Give back the nodes held for ``request_id`` (noting them as grown)."""
    for node in [n for n, r in capacity.reserved.items() if r == request_id]:
        del capacity.reserved[node]
        grown.append(node)


def queue_heads(
    view: ClusterView, index: CycleIndex | None = None
) -> Mapping[str, Mapping[str, tuple[Queued, ...]]]:
    """Heads of the queue: per pool and team, the view's pending requests in queue
    order (`queue_key`), with the figures the policy weighs. ``index``, if given and
    holding the queues, answers instead of sorting ``pending`` again."""
    if index is not None and index.queues is not None:
        return index.queues
    grouped: dict[str, dict[str, list[Request]]] = defaultdict(lambda: defaultdict(list))
    for request in view.pending:
        grouped[request.pool][request.team].append(request)
    settings = view.settings
    kinds = {name: pool.kind for name, pool in view.pools.items()}
    out: dict[str, dict[str, tuple[Queued, ...]]] = {}
    for pool, teams in grouped.items():
        kind = kinds.get(pool, PoolKind.GPU)
        out[pool] = {
            team: tuple(Queued.of(r, settings, kind) for r in sorted(requests, key=queue_key))
            for team, requests in teams.items()
        }
    return out


class _DayUsage:
    """Day slices (S5 of docs/architecture.md): jobs larger than their team's share,
    funded from the last day's share rather than the window's budget.

    Such a job is larger than R2's share test allows, and with a week's budget it
    could run on for days and leave its team nothing the rest of the week. So it is
    admitted while the team's charge over the last day leaves room for its protected
    window, with the team's other funded work charged beside it for as long, and, if
    it can be resumed, stopped (`slices_over`) once that charge reaches the day's
    share while other work waits in the pool; it comes back when the day slides on.
    The same terms fund a job within the share that R2 does not fund beside the
    team's work below the share, and a sub-team's job may borrow the days of the
    levels above it (`lenders`, `_Cycle.lent`). The evidence for each part is in
    docs/architecture.md ("Evidence", S5).
    """

    def __init__(self, view: ClusterView, now: float) -> None:
        self.view = view
        self.now = now
        usage = view.usage
        self.usage = usage if isinstance(usage, WindowUsage) else None
        self.start = max(usage.start, now - _DAY) if isinstance(usage, WindowUsage) else now
        self.span = now - self.start

    def lenders(self, team: str, pool: str) -> list[tuple[tuple[str, ...], float]]:
        """The levels above the team's own work whose share it may borrow, as (subtree,
        share rate): its ancestors, and itself if it has sub-teams (`_Cycle.lent`)."""
        tree = self.view.teams
        capacity = self.view.capacity.get(pool, 0.0)
        return [
            (tree.subtree(level), tree.share(level, pool) * capacity)
            for level in tree.ancestors(team)
            if level != team or tree.has_children(team)
        ]

    def room(self, team: str, pool: str, share_rate: float) -> float:
        """Units the team may still be charged in the pool before its day's share."""
        return self.subtree_room((team,), pool, share_rate)

    def subtree_room(self, members: tuple[str, ...], pool: str, share_rate: float) -> float:
        """Units the teams in ``members`` (a team's whole subtree, or the team alone) may
        still be charged in the pool before that team's day share (``share_rate``)."""
        if self.usage is None:
            return share_rate * _DAY
        usage, start = self.usage, self.start
        return share_rate * self.span - sum(usage.since((m, pool), start) for m in members)

    def slices_over(self, stopped: set[str]) -> list[Preemption]:
        """Stops for resumable oversize jobs past protection whose team's day is spent."""
        view = self.view
        guaranteed = view.settings.guaranteed_share
        if self.usage is None or not view.pending or guaranteed <= 0:
            return []  # without a guaranteed share there are no day slices to stop
        waiting = {r.pool for r in view.pending}
        tree = view.teams
        settings = view.settings
        now = self.now
        found: list[Preemption] = []
        # (team, pool) → (share rate, the rate above which a job is oversize).
        limits: dict[tuple[str, str], tuple[float, float]] = {}
        for allocation in view.allocations:
            # The cheap tests first: this runs over every session in every cycle.
            if not allocation.funded or allocation.protected_until > now:
                continue
            request = allocation.request
            pool = request.pool
            if (
                pool not in waiting
                or allocation.start >= now
                or not request.resumable
                or request.id in stopped
            ):
                continue
            slot = (request.team, pool)
            limit = limits.get(slot)
            if limit is None:
                share_rate = tree.own_share(request.team, pool) * view.capacity.get(pool, 0)
                limit = limits[slot] = (share_rate, oversize_above(share_rate, settings))
            share_rate, above = limit
            if allocation.charge_rate <= above:
                continue
            # Its own day spent, and the day of every level it may borrow from (none for
            # a top-level team).
            if self.room(request.team, pool, share_rate) <= 1e-6 and all(
                self.subtree_room(members, pool, rate) <= 1e-6
                for members, rate in self.lenders(request.team, pool)
            ):
                found.append(Preemption(allocation.id, "time-slice"))
        return found


class _Pass:
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
        """Per team, the charge rate of its requests waiting in the pool (`_Cycle.lent`)."""


class _Cycle:
    """One cycle of the budget policy: its what-if capacity, its charge rates, and what
    it has decided so far."""

    def __init__(self, view: ClusterView, now: float) -> None:
        """Start: sessions on unhealthy nodes are stopped and their slices free (R6);
        last cycle's holds stay while their requests wait and their nodes are ready
        (R7); charge rates are those of the funded sessions left running."""
        self.view = view
        self.now = now
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
        self.preemptions: list[Preemption] = health_preemptions(view, now)
        self.stopped = {p.allocation_id for p in self.preemptions}
        self.day = _DayUsage(view, now)
        self.preemptions.extend(self.day.slices_over(self.stopped))
        self.stopped = {p.allocation_id for p in self.preemptions}
        self._by_id: dict[str, Allocation] = {}
        if self.stopped:
            self._by_id = {a.id: a for a in view.allocations}
            for allocation_id in self.stopped:
                capacity.give(self._by_id[allocation_id].grants)
        self.rates = funded_rates(view, self.stopped)
        self.funded_victims: set[str] = set()
        self._victims: Victims | None = None
        kept_reservations(view, capacity)
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
        self.held: dict[str, set[str]] = defaultdict(set)
        """Per pool, the requests holding nodes there."""
        for node, request_id in capacity.reserved.items():
            self.held[capacity.free[node].node.pool].add(request_id)
        self.admissions: list[Admission] = []
        self.released: list[str] = []
        self.order: list[str] = []
        self.funded: dict[str, bool] = {}
        self.notes: list[tuple[Queued, str, float, str]] = []
        """Per entry looked at, in ``order``: its funding ground, the protection it
        would get if funded, and its placement outcome (the verdict's makings)."""
        self._over: dict[str, frozenset[str]] = {}
        self._blockers: defaultdict[tuple[str, str], list[str]] | None = None
        """Per (team, pool), its funded sessions that keep it from slicing itself
        (`own_swappable`), found on first use."""
        self._clears: dict[str, float] | None = None

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
            self._victims = found
        return found

    def pool(self, pool_name: str, team_queues: Mapping[str, tuple[Queued, ...]]) -> None:
        """Team order: every entry of the pool's queues is looked at once, team by team,
        the team with the lowest rank first (R1) and ranked again after
        each funded admission; a team's own entries in queue order. Each entry is judged
        for funding (R2), then fitted, else given victims, else a hold; ``order``
        and ``funded`` record every entry looked at."""
        now = self.now
        settings = self.settings
        index = self.index
        ranking = PoolRanking(
            self.view, pool_name, now, index.protected.get(pool_name, ()) if index else None
        )
        held = self.held[pool_name]
        state = _Pass(pool_name, ranking, held)
        no_fit, no_victims, no_backfill = state.no_fit, state.no_victims, state.no_backfill
        no_burst = state.no_burst
        no_fit_exact, no_victims_exact = no_fit.exact, no_victims.exact
        window = self.view.window
        rates = self.rates
        order_append = self.order.append
        note = self.notes.append
        funded_now = self.funded
        starvation_bound = settings.starvation_bound
        max_reservations = settings.max_reservations_per_pool
        own_slice_after = settings.own_slice_after
        heappush, heappop = heapq.heappush, heapq.heappop

        draining: set[str] = set()  # teams whose job waits to slice the team
        heads = dict.fromkeys(team_queues, 0)
        # Debug entries of every team come before any team's other work (the fast
        # lane across teams): (not debug, key, submit, team).
        heap = [
            (not q[0].debug, ranking.key(team), q[0].request.submit, team)
            for team, q in team_queues.items()
        ]
        heapq.heapify(heap)
        while heap:
            later, key, _, team = heappop(heap)
            current = ranking.key(team)
            if current > key:
                # Funded admissions elsewhere in this team's subtree moved it back.
                head = team_queues[team][heads[team]]
                heappush(heap, (later, current, head.request.submit, team))
                continue
            queue = team_queues[team]
            at = heads[team]
            end = len(queue)
            # Until this team is charged (which ends its turn), its ratios stand still.
            leaf_units, leaf_budget = ranking.leaf(team)
            share_rate = leaf_budget / window if window > 0 else 0.0
            rate_key = (team, pool_name)
            lenders: list[tuple[tuple[str, ...], float, float]] | None = None
            share_limit = oversize_above(share_rate, settings)
            day_sliced = settings.guaranteed_share > 0 and self.day.usage is not None
            day_room: float | None = None
            afters: dict[float, Key] = {}
            top = heap[0] if heap else None
            while True:
                entry = queue[at]
                at += 1
                request = entry.request
                request_id = request.id
                order_append(request_id)
                units = entry.units
                protect = entry.min_runtime
                swap = False
                if (
                    own_slice_after > 0.0
                    and entry.rate > share_limit
                    and day_sliced
                    and rates[rate_key] > 1e-9
                    and now - request.submit >= own_slice_after
                ):
                    # The team slices itself (S6, own_slice_after): the job may stop
                    # the team's own work once it can all resume; until then the team's
                    # later batch work is not funded, so that it does not hold the job off.
                    swap = self.own_swappable(team, pool_name)
                    if not swap:
                        draining.add(team)
                beside = False
                if entry.rate > share_limit and day_sliced:
                    # Larger than the team's share: funded from a day's share (S5),
                    # for as long as that pays for it and the team's other funded work
                    # (which a swap stops), whatever the week's budget; beside that work
                    # it holds no nodes.
                    if day_room is None:
                        day_room = self.day.room(team, pool_name, share_rate)
                    others = 0.0 if swap else rates[rate_key]
                    beside = others > 1e-9
                    sliced = day_room / (entry.rate + others)
                    if lenders is None:
                        lenders = self.lent(team, pool_name, team_queues, state)
                    if lenders:
                        # Or from its parent's day, beside what its relatives claim.
                        sliced = max(
                            sliced,
                            min(
                                self.day.subtree_room(members, pool_name, rate)
                                / (entry.rate + others + claimed)
                                for members, rate, claimed in lenders
                            ),
                        )
                    if leaf_budget <= 0.0:
                        ground = NO_SHARE
                    elif others > share_limit:
                        ground = OVER_SHARE_BESIDE
                    elif _slice_pays(sliced, protect, settings):
                        ground = DAY_SLICE
                    else:
                        ground = DAY_SPENT
                    funded = ground is DAY_SLICE
                    if funded and sliced < protect:
                        protect, units = sliced, entry.rate * sliced
                    elif not funded and beside:
                        # Beside work beyond the share: only the window budget funds it,
                        # as any request beyond the share (and it may hold, as they may).
                        beside = False
                        ground = funding(
                            leaf_budget > 0.0 and (leaf_units + units) / leaf_budget <= 1.0,
                            others,
                            entry.rate,
                            share_rate,
                            settings,
                        )
                        funded = ground in FUNDED_GROUNDS
                elif team in draining and request.klass is RequestClass.BATCH:
                    funded = False
                    ground = TEAM_SLICING
                else:
                    ground = funding(
                        leaf_budget > 0.0 and (leaf_units + units) / leaf_budget <= 1.0,
                        rates[rate_key],
                        entry.rate,
                        share_rate,
                        settings,
                    )
                    funded = ground in FUNDED_GROUNDS
                    running = rates[rate_key]
                    if (
                        not funded
                        and day_sliced
                        and leaf_budget > 0.0
                        and running < share_limit - 1e-9
                    ):
                        # Within the share, but not funded beside the team's work, which
                        # is below the share: a day slice too (S5), burst work that holds
                        # no nodes.
                        if day_room is None:
                            day_room = self.day.room(team, pool_name, share_rate)
                        sliced = day_room / (entry.rate + running)
                        if _slice_pays(sliced, protect, settings):
                            funded = beside = True
                            ground = DAY_SLICE
                            if sliced < protect:
                                protect, units = sliced, entry.rate * sliced
                funded_now[request_id] = funded
                holder = bool(held) and request_id in held
                if holder and not funded:
                    # It would run unallocated: its nodes go back to everyone.
                    self.end_hold(request_id, state)
                    holder = False

                # Fit, else victims, else hold; each only where it may find something.
                grants: tuple[NodeGrant, ...] | None = None
                preempts: tuple[str, ...] = ()
                outcome = NO_ROOM
                if holder or (
                    entry.shape_id not in no_fit_exact
                    and not no_fit.known(entry.shape, (), entry.shape_id)
                ):
                    grants = self.fit(entry, holder, no_fit)
                    if grants is not None:
                        outcome = PLACED
                if (
                    grants is None
                    and self.capacity.reserved
                    and ((entry.debug and not holder) or (not funded and request.resumable))
                    and not no_backfill.known(entry.shape, (), entry.shape_id)
                ):
                    # Held nodes' free slices (see `backfill`), before any victims: a debug
                    # session takes them rather than stop someone's work, and resumable
                    # work that would run unallocated may stop no one anyway.
                    grants = self.backfill(entry, no_backfill)
                    if grants is not None:
                        outcome = BACKFILLED
                if grants is None and funded:
                    outcome = NO_VICTIMS
                    # A holder ranks as its team stands, before its own charge (S7 of
                    # docs/architecture.md).
                    after = ranking.key(team) if holder else afters.get(units)
                    if after is None:
                        after = afters[units] = ranking.key(team, units)
                    # A team with relatives compares with them at its own level: another
                    # team's failure at a key says nothing of its victims, nor its of theirs.
                    related = ranking.related(team)
                    failed_at = None if related else no_victims_exact.get(entry.shape_id)
                    running = rates[rate_key]
                    burst = running > 1e-9 and running + entry.rate > share_limit
                    # A holder's search counts its own held nodes: no other entry's
                    # failure speaks for it, nor its failure for them (see `stop_for`).
                    if (
                        entry.debug
                        or holder
                        or (
                            (failed_at is None or after < failed_at)
                            and (
                                related or not no_victims.known(entry.shape, after, entry.shape_id)
                            )
                            and not (burst and no_burst.known(entry.shape, (), entry.shape_id))
                        )
                    ):
                        # A day slice (its protection cut to what the day pays) shorter
                        # than default_min_runtime throws no one's work away (`evict`).
                        short = (
                            protect < entry.min_runtime
                            and protect < settings.default_min_runtime - 1e-9
                        )
                        found = self.evict(
                            entry, team, after, holder, state, burst and not swap, swap, short
                        )
                        if found is not None:
                            grants, preempts = found
                            outcome = PREEMPTS if preempts else PLACED
                elif grants is None and entry.debug:
                    outcome = NO_VICTIMS
                    lane = self.lane(entry, team, holder, state)
                    if lane is not None:
                        grants, preempts = lane
                        outcome = PREEMPTS if preempts else PLACED
                        ground = funding(
                            leaf_budget > 0.0 and (leaf_units + units) / leaf_budget <= 1.0,
                            rates[rate_key],
                            entry.rate,
                            share_rate,
                            settings,
                        )
                        funded = funded_now[request_id] = ground in FUNDED_GROUNDS
                charged = False
                if grants is not None:
                    charged = self.admit(
                        entry, grants, funded, preempts, holder, state, protect, units
                    )
                elif (
                    funded
                    and now - request.submit >= starvation_bound
                    and not holder
                    and not beside
                    and len(held) < max_reservations
                ):
                    self.hold(entry, held)
                    if request_id in held:
                        outcome = HOLDING
                elif holder:
                    outcome = HOLDING
                note((entry, ground, protect, outcome))

                # The team keeps its turn while its next entry still sorts first.
                if at >= end:
                    break
                next_entry = queue[at]
                next_later = not next_entry.debug
                if not charged and (top is None or (next_later, current) < top[:2]):
                    continue
                following = (next_later, current, next_entry.request.submit, team)
                if charged or (top is not None and not following < top):
                    heappush(heap, following)
                    break
            heads[team] = at

    def fit(self, entry: Queued, holder: bool, no_fit: Failures) -> tuple[NodeGrant, ...] | None:
        """Fit: grants for the entry on free slices (R3), taken from the capacity, or
        None. A shape that found no room is remembered in ``no_fit`` unless the entry
        holds nodes (which no other request may use)."""
        grants = self.capacity.place(entry.request, self.settings.placement)
        if grants is None and not holder:
            no_fit.add(entry.shape, (), entry.shape_id)
        return grants

    def backfill(self, entry: Queued, no_backfill: Failures) -> tuple[NodeGrant, ...] | None:
        """Backfill: an entry that would run unallocated and can be resumed may use the
        free slices of nodes held for others; the holder stops it (past its grace) the
        moment the rest of its nodes is free. A debug entry may too, funded or not,
        before it looks for victims: it is short and small, and the holder stops it
        past its protection by the rank rule as it would any session (else waits for
        it to end, as for the sessions that were on the node when it was held)."""
        grants = self.capacity.place(entry.request, self.settings.placement, backfill=True)
        if grants is None:
            no_backfill.add(entry.shape, (), entry.shape_id)
        return grants

    def evict(
        self,
        entry: Queued,
        team: str,
        after: Key,
        holder: bool,
        state: _Pass,
        burst: bool,
        swap: bool = False,
        short: bool = False,
    ) -> tuple[tuple[NodeGrant, ...], tuple[str, ...]] | None:
        """Victims: for a funded entry with no room on free slices, stop the sessions that
        lose the least work and make room (R4): unallocated ones past their grace,
        funded ones past their protected window of teams whose key is above ``after``
        (the team's key with the entry charged). Their slices go to the entry: its grants
        and the victims' ids, or None, with the shape remembered in ``state.no_victims``
        unless the entry holds nodes (and the search in `KnownFailures`), if no set of
        victims makes room. A
        ``burst`` entry (funded beyond its team's share next to other funded work of
        the team) may stop only unallocated sessions; a ``swap`` entry (a job that
        slices its own team) may stop its own team's sessions past protection as well;
        a ``swap`` or ``short`` entry (a day slice shorter than ``default_min_runtime``)
        stops only sessions that resume."""
        ranking = state.ranking
        if not state.team_keys or state.team_keys_at != ranking.charges:
            state.team_keys = [(t, ranking.key(t)) for t in self.view.teams.teams]
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
        lane = None
        if entry.debug:  # the fast lane
            lane = Lane(below)
            below |= self.over_share(state) | {team}
        elif swap or short:
            # A team's own time slice, or a day slice shorter than an hour: it throws
            # no one's work away (`Lane`).
            lane = Lane(None, resumable=True)
        # A search under a lane's limit speaks for no other entry of its shape.
        found = self.stop_for(
            entry,
            below,
            holder,
            state,
            None if burst or lane is not None or ranking.related(team) else after,
            lane,
        )
        if found is None and burst and lane is None and not holder:
            state.no_burst.add(entry.shape, (), entry.shape_id)
        return found

    def lent(
        self,
        team: str,
        pool: str,
        team_queues: Mapping[str, tuple[Queued, ...]],
        state: _Pass,
    ) -> list[tuple[tuple[str, ...], float, float]]:
        """What a day slice of the team may borrow from its relatives: per level above
        its own work (`_DayUsage.lenders`), that level's subtree, its share rate, and
        what the subtree's other teams claim of it now: each at least its funded
        rate, and up to its own share, what it runs funded and waits for. A job
        larger than the team's share may then be sliced from that level's day for as
        long as the level's day share pays for it, the team's other funded work and
        those claims together: a parent's share is owed to the demand of its whole
        subtree, and a sub-team's own day is often far smaller than its job."""
        out: list[tuple[tuple[str, ...], float, float]] = []
        tree = self.view.teams
        capacity = self.view.capacity.get(pool, 0.0)
        rates, waiting = self.rates, state.waiting
        for members, share_rate in self.day.lenders(team, pool):
            claimed = 0.0
            for member in members:
                if member == team:
                    continue
                wanted = waiting.get(member)
                if wanted is None:
                    wanted = waiting[member] = sum(e.rate for e in team_queues.get(member, ()))
                running = rates[(member, pool)]
                claimed += max(
                    running, min(tree.own_share(member, pool) * capacity, running + wanted)
                )
            out.append((members, share_rate, claimed))
        return out

    def own_swappable(self, team: str, pool: str) -> bool:
        """Every funded session of the team in the pool is resumable and past protection
        (so a job of the team that slices it may stop them: `Settings.own_slice_after`),
        or stopped this cycle."""
        blockers = self._blockers
        if blockers is None:
            # Once per cycle: sessions only leave the set (stopped), never join it.
            now = self.now
            blockers = self._blockers = defaultdict(list)
            for allocation in self.view.allocations:
                if allocation.funded and (
                    allocation.protected_until > now or not allocation.request.resumable
                ):
                    request = allocation.request
                    blockers[(request.team, request.pool)].append(request.id)
        stopped = self.stopped
        return all(i in stopped for i in blockers.get((team, pool), ()))

    def over_share(self, state: _Pass) -> frozenset[str]:
        """Teams that hold more of the pool than their share now, funded or unallocated
        (worked out once per pool pass, on first use: only debug entries ask)."""
        found = self._over.get(state.name)
        if found is None:
            held: defaultdict[str, float] = defaultdict(float)
            stopped = self.stopped
            for allocation in self.view.allocations:
                if allocation.pool == state.name and allocation.id not in stopped:
                    held[allocation.team] += allocation.charge_rate
            window = self.view.window
            found = frozenset(
                t
                for t, rate in held.items()
                if window > 0 and rate > state.ranking.leaf(t)[1] / window + 1e-9
            )
            self._over[state.name] = found
        return found

    def lane(
        self, entry: Queued, team: str, holder: bool, state: _Pass
    ) -> tuple[tuple[NodeGrant, ...], tuple[str, ...]] | None:
        """The fast lane for a debug entry its team's budget does not fund: it may stop
        unallocated sessions past their grace (borrowed capacity) and its own team's
        funded sessions past their protected window (which may then fund it)."""
        below = self.over_share(state) | {team}
        return self.stop_for(entry, below, holder, state, None, Lane(None))

    def stop_for(
        self,
        entry: Queued,
        below: frozenset[str],
        holder: bool,
        state: _Pass,
        after: Key | None,
        lane: Lane | None = None,
    ) -> tuple[tuple[NodeGrant, ...], tuple[str, ...]] | None:
        """Stop the cheapest victims that make room for the entry: unallocated sessions
        past their grace and funded ones of the teams in ``below`` past their protected
        window (within the ``lane``'s limit, for a debug entry); their grants go to the
        entry, or None (the search remembered as failed, and with ``after``, the key it
        was made at, the shape in ``state.no_victims``, unless the entry holds nodes:
        its held nodes are its alone). A lane search is remembered
        under its lane's teams as well: its answer depends on them."""
        request = entry.request
        # A holder's search also counts its held nodes, so it is remembered apart.
        search: SearchKey = (
            entry.shape_id,
            below,
            None if lane is None else lane.normal,
            "" if lane is None else "resumable" if lane.resumable else "lane",
            request.id if holder else "",
        )
        capacity = self.capacity
        victims = self.victims()
        known_failures = self.known_failures
        if known_failures.fails(
            request, search, lambda nf: offers(capacity, victims, request, below, nf, lane)
        ):
            targets, for_want = None, True
        else:
            targets, for_want = search_targets(request, capacity, victims, below, self.now, lane)
        if targets is None:
            if for_want:
                known_failures.failed(search)
            if after is not None and not entry.debug and not holder:
                state.no_victims.add(entry.shape, after, entry.shape_id)
            return None
        chosen: dict[str, Allocation] = {}
        for target in targets:
            for victim in target.victims:
                chosen[victim.id] = victim
        rates = self.rates
        for victim in chosen.values():
            if victim.funded:
                rates[(victim.team, victim.pool)] -= victim.charge_rate
                self.funded_victims.add(victim.id)
            capacity.give(victim.grants)
            self.stopped.add(victim.id)
            reason = "funded" if self.funded.get(request.id) else "debug"
            self.preemptions.append(Preemption(victim.id, reason, request.id))
            victims.remove(victim)
        grants = tuple(
            NodeGrant(t.node, t.slices, request.cpus, request.memory_gib) for t in targets
        )
        capacity.take(grants)
        state.no_fit.clear()
        state.no_victims.clear()
        state.no_burst.clear()
        return grants, tuple(chosen)

    def hold(self, entry: Queued, held: set[str]) -> None:
        """Hold: a funded entry past the starvation bound reserves the nodes closest to
        fitting it, which take no new work from others until it fits (R7); no hold
        if too few nodes could ever take it."""
        request_id = entry.request.id
        nodes = choose_reservation(self.capacity, entry.request, self.clears())
        if nodes is not None:
            for node in nodes:
                self.capacity.reserved[node] = request_id
            held.add(request_id)

    def clears(self) -> Mapping[str, float]:
        """Per node, when the last protected window of the sessions left on it ends (no
        entry: none is protected now); worked out on first use, when a hold is made."""
        found = self._clears
        if found is None:
            found = self._clears = {}
            now, stopped = self.now, self.stopped
            for allocation in self.view.allocations:
                until = allocation.protected_until
                if until > now and allocation.id not in stopped:
                    for node in allocation.node_names:
                        if until > found.get(node, now):
                            found[node] = until
        return found

    def end_hold(self, request_id: str, state: _Pass) -> None:
        """The nodes held for ``request_id`` go back to everyone (and count as grown): a
        shape that found no room or no victims without them, burst work's included, may
        find them now, so the pass's shape records are dropped."""
        _drop_hold(self.capacity, request_id, self.known_failures.grown)
        state.held.discard(request_id)
        state.no_fit.clear()
        state.no_victims.clear()
        state.no_burst.clear()
        self.released.append(request_id)

    def admit(
        self,
        entry: Queued,
        grants: tuple[NodeGrant, ...],
        funded: bool,
        preempts: tuple[str, ...],
        holder: bool,
        state: _Pass,
        protect: float,
        units: float,
    ) -> bool:
        """Admit the entry on ``grants`` (after ``preempts`` stop): its hold ends; it is
        protected for its minimum runtime if funded, else for the unallocated grace; a
        funded one is charged to its team. True if it was (the team's rank moved)."""
        request = entry.request
        if holder:
            self.end_hold(request.id, state)
        protected = self.protection(entry, funded, protect, preempts)
        self.admissions.append(
            Admission(request, grants, funded, self.now + protected, entry.rate, preempts)
        )
        if not funded:
            return False
        self.rates[(request.team, state.name)] += entry.rate
        state.ranking.charge(request.team, units)
        return True

    def protection(
        self, entry: Queued, funded: bool, protect: float, preempts: tuple[str, ...] = ()
    ) -> float:
        """Seconds the entry is protected if admitted now (after ``preempts`` stop): its
        minimum runtime (``protect``, cut to a day slice where S5 cuts it) if funded,
        else the unallocated grace; longer for a debug session stopped before (S2)."""
        settings = self.settings
        protected = protect if funded else settings.unallocated_grace
        if not funded and entry.debug and not self.funded_victims.isdisjoint(preempts):
            # An unfunded debug session that stopped funded work keeps its place for its
            # protected window: else the next funded request took it back, and the lane
            # stopped someone else's work for it again, cycle after cycle.
            protected = protect
        if entry.debug:
            stops = self.view.stops.get(entry.request.id, 0)
            if stops:
                # Stopped before it ran its course: twice as long each time (S2 of
                # docs/architecture.md).
                doubled = protect * 2.0 ** (stops if funded else stops - 1)
                protected = max(protected, min(doubled, settings.max_min_runtime))
        return protected

    def verdict(self, position: int, admitted: Mapping[str, Admission]) -> Verdict:
        """The verdict of the entry looked at in ``position`` (built when read)."""
        entry, ground, protect, outcome = self.notes[position]
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
        )

    def verdicts(self) -> Verdicts:
        """Every entry's verdict, in ``order``, each built on first read."""
        admitted: dict[str, Admission] = {}

        def build(position: int) -> Verdict:
            if not admitted and self.admissions:
                admitted.update((a.request.id, a) for a in self.admissions)
            return self.verdict(position, admitted)

        return Verdicts(self.order, build)

    def decisions(self) -> Decisions:
        """Decisions: preemptions and admissions in the order they must be carried out,
        the holds as they stand at the end, and every entry looked at, in order, with
        whether it would be funded."""
        reservations: dict[str, list[str]] = defaultdict(list)
        for node, request_id in sorted(self.capacity.reserved.items()):
            reservations[request_id].append(node)
        return Decisions(
            admissions=tuple(self.admissions),
            preemptions=tuple(self.preemptions),
            reservations=MappingProxyType({k: tuple(v) for k, v in reservations.items()}),
            order=tuple(self.order),
            funded=MappingProxyType(self.funded),
            verdicts=self.verdicts(),
            released=tuple(self.released),
            searches=MappingProxyType(self.known_failures.found),
        )


@register("budget")
def budget_policy(view: ClusterView, now: float) -> Decisions:
    """The scheduling contract of docs/architecture.md: start the cycle, take the heads
    of the queue, then each pool in name order, and return what was decided."""
    cycle = _Cycle(view, now)
    queues = queue_heads(view, cycle.index)
    for pool_name in sorted(queues):
        team_queues = queues[pool_name]
        if team_queues:
            cycle.pool(pool_name, team_queues)
    return cycle.decisions()
