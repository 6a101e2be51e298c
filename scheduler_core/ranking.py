"""Occupancy ratios and the order of teams within a pool (DESIGN.md §4 rules 1–2).

A team's ratio counts the usage charged in the lookback window plus what its
running funded sessions are still certain to be charged (the rest of their
protected windows): a team cannot fund more protected time than its budget
holds. Keys compare level by level from the root, so two teams are ordered by
the ratios of the ancestors where their paths split.
"""

from __future__ import annotations

import math

from scheduler_core.snapshot import Snapshot
from scheduler_core.teams import OWN

Key = tuple[float, ...]


class PoolRanking:
    """Ratios of every team level in one pool, updated as the cycle admits funded work."""

    def __init__(self, snapshot: Snapshot, pool: str, now: float) -> None:
        tree = snapshot.teams
        self._tree = tree
        budget_rate = snapshot.capacity.get(pool, 0.0) * snapshot.window
        self._units: dict[str, float] = {}
        self._budget: dict[str, float] = {}
        self._levels: dict[str, tuple[str, ...]] = {}
        self._keys: dict[str, Key] = {}
        own_units: dict[str, float] = {
            name: snapshot.usage.get((name, pool), 0.0) for name in tree.teams
        }
        for allocation in snapshot.allocations:
            if allocation.pool == pool and allocation.funded and allocation.protected_until > now:
                own_units[allocation.team] += allocation.charge_rate * (
                    allocation.protected_until - now
                )
        for name in tree.teams:
            self._units[name] = sum(own_units[t] for t in tree.subtree(name))
            self._budget[name] = tree.share(name, pool) * budget_rate
            if tree.has_children(name):
                self._units[name + OWN] = own_units[name]
                self._budget[name + OWN] = tree.own_share(name, pool) * budget_rate
            self._levels[name] = tree.levels(name)

    def _ratio(self, level: str, extra: float = 0.0) -> float:
        budget = self._budget[level]
        if budget <= 0.0:
            return math.inf
        return (self._units[level] + extra) / budget

    def key(self, team: str, extra: float = 0.0) -> Key:
        """The team's position: ratios root first; ``extra`` units as if already charged."""
        if extra:
            return tuple(self._ratio(level, extra) for level in self._levels[team])
        found = self._keys.get(team)
        if found is None:
            found = self._keys[team] = tuple(self._ratio(level) for level in self._levels[team])
        return found

    def ratio(self, team: str) -> float:
        """The ratio that decides funding: the team's own (leaf) level."""
        return self._ratio(self._levels[team][-1])

    def can_fund(self, team: str, units: float) -> bool:
        """Is the team under its allocation with ``units`` more charged?"""
        return self._ratio(self._levels[team][-1], units) <= 1.0

    def charge(self, team: str, units: float) -> None:
        """Count ``units`` against the team and every level above it."""
        for level in self._levels[team]:
            self._units[level] += units
        self._keys.clear()
