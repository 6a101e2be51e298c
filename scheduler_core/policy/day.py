"""S5 of docs/architecture.md, day slices: jobs larger than their team's share, funded
from the last day's share rather than the window's budget, and stopped once that
day is spent while others wait (the evidence is in docs/policy.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from scheduler_core.kept import Queued
from scheduler_core.ledger import WindowUsage
from scheduler_core.model import Allocation
from scheduler_core.preemption import PRICE_CAP, at_checkpoint
from scheduler_core.rules import oversize_above
from scheduler_core.settings import Settings
from scheduler_core.teams import TeamTree
from scheduler_core.view import ClusterView, Preemption

if TYPE_CHECKING:
    from scheduler_core.policy.cycle import Cycle, Pass

__all__ = ["DAY", "DayUsage", "lent", "slice_pays"]

DAY: Final = 86400.0


def slice_pays(sliced: float, protect: float, settings: Settings) -> bool:
    """Does a day slice of ``sliced`` seconds fund a request protected for ``protect``:
    at least a cycle tick, or its protected window if shorter than
    ``debug_min_runtime`` (the shortest run the contract protects). A slice shorter
    than ``default_min_runtime`` stops only sessions that resume (S5)."""
    return sliced >= min(max(protect, settings.cycle_tick), settings.debug_min_runtime) - 1e-9


class DayUsage:
    """Day slices (S5): jobs larger than their team's share, funded from the last
    day's share rather than the window's budget.

    Such a job is larger than R2's share test allows, and with a week's budget it
    could run on for days and leave its team nothing the rest of the week. So it is
    admitted while the team's charge over the last day leaves headroom for its protected
    window, with the team's other funded work charged beside it for as long, and, if
    it can be resumed, stopped (`slices_over`) once that charge reaches the day's
    share while other work waits in the pool; it comes back when the day slides on.
    The same terms fund a job within the share that R2 does not fund beside the
    team's work below the share, and a sub-team's job may borrow the days of the
    levels above it (`lenders`, `lent`).
    """

    def __init__(self, view: ClusterView, now: float) -> None:
        self.view = view
        self.now = now
        usage = view.usage
        self.usage = usage if isinstance(usage, WindowUsage) else None
        self.start = max(usage.start, now - DAY) if isinstance(usage, WindowUsage) else now
        self.span = now - self.start

    def lenders(self, team: str, pool: str) -> list[tuple[tuple[str, ...], float]]:
        """The levels above the team's own work whose share it may borrow, as (subtree,
        share rate): its ancestors, and itself if it has sub-teams (`lent`)."""
        tree = self.view.teams
        capacity = self.view.capacity.get(pool, 0.0)
        return [
            (tree.subtree(level), tree.share(level, pool) * capacity)
            for level in tree.ancestors(team)
            if level != team or tree.has_children(team)
        ]

    def owes_any(self, teams: Iterable[str], pool: str, limits: Limits) -> bool:
        """Is the own day share in the pool of any of ``teams`` not yet charged?"""
        view = self.view
        return any(
            self.headroom(team, pool, _limit(limits, view, team, pool)[0]) > 1e-6 for team in teams
        )

    def headroom(self, team: str, pool: str, share_rate: float) -> float:
        """Units the team may still be charged in the pool before its day's share."""
        return self.subtree_headroom((team,), pool, share_rate)

    def subtree_headroom(self, members: tuple[str, ...], pool: str, share_rate: float) -> float:
        """Units the teams in ``members`` (a team's whole subtree, or the team alone) may
        still be charged in the pool before that team's day share (``share_rate``)."""
        if self.usage is None:
            return share_rate * DAY
        usage, start = self.usage, self.start
        return share_rate * self.span - usage.since_sum(members, pool, start)

    def slices_over(self, stopped: set[str], slack: float) -> list[Preemption]:
        """Stops for resumable oversize jobs past protection whose team's day is spent,
        while another team waits in the pool whose own day is not (S5); a job that
        checkpoints only ``slack`` seconds after a checkpoint at most (R10)."""
        view = self.view
        guaranteed = view.settings.guaranteed_share
        if self.usage is None or not view.pending or guaranteed <= 0:
            return []  # without a guaranteed share there are no day slices to stop
        now = self.now
        index = view.index
        sessions: Sequence[Allocation] = view.allocations
        if index is not None and index.at == now:
            sessions = index.sliceable  # the funded ones that resume, in the same order
        limits = _limits(view)
        candidates = _oversize(sessions, limits, view)
        if not candidates:
            return []
        queues = None
        if index is not None and index.at == now and index.queues is not None:
            # The kept queues are the pending requests (`heads.queue_heads`), per pool.
            queues = index.queues
            waiting = {pool for pool, teams in queues.items() if any(teams.values())}
        else:
            waiting = {r.pool for r in view.pending}
        owes: dict[str, bool] = {}
        found: list[Preemption] = []
        for allocation in candidates:
            # The cheap tests first: this runs over every such session in every cycle.
            if allocation.protected_until > now:
                continue
            request = allocation.request
            pool = request.pool
            if (
                pool not in waiting
                or allocation.start >= now
                or request.id in stopped
                # R8: not worth its price (a run far from its last checkpoint).
                or request.lost_seconds(now - allocation.start) > PRICE_CAP
                or not at_checkpoint(request, now - allocation.start, slack)
            ):
                continue
            share_rate = limits[pool][request.team][0]
            # Its own day spent, and the day of every level it may borrow from (none for
            # a top-level team).
            if self.headroom(request.team, pool, share_rate) > 1e-6 or any(
                self.subtree_headroom(members, pool, rate) > 1e-6
                for members, rate in self.lenders(request.team, pool)
            ):
                continue
            # And only for a waiting team that its own day still owes (not the job's
            # own, whose day is spent): a stop that would only lend the room to work
            # past its day is undone when the job comes back, and both pay its price.
            owed = owes.get(pool)
            if owed is None:
                if queues is not None:
                    teams: Iterable[str] = (t for t, entries in queues[pool].items() if entries)
                else:
                    teams = {r.team for r in view.pending if r.pool == pool}
                owed = owes[pool] = self.owes_any(teams, pool, limits)
            if owed:
                found.append(Preemption(allocation.id, "time-slice"))
        return found


