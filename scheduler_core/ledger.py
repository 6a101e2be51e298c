"""Charged usage per team and pool, queried over a sliding lookback window.

Each (team, pool) keeps its cumulative charge as a piecewise-linear function of
time (breakpoints where the charge rate changes, plus jumps for seeded history).
Usage over any window is then two binary searches, so a simulated month with
tens of thousands of cycles never re-sums its history. A cycle's view of the
window (`UsageLedger.window`) works a figure out only when the policy asks for it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar, overload

_T = TypeVar("_T")


@dataclass(slots=True)
class _Curve:
    times: list[float] = field(default_factory=list)
    cumulative: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    hint_window: int = 0
    """Where `at_hinted` last found a window's start (``which`` 0)."""
    hint_day: int = 0
    """Where `at_hinted` last found a day's start (``which`` 1, as `WindowUsage.since`).
    Two fields rather than a list of two: compiled, a field holds a plain integer."""

    def at_hinted(self, when: float, which: int) -> float:
        """`at`, for a time that moves forward from call to call (the start of a window
        that slides with the clock): found from where the last call with ``which`` found
        its time, a step or two on, rather than by a binary search of the whole curve.
        The same segment is found either way, so the same figure."""
        times = self.times
        last = len(times) - 1
        hint = self.hint_day if which else self.hint_window
        if hint <= last and times[hint] <= when:
            steps = 0
            while hint < last and times[hint + 1] <= when:
                hint += 1
                steps += 1
                if steps > 8:
                    hint = bisect_right(times, when, hint) - 1
                    break
        else:
            if last < 0 or when < times[0]:
                # Before the first change (a window reaching back before the run): no
                # search, which compiled is a call through Python.
                return 0.0
            hint = bisect_right(times, when) - 1
        if which:
            self.hint_day = hint
        else:
            self.hint_window = hint
        return self.cumulative[hint] + self.rates[hint] * (when - times[hint])

    def figures(self, start: float, end: float, day_start: float | None) -> tuple[float, float]:
        """Units charged in ``(start, end]`` and, with ``day_start``, in ``(day_start, end]``
        (else 0), the starts found by `at_hinted` (a ranking's window and last day)."""
        at_end = self.at(end)
        window = at_end - self.at_hinted(start, 0)
        if day_start is None:
            return window, 0.0
        return window, at_end - self.at_hinted(day_start, 1)

    def at(self, when: float) -> float:
        times = self.times
        if times and when >= times[-1]:
            i = len(times) - 1  # the common case: now, after the last change
        else:
            i = bisect_right(times, when) - 1
            if i < 0:
                return 0.0
        return self.cumulative[i] + self.rates[i] * (when - times[i])

    def rate(self) -> float:
        return self.rates[-1] if self.rates else 0.0

    def change(self, when: float, rate_delta: float, lump: float) -> None:
        if self.times and when < self.times[-1]:
            self._insert(when, rate_delta, lump)
            return
        base = self.at(when) + lump
        rate = self.rate() + rate_delta
        if abs(rate) < 1e-9:
            rate = 0.0
        if self.times and self.times[-1] == when:
            self.cumulative[-1] = base
            self.rates[-1] = rate
        else:
            self.times.append(when)
            self.cumulative.append(base)
            self.rates.append(rate)

    def _insert(self, when: float, rate_delta: float, lump: float) -> None:
        """A change before the last one (a Hub replaying sessions that overlapped):
        every later breakpoint moves by what the change adds up to it. Linear in the
        breakpoints after ``when``; the live and simulated paths only append."""
        i = bisect_right(self.times, when)
        if i > 0 and self.times[i - 1] == when:
            i -= 1
        else:
            before = i - 1
            base = self.at(when)
            rate = self.rates[before] if before >= 0 else 0.0
            self.times.insert(i, when)
            self.cumulative.insert(i, base)
            self.rates.insert(i, rate)
        for j in range(i, len(self.times)):
            self.cumulative[j] += lump + rate_delta * (self.times[j] - when)
            rate = self.rates[j] + rate_delta
            self.rates[j] = 0.0 if abs(rate) < 1e-9 else rate


