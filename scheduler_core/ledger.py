"""Charged usage per team and pool, queried over a sliding lookback window.

Each (team, pool) keeps its cumulative charge as a piecewise-linear function of
time (breakpoints where the charge rate changes, plus jumps for seeded history).
Usage over any window is then two binary searches, so a simulated month with
tens of thousands of cycles never re-sums its history.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Curve:
    times: list[float] = field(default_factory=list)
    cumulative: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)

    def at(self, when: float) -> float:
        i = bisect_right(self.times, when) - 1
        if i < 0:
            return 0.0
        return self.cumulative[i] + self.rates[i] * (when - self.times[i])

    def rate(self) -> float:
        return self.rates[-1] if self.rates else 0.0

    def change(self, when: float, rate_delta: float, lump: float) -> None:
        if self.times and when < self.times[-1]:
            raise ValueError(f"usage at {when} comes before usage at {self.times[-1]}")
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


class UsageLedger:
    """Charged units (GPU-seconds or core-seconds) per team and pool.

    Changes must arrive in time order per (team, pool); queries may ask any time.
    """

    def __init__(self) -> None:
        self._curves: dict[tuple[str, str], _Curve] = {}

    def _curve(self, team: str, pool: str) -> _Curve:
        key = (team, pool)
        curve = self._curves.get(key)
        if curve is None:
            curve = self._curves[key] = _Curve()
        return curve

    def start_charging(self, team: str, pool: str, when: float, rate: float) -> None:
        """From ``when`` on, the team is charged ``rate`` more units per second."""
        self._curve(team, pool).change(when, rate, 0.0)

    def stop_charging(self, team: str, pool: str, when: float, rate: float) -> None:
        """From ``when`` on, the team is charged ``rate`` fewer units per second."""
        self._curve(team, pool).change(when, -rate, 0.0)

    def add(self, team: str, pool: str, when: float, units: float) -> None:
        """Record ``units`` already used, all at time ``when`` (seeded history)."""
        self._curve(team, pool).change(when, 0.0, units)

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
