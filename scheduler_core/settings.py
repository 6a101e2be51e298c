"""Every rule of the scheduling contract as one frozen settings object.

The rules they tune are those of the scheduling contract in docs/architecture.md
(cited by rule ID); docs/configuration.md lists them, generated from this class by
spawner/hub/configdoc.py. `jupyterhub_config.py` and a scenario's ``policy`` object
override them field by field. Durations are seconds.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

HOUR: Final = 3600.0
DAY: Final = 86400.0


class LegacyPreemption(enum.StrEnum):
    """Which preemptible sessions non-preemptible work may stop under the ``legacy`` baseline."""

    LIMIT = "limit"
    """Any: being within the team's limit is what counts."""
    PRIORITY = "priority"
    """Only those of strictly lower declared priority (Kubernetes priority classes)."""


class PlacementStrategy(enum.StrEnum):
    """How free slices are chosen (capacity.py, rule R3)."""

    BEST_FIT = "best-fit"
    WORST_FIT = "worst-fit"
    FIRST_FIT = "first-fit"


@dataclass(frozen=True, slots=True)
class Settings:
    """The scheduler's knobs, each with its documented default."""

    name: str = "budget"
    """The policy, by its name in the registry: ``budget``, or a baseline (``legacy``,
    ``fairshare``, ``quota``, ``fifo``)."""
    lookback: float = 7 * DAY
    """Sliding window of charged usage behind a team's occupancy ratio (rules R1, R2)."""
    max_min_runtime: float = 8 * HOUR
    """Cap on any request's protected minimum runtime; also what stopping a gang counts
    as costing, at its size (S8), and the cap on a stopped debug session's doubled
    protection (S2)."""
    default_min_runtime: float = 1 * HOUR
    """Minimum runtime of a request that names none (then capped by its class); a day
    slice shorter than this stops only sessions that resume (S5)."""
    debug_min_runtime: float = 15 * 60
    """Cap on the minimum runtime of ``debug`` requests (S1); also the shortest day
    slice (S5)."""
    debug_max_gpus: int = 2
    """GPU-equivalents a debug request may hold; a larger one is refused."""
    unallocated_grace: float = 60.0
    """An unallocated session is not preempted during its first this-many seconds (R4)."""
    cycle_tick: float = 30.0
    """Seconds between periodic ticks; cycles also run on every event."""
    budget_recheck: float = 300.0
    """A tick with nothing changed since the last cycle runs one only this often: with
    no event, only the slow drift of budgets over the window can change a decision."""
    starvation_bound: float = 2 * HOUR
    """A funded request waiting longer than this holds nodes (R7)."""
    max_reservations_per_pool: int = 1
    """Holds at once in one pool (R7)."""
    guaranteed_share: float = 1.0
    """A request is funded, whatever its team's window budget, while the team's funded
    sessions in the pool plus the request hold at most this multiple of the team's
    share (R2); jobs larger than it run in day slices (S5); 0: only the window budget
    funds, and there are no day slices."""
    funded_burst: float = 1.25
    """The window budget funds a team's sessions in a pool up to this multiple of its
    share at once, unless the request is the team's only funded session there (R2);
    0: no cap."""
    day_rank_weight: float = 0.3
    """Weight, from 0 to 1, of a team's last day in its rank (R1, and R4's rank test):
    (1 - w) x the window's ratio + w x the last day's. Funding keeps the window's ratio
    alone (R2); 0: the window alone."""
    placement: PlacementStrategy = PlacementStrategy.BEST_FIT
    """Which free slices a request gets (R3): ``best-fit``, ``worst-fit`` or
    ``first-fit``."""
    idle_release: float = 0.0
    """A funded session idle this long, and past its protected window, may be stopped
    for a funded request of any team (R4; it is snapshotted); 0: never."""
    own_slice_after: float = 2 * HOUR
    """A job larger than its team's share that has waited this long beside other funded
    work of its team is funded from the team's day and may stop that work once all of
    it resumes (S6); 0: never."""
    fairshare_half_life: float = 7 * DAY
    """``fairshare`` baseline: usage loses half its weight after this long (Slurm's
    PriorityDecayHalfLife)."""
    fairshare_max_age: float = 7 * DAY
    """``fairshare`` baseline: waiting this long earns the full age factor (PriorityMaxAge)."""
    fairshare_age_weight: float = 0.1
    """``fairshare`` baseline: weight of the age factor next to the fair-share factor's 1
    (PriorityWeightAge / PriorityWeightFairshare; Slurm sites often use 1000 / 10000)."""
    legacy_preemption: LegacyPreemption = LegacyPreemption.PRIORITY
    """``legacy`` baseline: ``priority`` lets non-preemptible work stop only preemptible
    sessions of strictly lower declared priority, as priority-class schedulers do;
    ``limit`` lets it stop any."""

    def capped_min_runtime(self, requested: float | None, klass: str) -> float:
        """The protected minimum runtime a request actually gets."""
        wanted = self.default_min_runtime if requested is None else requested
        cap = self.debug_min_runtime if klass == "debug" else self.max_min_runtime
        return max(0.0, min(wanted, cap, self.max_min_runtime))

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