class UsageLedger:
    """Charged units (GPU-seconds or core-seconds) per team and pool.

    Changes may arrive in any order (appending is the fast path); queries may ask any
    time.
    """

    def __init__(self) -> None:
        self._curves: dict[tuple[str, str], _Curve] = {}
        self._horizon = -math.inf
        """The latest end of a window handed out."""
        self.revision = 0
        """Goes up with every change that reaches back into a window handed out."""
        self._snapshot: tuple[dict[tuple[str, str], _Curve], dict[str, dict[str, _Curve]]]
        self._snapshot = ({}, {})
        """The curves as a window sees them, and the same per pool and team: made again only
        when a pair is first charged (curves are only ever added), never changed."""

    def _curve(self, team: str, pool: str, when: float, lump: float) -> _Curve:
        if when < self._horizon or (lump and when <= self._horizon):
            self.revision += 1
        key = (team, pool)
        curve = self._curves.get(key)
        if curve is None:
            curve = self._curves[key] = _Curve()
        return curve

    def start_charging(self, team: str, pool: str, when: float, rate: float) -> None:
        """From ``when`` on, the team is charged ``rate`` more units per second."""
        self._curve(team, pool, when, 0.0).change(when, rate, 0.0)

    def stop_charging(self, team: str, pool: str, when: float, rate: float) -> None:
        """From ``when`` on, the team is charged ``rate`` fewer units per second."""
        self._curve(team, pool, when, 0.0).change(when, -rate, 0.0)

    def add(self, team: str, pool: str, when: float, units: float) -> None:
        """Record ``units`` already used, all at time ``when`` (seeded history)."""
        self._curve(team, pool, when, units).change(when, 0.0, units)

    def charged(self, team: str, pool: str, start: float, end: float) -> float:
        """Units charged in the window ``(start, end]``."""
        curve = self._curves.get((team, pool))
        if curve is None:
            return 0.0
        return curve.at(end) - curve.at(start)

    def rate(self, team: str, pool: str) -> float:
        """The charge rate in force after the last change."""
        curve = self._curves.get((team, pool))
        return curve.rate() if curve is not None else 0.0

    def keys(self) -> list[tuple[str, str]]:
        return list(self._curves)

    def copy(self, since: float = -math.inf) -> UsageLedger:
        """A ledger that answers as this one for windows starting at ``since`` or later
        (a forecast runs a copy forward: `scheduler_core.forecast`); older breakpoints
        are left out, so the copy costs what the window holds."""
        out = UsageLedger()
        for key, curve in self._curves.items():
            first = max(0, bisect_right(curve.times, since) - 1)
            out._curves[key] = _Curve(
                curve.times[first:], curve.cumulative[first:], curve.rates[first:]
            )
        return out

    def window(self, start: float, end: float) -> WindowUsage:
        """Units charged per (team, pool) in ``(start, end]``, for every pair charged so far.

        Its figures stay right while `revision` does not change."""
        self._horizon = max(self._horizon, end)
        curves, pools = self._snapshot
        if len(curves) != len(self._curves):
            curves = dict(self._curves)
            pools = {}
            for (team, pool), curve in curves.items():
                pools.setdefault(pool, {})[team] = curve
            self._snapshot = (curves, pools)
        return WindowUsage(curves, start, end, self.revision, pools)


_NO_CURVES: Final[dict[str, _Curve]] = {}
"""A pool no team was charged in (never changed)."""