Limits = dict[str, dict[str, tuple[float, float]]]
"""Per pool and team: its share rate, and the rate above which its job is oversize."""

_LIMITS: Final[list[tuple[TeamTree, Settings, dict[str, float], Limits]]] = []
"""The last tree, settings and capacity seen, with their `Limits` as far as worked out: a
memo of what they imply (all three are the same from cycle to cycle), not state."""


def _limits(view: ClusterView) -> Limits:
    """The `Limits` of the view's team tree, settings and capacity, filled in as asked."""
    if _LIMITS:
        tree, settings, capacity, found = _LIMITS[0]
        if tree is view.teams and settings is view.settings and capacity == view.capacity:
            return found
    found = {}
    _LIMITS[:] = [(view.teams, view.settings, dict(view.capacity), found)]
    return found


def _limit(limits: Limits, view: ClusterView, team: str, pool: str) -> tuple[float, float]:
    """The team's `Limits` in the pool, worked out the first time it is asked."""
    pool_limits = limits.get(pool)
    if pool_limits is None:
        pool_limits = limits[pool] = {}
    limit = pool_limits.get(team)
    if limit is None:
        share_rate = view.teams.own_share(team, pool) * view.capacity.get(pool, 0)
        limit = pool_limits[team] = (share_rate, oversize_above(share_rate, view.settings))
    return limit


_OVERSIZE: Final[list[tuple[Sequence[Allocation], Limits, list[Allocation]]]] = []
"""The last sessions and `Limits` seen, with those sessions that a day slice may stop at
all (`_oversize`): a memo (the scheduler hands over the same tuple until a session starts
or ends), not state."""


def _oversize(
    sessions: Sequence[Allocation], limits: Limits, view: ClusterView
) -> list[Allocation]:
    """Of ``sessions``, in order, the funded ones that resume and are larger than their
    team's share (`oversize_above`): only they may be day-sliced. What they are does not
    change with the time, so they are found once per sessions tuple rather than per cycle."""
    if _OVERSIZE:
        seen, seen_limits, found = _OVERSIZE[0]
        if seen is sessions and seen_limits is limits:
            return found
    found = []
    for allocation in sessions:
        if not allocation.funded:
            continue
        request = allocation.request
        if not request.resumable:
            continue
        if allocation.charge_rate > _limit(limits, view, request.team, request.pool)[1]:
            found.append(allocation)
    _OVERSIZE[:] = [(sessions, limits, found)]
    return found


def lent(
    cycle: Cycle, team: str, team_queues: Mapping[str, tuple[Queued, ...]], state: Pass
) -> list[tuple[tuple[str, ...], float, float]]:
    """What a day slice of the team may borrow from its relatives (S5): per level above
    its own work (`DayUsage.lenders`), that level's subtree, its share rate, and
    what the subtree's other teams claim of it now: each at least its funded
    rate, and up to its own share, what it runs funded and waits for. A job
    larger than the team's share may then be sliced from that level's day for as
    long as the level's day share pays for it, the team's other funded work and
    those claims together: a parent's share is owed to the demand of its whole
    subtree, and a sub-team's own day is often far smaller than its job."""
    out: list[tuple[tuple[str, ...], float, float]] = []
    pool = state.name
    tree = cycle.view.teams
    capacity = cycle.view.capacity.get(pool, 0.0)
    rates, waiting = cycle.rates, state.waiting
    for members, share_rate in cycle.day.lenders(team, pool):
        claimed = 0.0
        for member in members:
            if member == team:
                continue
            wanted = waiting.get(member)
            if wanted is None:
                wanted = waiting[member] = sum(e.rate for e in team_queues.get(member, ()))
            running = rates[(member, pool)]
            claimed += max(running, min(tree.own_share(member, pool) * capacity, running + wanted))
        out.append((members, share_rate, claimed))
    return out
