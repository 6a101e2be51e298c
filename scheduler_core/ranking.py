"""Occupancy ratios and the order of teams within a pool (R1 and R2, and R4's rank
test, of the scheduling contract, docs/architecture.md).

A team's ratio counts the usage charged in the lookback window plus what its
running funded sessions are still certain to be charged (the rest of their
protected windows): a team cannot fund more protected time than its budget
holds. Its rank (`key`) weighs in its last day the same way
(``Settings.day_rank_weight``): (1 - w) x the window's ratio + w x the last day's,
each over the share of its span; funding (`leaf`, `can_fund`) keeps the window's
ratio alone. Why: the window ranks a team by its week, so one that ran hard earlier
in the week stays behind for days, and while it is short it may stop no work of the
teams ahead of it, even of teams over their share now (docs/policy.md,
"Evidence", R1, with the measurements). The day alone as the rank did worse than
the window: the week is what keeps a team from running over its share day after
day. Keys compare level by level from the root, so two teams are ordered by
the ratios of the ancestors where their paths split. R4's after-the-swap test
(`PoolRanking.below`) compares there too: a request's charge raises every level it
shares with a sibling, so comparing the charged key with the sibling's uncharged
one put the sibling ahead at the shared level, and a sub-team below its part of the
parent's share could never stop a sibling far above it (tests/unit/test_rules.py).

The tree's derived facts (levels, subtrees, shares) are worked out once per
`TeamTree` object and pool, not once per cycle: a tree is frozen, so they cannot change.

A ranking works a level's figure out on first ask (`PoolRanking._level`), not every
level's when made: a cycle over a few entries asks for a few teams' keys. Why it
stays exact: a team's own figure adds its window's charge and then its protected
sessions' rest in the order of ``protected`` (as one pass over them all did), a
parent's level adds its subtree's from 0 in the subtree's order (as `sum`), and
`charge` works out every level it adds to before adding. The protected sessions by
team are kept per pool while the index hands out the same tuple.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from scheduler_core.ledger import WindowUsage, _Curve
from scheduler_core.model import Allocation
from scheduler_core.settings import DAY
from scheduler_core.teams import OWN, TeamTree
from scheduler_core.view import ClusterView

Key = tuple[float, ...]


class _TreeFacts:
    """Levels, subtrees and per-pool shares of one team tree, by name and by number: a
    ranking keeps its figures in lists by level number (teams in the tree's order,
    then each parent's own level), not in dicts by name."""

    def __init__(self, tree: TeamTree) -> None:
        self.tree = tree
        self.levels = {name: tree.levels(name) for name in tree.teams}
        subtrees = {name: tree.subtree(name) for name in tree.teams}
        parents = tuple(name for name in tree.teams if tree.has_children(name))
        self.own_levels = tuple((name, name + OWN) for name in parents)
        """Per parent, its name and its own work's level (``parent#own``), made once."""
        self.shared: dict[str, dict[str, int]] = {
            a: {b: _common(self.levels[a], self.levels[b]) for b in tree.teams} for a in tree.teams
        }
        """Per pair of teams, how many levels their paths share (compared at the next)."""
        self.names: tuple[str, ...] = tuple(tree.teams)
        """The teams in the tree's order: team ``i`` is level ``i``."""
        self.index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        numbers = dict(self.index)
        for k, (_, own) in enumerate(self.own_levels):
            numbers[own] = len(self.names) + k
        self.paths: dict[str, tuple[int, ...]] = {
            name: tuple([numbers[level] for level in self.levels[name]]) for name in self.names
        }
        """Per team, its levels' numbers, root first."""
        self.team_paths: tuple[tuple[int, ...], ...] = tuple([self.paths[n] for n in self.names])
        """The same by team number."""
        members: list[tuple[int, ...]] = [(i,) for i in range(len(self.names))]
        sums = [False] * len(self.names)
        for name, _ in self.own_levels:
            i = self.index[name]
            members[i] = tuple([self.index[t] for t in subtrees[name]])
            sums[i] = True
            members.append((i,))
            sums.append(False)
        self.members: tuple[tuple[int, ...], ...] = tuple(members)
        """Per level, the teams whose own figures make it: a parent's subtree (added
        from 0 in the subtree's order, as `sum`: ``sums``), else the one team (as is)."""
        self.sums: tuple[bool, ...] = tuple(sums)
        self._budgets: dict[tuple[str, float], list[float]] = {}
        self.groups: dict[str, tuple[tuple[Allocation, ...], list[list[Allocation]]]] = {}
        """Per pool, the last protected sessions handed to a ranking and the same by team
        number (in their order): the scheduler's index hands out the same tuple until
        they change."""

    def budgets(self, pool: str, budget_rate: float) -> list[float]:
        """Budget units of every level (team, and ``parent#own``) over the window, by
        level number."""
        found = self._budgets.get((pool, budget_rate))
        if found is None:
            tree = self.tree
            found = [tree.share(name, pool) * budget_rate for name in self.names]
            for name, _ in self.own_levels:
                found.append(tree.own_share(name, pool) * budget_rate)
            if len(self._budgets) >= 64:
                self._budgets.clear()
            self._budgets[(pool, budget_rate)] = found
        return found

    def by_team(self, allocations: Iterable[Allocation]) -> list[list[Allocation]]:
        """The allocations by their team's number, each team's in their order, and last
        those of a team not in the tree."""
        found: list[list[Allocation]] = [[] for _ in range(len(self.names) + 1)]
        index = self.index
        for allocation in allocations:
            found[index.get(allocation.request.team, -1)].append(allocation)
        return found


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


_FACTS: Final[dict[int, _TreeFacts]] = {}


def _facts(tree: TeamTree) -> _TreeFacts:
    found = _FACTS.get(id(tree))
    if found is None or found.tree is not tree:
        if len(_FACTS) >= 64:
            _FACTS.clear()
        found = _FACTS[id(tree)] = _TreeFacts(tree)
    return found


class PoolRanking:
    """Ratios of every team level in one pool, updated as the cycle admits funded work."""

    def __init__(
        self,
        view: ClusterView,
        pool: str,
        now: float,
        protected: Iterable[Allocation] | None = None,
    ) -> None:
        """``protected``, when given, holds (in the order of the view's allocations)
        every funded allocation of the pool still inside its protected window at
        ``now``, and perhaps others of them."""
        tree = view.teams
        facts = self._facts = _facts(tree)
        budget_rate = view.capacity.get(pool, 0.0) * view.window
        self._budget = facts.budgets(pool, budget_rate)
        """Shared by every ranking of the tree and pool: never changed here."""
        self._paths = facts.paths
        self._shared = facts.shared
        self._index = facts.index
        self._team_paths = facts.team_paths
        teams = len(facts.names)
        self._keys: list[Key | None] = [None] * teams
        """Each team's key by number, worked out on first ask (None until then)."""
        self.charges = 0
        """How many times `charge` was called (keys change only then)."""
        self._view = view
        self._pool = pool
        self._now = now
        if protected is not None and not isinstance(protected, tuple):
            protected = list(protected)  # as it is now: it is read on first need
        self._protected = protected
        self._groups: list[list[Allocation]] | None = None
        """``protected`` by team number, made on first need."""
        usage = view.usage
        self._window: WindowUsage | None = usage if isinstance(usage, WindowUsage) else None
        self._curves: dict[str, _Curve] | None = None
        """The pool's curves by team (`WindowUsage.pool_curves`), on first need."""
        self._weight = 0.0
        """Weight of the last day in `key` (0 where the usage has no curves to ask)."""
        self._day_part = 1.0
        """The last day's span over the window's: its part of every budget."""
        self._day_start: float | None = None
        """Where the last day starts, if it weighs in (then ``_day_units`` are kept)."""
        if isinstance(usage, WindowUsage):
            weight = view.settings.day_rank_weight
            if weight > 0.0 and view.window > 0.0:
                start = max(usage.start, now - DAY)
                if now > start:
                    self._weight = weight
                    self._day_part = (now - start) / view.window
                    self._day_start = start
        self._day = self._day_start is not None and teams > 0
        levels = len(self._budget)
        self._own = [0.0] * teams
        self._own_day = [0.0] * teams
        self._own_known = [False] * teams
        """Each team's own figures (window and last day), once worked out."""
        self._units = [0.0] * levels
        self._day_units = [0.0] * levels if self._day else []
        self._known = [False] * levels
        """Which levels' figures are worked out (else ``_units`` holds 0)."""

    def _by_team(self) -> list[list[Allocation]]:
        protected = self._protected
        facts = self._facts
        if protected is None:
            pool = self._pool
            found = facts.by_team(
                [a for a in self._view.allocations if a.funded and a.pool == pool]
            )
        elif isinstance(protected, tuple):
            kept = facts.groups.get(self._pool)
            if kept is not None and kept[0] is protected:
                found = kept[1]
            else:
                found = facts.by_team(protected)
                facts.groups[self._pool] = (protected, found)
        else:
            found = facts.by_team(protected)
        for allocation in found[-1]:
            if allocation.protected_until > self._now:
                raise KeyError(allocation.request.team)  # as a team's figure would
        self._groups = found
        return found

    def _team(self, i: int) -> None:
        """Work out team ``i``'s own figures: its window's (and last day's) charge, and
        what its running funded sessions are still certain to be charged."""
        window = self._window
        name = self._facts.names[i]
        if window is not None:
            curves = self._curves
            if curves is None:
                curves = self._curves = window.pool_curves(self._pool)
            curve = curves.get(name)
            if curve is None:
                units, day = 0.0, 0.0
            else:
                units, day = curve.figures(window.start, window.end, self._day_start)
        else:
            units, day = self._view.usage.get((name, self._pool), 0.0), 0.0
        groups = self._groups
        if groups is None:
            groups = self._by_team()
        now = self._now
        with_day = self._day
        for allocation in groups[i]:
            until = allocation.protected_until
            if until > now:
                still = allocation.charge_rate * (until - now)
                units = units + still
                if with_day:
                    day = day + still
        self._own[i] = units
        self._own_day[i] = day
        self._own_known[i] = True

    def _level(self, level: int) -> None:
        """Work out a level's figures from its teams' own (`_TreeFacts.members`)."""
        facts = self._facts
        known = self._own_known
        own = self._own
        own_day = self._own_day
        if facts.sums[level]:
            units = 0.0
            day = 0.0
            for t in facts.members[level]:
                if not known[t]:
                    self._team(t)
                units = units + own[t]
                day = day + own_day[t]
        else:
            t = facts.members[level][0]
            if not known[t]:
                self._team(t)
            units = own[t]
            day = own_day[t]
        self._units[level] = units
        if self._day:
            self._day_units[level] = day
        self._known[level] = True

    def _ratio(self, level: int, extra: float = 0.0) -> float:
        budget = self._budget[level]
        if budget <= 0.0:
            return math.inf
        if not self._known[level]:
            self._level(level)
        return (self._units[level] + extra) / budget

    def _rank(self, level: int, extra: float = 0.0) -> float:
        """The level's rank ratio: its window's ratio, and its last day's by weight."""
        ratio = self._ratio(level, extra)
        weight = self._weight
        if not weight or ratio == math.inf:
            return ratio
        day = (self._day_units[level] + extra) / (self._budget[level] * self._day_part)
        return (1.0 - weight) * ratio + weight * day

    def key(self, team: str, extra: float = 0.0) -> Key:
        """The team's position: rank ratios root first; ``extra`` units as if already
        charged."""
        i = self._index[team]
        if extra:
            return tuple([self._rank(level, extra) for level in self._team_paths[i]])
        found = self._keys[i]
        if found is None:
            path = self._team_paths[i]
            if len(path) == 1:
                found = (self._rank(path[0]),)
            else:
                found = tuple([self._rank(level) for level in path])
            self._keys[i] = found
        return found

    def below(self, team: str, after: Key, keys: Iterable[tuple[str, Key]]) -> frozenset[str]:
        """The teams of ``keys`` (team, key) that rank below ``team`` with its key at
        ``after``, each compared at the level where its path and the team's split: the
        levels they share hold the same charge for both."""
        shared = self._shared[team]
        return frozenset(
            t
            for t, k in keys
            if t != team and (k > after if (i := shared[t]) == 0 else k[i:] > after[i:])
        )

    def related(self, team: str) -> bool:
        """Does the team share a level with another team (a parent or a sub-team)?"""
        return len(self._paths[team]) > 1

    def leaf(self, team: str) -> tuple[float, float]:
        """Units charged and budget at the team's own (leaf) level, which decides funding."""
        level = self._paths[team][-1]
        if not self._known[level]:
            self._level(level)
        return self._units[level], self._budget[level]

    def ratio(self, team: str) -> float:
        """The ratio that decides funding: the team's own (leaf) level."""
        return self._ratio(self._paths[team][-1])

    def can_fund(self, team: str, units: float) -> bool:
        """Is the team under its allocation with ``units`` more charged?"""
        return self._ratio(self._paths[team][-1], units) <= 1.0

    def charge(self, team: str, units: float) -> None:
        """Count ``units`` against the team and every level above it."""
        day = self._day_units
        own = self._units
        known = self._known
        for level in self._paths[team]:
            if not known[level]:
                self._level(level)
            own[level] = own[level] + units
            if day:
                day[level] = day[level] + units
        self._keys = [None] * len(self._keys)
        self.charges += 1