BOUNDS: Mapping[str, tuple[float, float]] = MappingProxyType(
    {"lookback": (HOUR, 365 * DAY), "max_min_runtime": (60.0, 7 * DAY)}
)
"""What these settings may be on a running Hub, in seconds (inclusive), whether the
configuration or an admin sets them: a lookback window of an hour to a year; a cap on
the protected minimum runtime of a minute to a week (0 would protect nothing and make
every promise of the spawn form untrue). Scenarios for the simulator are not bound."""


def _span(seconds: float) -> str:
    """``1 min``, ``1 h``, ``7 d``: a bound as a person reads it."""
    for unit, size in (("d", DAY), ("h", HOUR), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def bound_fault(key: str, seconds: float) -> str | None:
    """Why ``seconds`` is outside ``key``'s `BOUNDS` (None: within them, or unbound)."""
    if key not in BOUNDS:
        return None
    low, high = BOUNDS[key]
    if low <= seconds <= high:  # NaN fails this
        return None
    return (
        f"must be between {_span(low)} and {_span(high)} ({low:g} s to {high:g} s), "
        f"not {seconds:g} s"
    )


COUNT_FIELDS = frozenset({"debug_max_gpus", "max_reservations_per_pool"})
"""Settings that are whole numbers."""
WEIGHT_FIELDS = frozenset({"fairshare_age_weight", "guaranteed_share", "funded_burst"})
"""Settings that are plain non-negative numbers; every other numeric setting is a duration."""
FRACTION_FIELDS = frozenset({"day_rank_weight"})
"""Settings that are numbers from 0 to 1."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*$")
_UNIT = {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": HOUR, "d": DAY, "w": 7 * DAY}


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"8h"``, ``"7d"`` or ``"2w"``.

    Raises ValueError with the reason when the text is not a duration.
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"{text!r} is negative")
        return float(text)
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (use e.g. 90, 90s, 15m, 8h, 7d)")
    return float(match.group(1)) * _UNIT[match.group(2)]


class SettingError(ValueError):
    """A setting that does not exist or a value it cannot take."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


SETTING_NAMES = tuple(f.name for f in dataclasses.fields(Settings))


def settings_from_mapping(values: Mapping[str, Any], base: Settings | None = None) -> Settings:
    """Settings from a scenario's ``policy`` object, field by field over ``base``.

    Duration fields accept numbers of seconds or strings such as ``"7d"``.
    Raises SettingError naming the key for an unknown setting or a bad value.
    """
    base = base or Settings()
    changes: dict[str, Any] = {}
    for key, raw in values.items():
        if key not in SETTING_NAMES:
            raise SettingError(key, f"unknown setting (known: {', '.join(SETTING_NAMES)})")
        try:
            changes[key] = _setting_value(key, raw)
        except ValueError as error:
            raise SettingError(key, str(error)) from None
    return base.replace(**changes)


def _setting_value(key: str, raw: Any) -> Any:
    if key == "placement":
        choices = ", ".join(p.value for p in PlacementStrategy)
        if raw not in {p.value for p in PlacementStrategy}:
            raise ValueError(f"{raw!r} is not one of {choices}")
        return PlacementStrategy(raw)
    if key == "legacy_preemption":
        choices = ", ".join(p.value for p in LegacyPreemption)
        if raw not in {p.value for p in LegacyPreemption}:
            raise ValueError(f"{raw!r} is not one of {choices}")
        return LegacyPreemption(raw)
    if key == "name":
        if not isinstance(raw, str) or not raw:
            raise ValueError(f"{raw!r} is not a policy name")
        return raw
    if key in COUNT_FIELDS:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise ValueError(f"{raw!r} is not a whole number >= 0")
        return raw
    if key in WEIGHT_FIELDS:
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw < math.inf:
            raise ValueError(f"{raw!r} is not a number >= 0")
        return float(raw)
    if key in FRACTION_FIELDS:
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw <= 1:
            raise ValueError(f"{raw!r} is not a number from 0 to 1")
        return float(raw)
    return parse_duration(raw)


def setting_from_text(key: str, text: str) -> Any:
    """The value of setting ``key`` written as command-line text (``7d``, ``2``, ``best-fit``).

    Raises SettingError naming the key for an unknown setting or a bad value.
    """
    if key not in SETTING_NAMES:
        raise SettingError(key, f"unknown setting (known: {', '.join(SETTING_NAMES)})")
    raw: Any = text.strip()
    try:
        if key in COUNT_FIELDS:
            if not raw.isdigit():
                raise ValueError(f"{text!r} is not a whole number >= 0")
            raw = int(raw)
        elif key in WEIGHT_FIELDS or key in FRACTION_FIELDS:
            try:
                raw = float(raw)
            except ValueError:
                wanted = ">= 0" if key in WEIGHT_FIELDS else "from 0 to 1"
                raise ValueError(f"{text!r} is not a number {wanted}") from None
        return _setting_value(key, raw)
    except ValueError as error:
        raise SettingError(key, str(error)) from None