class WindowUsage(Mapping[tuple[str, str], float]):
    """Charged units per (team, pool) in one window, each worked out on first look.

    Changes to the ledger come at or after the latest time it holds, so those
    made after the window's end leave its figures as they were.
    """

    def __init__(
        self,
        curves: dict[tuple[str, str], _Curve],
        start: float,
        end: float,
        revision: int = 0,
        pools: dict[str, dict[str, _Curve]] | None = None,
    ) -> None:
        self._curves = curves
        self._pools = pools
        """``curves`` per pool and team (made on first need if not given)."""
        self._start = start
        self._end = end
        self._known: dict[tuple[str, str], float] = {}
        self._since: dict[float, dict[str, dict[str, float]]] = {}
        """`since` figures by start, pool and team."""
        self._since_start = math.nan
        """The start `since` was last asked for (NaN: none yet, and equal to no start)."""
        self._since_last: dict[str, dict[str, float]] = {}
        """``_since[_since_start]``."""
        self.revision = revision
        """The ledger's revision when this was made."""

    def __getitem__(self, key: tuple[str, str]) -> float:
        found = self._known.get(key)
        if found is None:
            curve = self._curves[key]
            found = self._known[key] = curve.at(self._end) - curve.at(self._start)
        return found

    @overload
    def get(self, key: tuple[str, str], /) -> float | None: ...

    @overload
    def get(self, key: tuple[str, str], default: float, /) -> float: ...

    @overload
    def get(self, key: tuple[str, str], default: _T, /) -> float | _T: ...

    def get(self, key: tuple[str, str], default: object = None, /) -> object:
        if key not in self._curves:
            return default
        return self[key]

    def of_pool(self, pool: str, teams: Iterable[str]) -> dict[str, float]:
        """Each team's figure in the pool (0 for a team never charged there)."""
        known = self._known
        curves = self._curves
        start, end = self._start, self._end
        out: dict[str, float] = {}
        for team in teams:
            key = (team, pool)
            found = known.get(key)
            if found is None:
                curve = curves.get(key)
                if curve is None:
                    out[team] = 0.0
                    continue
                times = curve.times
                last = len(times) - 1
                # `_Curve.at` twice, inline: this runs for every team in every cycle.
                if times[last] <= end:
                    at_end = curve.cumulative[last] + curve.rates[last] * (end - times[last])
                else:
                    at_end = curve.at(end)
                found = known[key] = at_end - curve.at(start)
            out[team] = found
        return out

    def since(self, key: tuple[str, str], start: float) -> float:
        """Units charged to ``key`` in ``(start, end]``: a shorter window's figure, from the
        same curves (0 for a pair never charged). Kept once worked out: the ranking and
        every day-slice test of a cycle ask for the same last day."""
        team, pool = key
        return self._since_of(self._since_pool(pool, start), team, pool, start)

    def since_sum(self, teams: Iterable[str], pool: str, start: float) -> float:
        """``sum(self.since((t, pool), start) for t in teams)``, added in the same order
        from 0 (so to the same float), with no key made per team."""
        known = self._since_pool(pool, start)
        total = 0.0
        for team in teams:
            total = total + self._since_of(known, team, pool, start)
        return total

    def _since_pool(self, pool: str, start: float) -> dict[str, float]:
        """The `since` figures kept for ``start`` and ``pool``, per team. Why by start,
        then pool, then team, and the last start's apart: every key then hashes as it
        is (a string's hash is kept, a tuple's is worked out on every look-up), and the
        start is nearly always the last one's."""
        if start == self._since_start:
            by_pool = self._since_last
        else:
            found = self._since.get(start)
            if found is None:
                found = self._since[start] = {}
            by_pool = self._since_last = found
            self._since_start = start
        known = by_pool.get(pool)
        if known is None:
            known = by_pool[pool] = {}
        return known

    def _since_of(self, known: dict[str, float], team: str, pool: str, start: float) -> float:
        found = known.get(team)
        if found is None:
            curve = self.pool_curves(pool).get(team)
            if curve is None:
                # Never charged: the window's curves are a snapshot, so it stays so.
                known[team] = 0.0
                return 0.0
            # The start asked for is nearly always the last day's, as the ranking's.
            found = known[team] = curve.at(self._end) - curve.at_hinted(start, 1)
        return found

    def pool_curves(self, pool: str) -> dict[str, _Curve]:
        """The pool's curves by team (for `_Curve.figures`; never change them)."""
        pools = self._pools
        if pools is None:
            pools = self._pools = {}
            for (team, name), curve in self._curves.items():
                pools.setdefault(name, {})[team] = curve
        return pools.get(pool, _NO_CURVES)

    def since_of_pool(self, pool: str, teams: Iterable[str], start: float) -> dict[str, float]:
        """`since` for each team in the pool (0 for a team never charged there)."""
        since = self.since
        return {team: since((team, pool), start) for team in teams}

    @property
    def end(self) -> float:
        return self._end

    @property
    def start(self) -> float:
        return self._start

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._curves)

    def __len__(self) -> int:
        return len(self._curves)

    def __repr__(self) -> str:
        return f"WindowUsage({dict(self)!r})"
