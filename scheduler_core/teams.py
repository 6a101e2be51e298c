"""The team hierarchy: effective shares, paths from the root, and own shares.

A top-level team's share is a fraction of a pool's capacity; a sub-team's share
is a fraction of its parent's. A parent team that also submits work of its own
keeps the part of its share its children do not hold ("own share"), so that its
own requests compete with its children at the level where their paths split.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler_core.model import Team

SHARE_MIN: Final = 0.001
"""The smallest share other than 0 a team may have, from the configuration or an admin
(0.1 % of a pool): a smaller one funds nothing a session could use and makes the team's
ratio astronomical (a share of 1e-300 printed a 300-digit percentage)."""


def share_fault(value: Any) -> str | None:
    """Why ``value`` cannot be a team's share of a pool: it must be 0 (none) or from
    `SHARE_MIN` to 1 (None: it can)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, not {value!r}"
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        return f"must be between 0 and 1, not {value!r}"
    if 0.0 < value < SHARE_MIN:
        return f"must be 0 or at least {SHARE_MIN:g} (a thousandth of the pool), not {value!r}"
    return None


OWN: Final = "#own"
"""Suffix of the virtual leaf that stands for a parent team's own work."""


@dataclass(frozen=True)
class TeamTree:
    """Teams by name with derived shares. Built once per configuration change."""

    teams: Mapping[str, Team]
    children: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    _shares: dict[tuple[str, str], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """(team, pool) → share, worked out on first ask: the policy asks for shares and
    own shares about 2.7 million times on a simulated month, and the tree never
    changes once built."""
    _own: dict[tuple[str, str], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """(team, pool) → own share, kept as `_shares` is."""
    _ancestors: dict[str, tuple[str, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """Team → `ancestors`, kept as `_shares` is (the day slices ask per session)."""
    _subtrees: dict[str, tuple[str, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """Team → `subtree`, kept as `_shares` is."""

    @classmethod
    def build(cls, teams: Iterable[Team]) -> TeamTree:
        by_name = {t.name: t for t in teams}
        children: dict[str, list[str]] = {name: [] for name in by_name}
        for team in by_name.values():
            if team.parent is not None:
                children[team.parent].append(team.name)
        return cls(by_name, {k: tuple(sorted(v)) for k, v in children.items()})

    def ancestors(self, name: str) -> tuple[str, ...]:
        """The team's path from its top-level ancestor down to itself."""
        found = self._ancestors.get(name)
        if found is None:
            path = [name]
            parent = self.teams[name].parent
            while parent is not None:
                path.append(parent)
                parent = self.teams[parent].parent
            found = self._ancestors[name] = tuple(reversed(path))
        return found

    def share(self, name: str, pool: str) -> float:
        """The team's fraction of the pool's capacity, children's part included."""
        key = (name, pool)
        found = self._shares.get(key)
        if found is None:
            team = self.teams[name]
            found = team.share.get(pool, 0.0)
            if team.parent is not None:
                found *= self.share(team.parent, pool)
            self._shares[key] = found
        return found

    def own_share(self, name: str, pool: str) -> float:
        """The fraction of the pool that funds the team's own requests (for a team
        without sub-teams, its share)."""
        key = (name, pool)
        found = self._own.get(key)
        if found is None:
            found = self.share(name, pool)
            if self.children[name]:
                given = sum(self.teams[c].share.get(pool, 0.0) for c in self.children[name])
                found *= max(0.0, 1.0 - given)
            self._own[key] = found
        return found

    def has_children(self, name: str) -> bool:
        return bool(self.children[name])

    def levels(self, name: str) -> tuple[str, ...]:
        """Names whose ratios order the team's requests, root first.

        A parent's own work gets an extra level (``name#own``) so that it is
        compared with its children on the children's level.
        """
        path = self.ancestors(name)
        return path + (name + OWN,) if self.has_children(name) else path

    def subtree(self, name: str) -> tuple[str, ...]:
        """The team and all its descendants."""
        kept = self._subtrees.get(name)
        if kept is None:
            found = [name]
            for child in self.children[name]:
                found.extend(self.subtree(child))
            kept = self._subtrees[name] = tuple(found)
        return kept
