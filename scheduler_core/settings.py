"""Every rule of the scheduling contract as one frozen settings object.

The defaults are the ones the scheduling contract in docs/architecture.md names;
`jupyterhub_config.py` and a scenario's ``policy`` object override them field by
field. Durations are seconds.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HOUR = 3600.0
DAY = 86400.0


class LegacyPreemption(enum.StrEnum):
    """Which preemptible sessions non-preemptible work may stop under the ``legacy`` baseline."""

    LIMIT = "limit"
    """Any: being within the team's limit is what counts."""
    PRIORITY = "priority"
    """Only those of strictly lower declared priority (Kubernetes priority classes)."""


class PlacementStrategy(enum.StrEnum):
    """How free slices are chosen (see placement.py)."""

    BEST_FIT = "best-fit"
    WORST_FIT = "worst-fit"
    FIRST_FIT = "first-fit"


@dataclass(frozen=True, slots=True)
class Settings:
    """The scheduler's knobs, each with its documented default."""

    name: str = "budget"
    """Policy name, looked up in the policy registry."""
    lookback: float = 7 * DAY
    """Sliding window over which charged usage counts towards the occupancy ratio."""
    max_min_runtime: float = 8 * HOUR
    """Cap on any request's protected minimum runtime."""
    default_min_runtime: float = 1 * HOUR
    """Minimum runtime of a request that names none (then capped by the class rules);
    a day slice shorter than this stops only sessions that resume (policy.py)."""
    debug_min_runtime: float = 15 * 60
    """Cap on the minimum runtime of `debug` requests; also the shortest day slice."""
    debug_max_gpus: int = 2
    """A debug request may hold at most this many GPU-equivalents."""
    unallocated_grace: float = 60.0
    """Unallocated sessions cannot be preempted during their first this-many seconds."""
    cycle_tick: float = 30.0
    """Seconds between periodic ticks (cycles also run on every event)."""
    budget_recheck: float = 300.0
    """A tick with nothing changed since the last cycle runs one only this often:
    with no event, only the slow drift of budgets over the window can change a decision."""
    starvation_bound: float = 2 * HOUR
    """A request pending longer than this gets a reservation."""
    max_reservations_per_pool: int = 1
    """At most this many reservations hold nodes in one pool at once. One by default:
    every hold drains nodes, and a second one cost more than it gave on the family of
    workloads up to 512 GPUs (the policy module's docstring, "One hold per pool")."""
    guaranteed_share: float = 1.0
    """A request is funded, whatever its team's budget over the window, while the
    team's funded sessions in the pool plus the request hold at most this multiple of
    the team's share of the pool (its allocation now); 0: only the window budget funds."""
    funded_burst: float = 1.25
    """Funding from the window budget stops where the team's funded sessions in the
    pool would hold more than this multiple of its share at once (a request bigger
    than that is funded only while the team has no other funded session there; with
    ``guaranteed_share`` on, the budget policy funds a request larger than the share
    from the team's last day instead, beside work within the share); 0: no cap. Work
    beyond it runs unallocated, on idle capacity. 1.25 rather than 1.5: at saturation a
    team's burst holds GPUs for its protected window that a team under its share then
    waits for; on bench.family, budget alone, paired against 1.5, the worst team's
    daily figure rose by 0.10 / 0.21 / 1.41 points on average (88 and 256 GPUs, seeds
    1-8 / 9-16; 1,024 GPUs, seeds 1-2) and work lost fell by 4-10 % (README, "Family")."""
    day_rank_weight: float = 0.3
    """Weight of a team's last day in its rank (rules 1 and 4), from 0 to 1: the rank
    ratio is (1 - w) x the window's ratio + w x the last day's (each: units charged,
    plus what running funded sessions are still certain to be charged, over the share
    of that span). Funding (rule 2) keeps the window's ratio alone. 0: the window
    alone. Why: the window ranks a team by its week, so one that ran hard earlier in
    the week stays behind for days, and while it is short it may stop no work of the
    teams ahead of it, even of teams over their share now. On bench.family, budget
    alone, paired against 0, runs within the bars rose 89 -> 95 / 89 -> 93 of 96 (88
    and 256 GPUs, seeds 1-8 / 9-16; README, "Family", "The last day in the rank")."""
    placement: PlacementStrategy = PlacementStrategy.BEST_FIT
    """Which free slices a request gets."""
    idle_release: float = 0.0
    """A funded session idle this long, past its protected window, may be stopped for a
    funded request of any team, not only of a team further under its share (its work
    is snapshotted, so little is lost); 0: never. Idle sessions are always the first
    victims among those a request may stop."""
    own_slice_after: float = 2 * HOUR
    """A job larger than its team's share that has waited this long beside other funded
    work of its team is funded from the team's day (as its only job would be) and may
    stop that work once all of it is resumable and past protection, while the team's
    later batch work waits unfunded behind it: the team time-slices itself. Its victims
    are resumable sessions only, its own team's or others' by the usual rules; 0: never."""
    fairshare_half_life: float = 7 * DAY
    """``fairshare`` baseline: usage loses half its weight after this long (Slurm's
    PriorityDecayHalfLife)."""
    fairshare_max_age: float = 7 * DAY
    """``fairshare`` baseline: waiting this long earns the full age factor (PriorityMaxAge)."""
    fairshare_age_weight: float = 0.1
    """``fairshare`` baseline: weight of the age factor next to the fair-share factor's 1
    (PriorityWeightAge / PriorityWeightFairshare; Slurm sites often use 1000 / 10000)."""
    legacy_preemption: LegacyPreemption = LegacyPreemption.PRIORITY
    """``legacy`` baseline: ``priority`` (default) lets non-preemptible work stop only
    preemptible sessions of strictly lower declared priority, as priority-class
    schedulers do (the seed's "before": debug p90 of hours); ``limit`` lets it stop any."""

    def capped_min_runtime(self, requested: float | None, klass: str) -> float:
        """The protected minimum runtime a request actually gets."""
        wanted = self.default_min_runtime if requested is None else requested
        cap = self.debug_min_runtime if klass == "debug" else self.max_min_runtime
        return max(0.0, min(wanted, cap, self.max_min_runtime))

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


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
