"""Session profiles and the spawn form: what a researcher may ask for, checked.

Pure: no JupyterHub, no Docker. The spawner hands ``resolve`` the user's
options (from the form or straight from the REST API, which nobody has to
fill in honestly) and gets back a ``SessionSpec`` or a ``FormError`` naming
the field and the reason, which the spawner shows as a refusal.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from scheduler_core.model import MILLI, RequestClass, mig_weight
from scheduler_core.settings import Settings, parse_duration

MAX_PRIORITY = 100
"""Declared priority runs 0..MAX_PRIORITY; it orders only a team's own queue."""


class FormError(ValueError):
    """A spawn option the user may not have: ``field`` names it, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SliceOption:
    """One choice of GPU slices in a profile: whole GPUs, a MIG instance, a fraction, or none."""

    slug: str
    display_name: str
    gpus: int = 0
    mig: str | None = None
    gpu_milli: int = 0

    @property
    def gpu_weight(self) -> float:
        if self.mig is not None:
            return mig_weight(self.mig)
        if self.gpu_milli:
            return self.gpu_milli / MILLI
        return float(self.gpus)


@dataclass(frozen=True, slots=True)
class Profile:
    slug: str
    display_name: str
    klass: RequestClass
    pool: str
    image: str
    cpus: float
    memory_gib: float
    slices: tuple[SliceOption, ...]
    min_runtime: float
    """Default minimum runtime (protected time when funded), seconds."""
    max_min_runtime: float
    """The most a user may ask for with this profile, seconds."""
    resumable: bool = False
    description: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    storage: tuple[str, ...] = ()
    """Storage names a data-prep session may be placed next to (one is chosen)."""


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """A checked spawn request: everything the scheduler and the container builder need."""

    profile: Profile
    slices: SliceOption
    team: str
    priority: int
    min_runtime: float
    storage: str | None

    @property
    def labels(self) -> Mapping[str, str]:
        labels = dict(self.profile.labels)
        if self.storage is not None:
            labels["storage"] = self.storage
        return MappingProxyType(labels)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise FormError(where, f"must be a non-empty string, not {value!r}")
    return value


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise FormError(where, f"must be a positive number, not {value!r}")
    if not math.isfinite(value):
        raise FormError(where, f"must be finite, not {value!r}")
    return float(value)


def _duration(value: Any, where: str) -> float:
    try:
        return parse_duration(value)
    except (ValueError, TypeError) as error:
        raise FormError(where, str(error)) from None


def _slice_option(raw: Any, where: str) -> SliceOption:
    if not isinstance(raw, Mapping):
        raise FormError(where, f"must be an object, not {raw!r}")
    unknown = set(raw) - {"slug", "display_name", "gpus", "mig", "gpu_fraction"}
    if unknown:
        raise FormError(f"{where}.{sorted(unknown)[0]}", "unknown key")
    gpus = raw.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise FormError(f"{where}.gpus", f"must be a whole number >= 0, not {gpus!r}")
    mig = raw.get("mig")
    if mig is not None:
        try:
            mig_weight(_text(mig, f"{where}.mig"))
        except ValueError as error:
            raise FormError(f"{where}.mig", str(error)) from None
    fraction = raw.get("gpu_fraction", 0)
    milli = 0
    if fraction:
        fraction = _positive(fraction, f"{where}.gpu_fraction")
        if fraction >= 1:
            raise FormError(f"{where}.gpu_fraction", "must be below 1 (use gpus for whole GPUs)")
        milli = round(fraction * MILLI)
    if sum(1 for chosen in (gpus, mig, milli) if chosen) > 1:
        raise FormError(where, "give one of gpus, mig or gpu_fraction")
    if mig is not None:
        default_slug, default_name = f"mig-{mig}", f"one {mig} MIG instance"
    elif milli:
        default_slug, default_name = f"gpu-{milli}m", f"{milli / MILLI:g} of a GPU"
    elif gpus:
        default_slug, default_name = f"{gpus}", f"{gpus} GPU{'s' if gpus > 1 else ''}"
    else:
        default_slug, default_name = "cpu", "no GPU"
    slug = _text(raw.get("slug", default_slug), f"{where}.slug")
    name = _text(raw.get("display_name", default_name), f"{where}.display_name")
    return SliceOption(slug, name, gpus, mig, milli)


_PROFILE_KEYS = frozenset(
    {"slug", "display_name", "description", "class", "pool", "image", "cpus", "memory_gib"}
    | {"slices", "gpus", "min_runtime", "max_min_runtime", "resumable", "labels", "storage"}
)


def parse_profiles(raw: Sequence[Any], settings: Settings, pools: Iterable[str]) -> list[Profile]:
    """Profiles from ``BudgetSpawner.profile_list`` entries; FormError names a bad key.

    ``gpus: [1, 2, 4]`` is shorthand for whole-GPU slice options.
    """
    known_pools = set(pools)
    profiles: list[Profile] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"profile_list[{i}]"
        if not isinstance(item, Mapping):
            raise FormError(where, f"must be an object, not {item!r}")
        unknown = set(item) - _PROFILE_KEYS
        if unknown:
            raise FormError(f"{where}.{sorted(unknown)[0]}", "unknown key")
        slug = _text(item.get("slug"), f"{where}.slug")
        if slug in seen:
            raise FormError(f"{where}.slug", f"profile {slug!r} is defined twice")
        seen.add(slug)
        profiles.append(_parse_profile(item, slug, where, settings, known_pools))
    if not profiles:
        raise FormError("profile_list", "offers no profile")
    return profiles


def _parse_profile(
    item: Mapping[str, Any], slug: str, where: str, settings: Settings, known_pools: set[str]
) -> Profile:
    """One ``profile_list`` entry (its keys known, its slug unique) as a Profile."""
    klass_text = item.get("class", "interactive")
    if klass_text not in {c.value for c in RequestClass}:
        choices = ", ".join(c.value for c in RequestClass)
        raise FormError(f"{where}.class", f"must be one of {choices}, not {klass_text!r}")
    klass = RequestClass(klass_text)
    pool = _text(item.get("pool"), f"{where}.pool")
    if pool not in known_pools:
        raise FormError(f"{where}.pool", f"unknown pool {pool!r}")
    slices = _profile_slices(item, where)
    max_min, default_min = _profile_runtimes(item, where, settings, klass, slices)
    labels = item.get("labels", {})
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise FormError(f"{where}.labels", "must map strings to strings")
    storage = item.get("storage", [])
    if isinstance(storage, str):
        storage = [storage]
    storage = tuple(_text(s, f"{where}.storage") for s in storage)
    return Profile(
        slug=slug,
        display_name=_text(item.get("display_name", slug), f"{where}.display_name"),
        description=str(item.get("description", "")),
        klass=klass,
        pool=pool,
        image=_text(item.get("image"), f"{where}.image"),
        cpus=_positive(item.get("cpus", 1), f"{where}.cpus"),
        memory_gib=_positive(item.get("memory_gib", 4), f"{where}.memory_gib"),
        slices=slices,
        min_runtime=default_min,
        max_min_runtime=max_min,
        resumable=bool(item.get("resumable", False)),
        labels=MappingProxyType(dict(labels)),
        storage=storage,
    )


def _profile_slices(item: Mapping[str, Any], where: str) -> tuple[SliceOption, ...]:
    """A profile's slice options (``gpus: [n]`` as whole-GPU ones); none: a CPU session."""
    raw_slices = list(item.get("slices", []))
    raw_slices += [{"gpus": n} for n in item.get("gpus", [])]
    slices = tuple(
        _slice_option(option, f"{where}.slices[{j}]") for j, option in enumerate(raw_slices)
    ) or (SliceOption("cpu", "no GPU"),)
    if len({s.slug for s in slices}) != len(slices):
        raise FormError(f"{where}.slices", "two options share a slug")
    return slices


def _profile_runtimes(
    item: Mapping[str, Any],
    where: str,
    settings: Settings,
    klass: RequestClass,
    slices: tuple[SliceOption, ...],
) -> tuple[float, float]:
    """(the cap on a minimum runtime, the default minimum runtime) of a profile, under the
    scheduler's caps; a debug profile is also held to the debug caps."""
    max_min = _duration(item.get("max_min_runtime", settings.max_min_runtime), where)
    max_min = min(max_min, settings.max_min_runtime)
    if klass is RequestClass.DEBUG:
        max_min = min(max_min, settings.debug_min_runtime)
        too_big = [s.slug for s in slices if s.gpu_weight > settings.debug_max_gpus]
        if too_big:
            raise FormError(
                f"{where}.slices",
                f"a debug profile offers at most {settings.debug_max_gpus} GPUs "
                f"({', '.join(too_big)} is more)",
            )
    default_min = _duration(
        item.get("min_runtime", min(settings.default_min_runtime, max_min)),
        f"{where}.min_runtime",
    )
    if default_min > max_min:
        raise FormError(
            f"{where}.min_runtime", f"{default_min:g}s is over the profile's cap {max_min:g}s"
        )
    return max_min, default_min


def capped(profiles: Iterable[Profile], cap: float) -> list[Profile]:
    """The profiles under the ``max_min_runtime`` the scheduler runs with now (an admin may
    have lowered the configured one): the form states this cap, and a longer runtime is
    refused naming it, rather than promised and cut short by the scheduler."""
    return [
        replace(p, max_min_runtime=min(p.max_min_runtime, cap), min_runtime=min(p.min_runtime, cap))
        for p in profiles
    ]


SHOWN_CHARS = 80
"""How much of a value a refusal (and so the log) repeats."""


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``value`` as a refusal quotes it: its repr, cut after ``limit`` characters with
    how long it was (``'xxxx…' (5000 characters)``), so that a 5,000-character name
    sent to the REST API comes back, and reaches the log, short."""
    if isinstance(value, str) and len(value) > limit:
        text = repr(value[:limit])
        return f"{text[:-1]}…{text[-1]} ({len(value)} characters)"
    text = repr(value)
    if len(text) > limit:
        return f"{text[:limit]}… ({len(text)} characters)"
    return text


def _kind(value: Any) -> str:
    """What a value of the wrong type is, in words: ``a mapping``, ``a number (5)``."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple | set):
        return "a list"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({shown(value)})"
    if isinstance(value, str):
        return f"the text {shown(value)}"
    return f"a {type(value).__name__}"


def _one(options: Mapping[str, Any], key: str) -> Any:
    """A form field arrives as a list of strings; the REST API may send a plain value.
    JSON null is no choice (the default), like an empty form field."""
    value = options.get(key)
    if isinstance(value, list):
        if len(value) != 1:
            raise FormError(key, f"expected one value, got {len(value)}")
        return value[0]
    return value


def _name(value: Any, key: str) -> str | None:
    """A name the user chose (a profile, a slice option, a team, a storage), or None for
    no choice; a value of another type is refused naming the field."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise FormError(key, f"must be a string, not {_kind(value)}")
    return value


def _whole(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise FormError(key, f"must be a whole number, not {_kind(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise FormError(key, f"must be a whole number, not {shown(value)}")


def _runtime(value: Any, key: str) -> float:
    """A minimum runtime the user asked for: seconds, or text such as ``15m`` or ``2h``."""
    example = "e.g. 90, 15m, 2h"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise FormError(key, f"must be a duration ({example}), not {_kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise FormError(key, f"must be a finite duration, not {value!r}")
    if not isinstance(value, str) and value < 0:
        raise FormError(key, f"must not be negative, not {shown(value)}")
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError):
        raise FormError(key, f"{shown(value)} is not a duration ({example})") from None
    if not math.isfinite(seconds):
        raise FormError(key, f"must be a finite duration, not {shown(value)}")
    return seconds


def _option_name(key: str) -> str:
    """An unknown option's name as a refusal names it: as sent if short and plain."""
    if len(key) <= SHOWN_CHARS and key.isprintable():
        return key
    return shown(key)


FORM_FIELDS = frozenset({"profile", "slices", "gpus", "team", "priority", "min_runtime", "storage"})


def resolve(
    options: Mapping[str, Any],
    profiles: Sequence[Profile],
    user_teams: Sequence[str],
) -> SessionSpec:
    """Check a user's spawn options against the profiles and the user's teams.

    ``gpus`` may stand for a whole-GPU slice option (``{"gpus": 4}``). With no
    ``team``, a user in exactly one team pays with it. Raises FormError.
    """
    unknown = set(options) - FORM_FIELDS
    if unknown:
        raise FormError(_option_name(sorted(unknown)[0]), "is not a spawn option")
    by_slug = {p.slug: p for p in profiles}
    slug = _name(_one(options, "profile"), "profile") or profiles[0].slug
    if slug not in by_slug:
        raise FormError("profile", f"unknown profile {shown(slug)} (offered: {', '.join(by_slug)})")
    profile = by_slug[slug]
    chosen = _chosen_slice(options, profile)
    team = _paying_team(options, user_teams)
    raw_priority = _one(options, "priority")
    priority = 0 if raw_priority in (None, "") else _whole(raw_priority, "priority")
    if not 0 <= priority <= MAX_PRIORITY:
        raise FormError("priority", f"must be between 0 and {MAX_PRIORITY}, not {shown(priority)}")
    min_runtime = _asked_min_runtime(options, profile)
    storage = _chosen_storage(options, profile)
    return SessionSpec(profile, chosen, str(team), priority, min_runtime, storage)


def _chosen_slice(options: Mapping[str, Any], profile: Profile) -> SliceOption:
    """The slice option the user chose by ``slices`` or ``gpus``; none: the first."""
    raw_slice = _one(options, "slices")
    if isinstance(raw_slice, int) and not isinstance(raw_slice, bool):
        raw_slice = str(raw_slice)  # the REST API may send a whole-GPU slug as a number
    slice_slug = _name(raw_slice, "slices")
    gpus = _one(options, "gpus")
    if gpus is not None and gpus != "":
        count: int | None = _whole(gpus, "gpus")
    else:
        count = None
    if slice_slug is not None and count is not None:
        raise FormError("gpus", "give either slices or gpus")
    choices = ", ".join(s.slug for s in profile.slices)
    if count is not None:
        match = [s for s in profile.slices if s.gpus == count and not s.mig and not s.gpu_milli]
        if not match:
            raise FormError(
                "gpus", f"profile {profile.slug!r} does not offer {count} GPUs (offered: {choices})"
            )
        return match[0]
    if slice_slug is not None:
        match = [s for s in profile.slices if s.slug == slice_slug]
        if not match:
            raise FormError(
                "slices",
                f"profile {profile.slug!r} does not offer {shown(slice_slug)} (offered: {choices})",
            )
        return match[0]
    return profile.slices[0]


def _paying_team(options: Mapping[str, Any], user_teams: Sequence[str]) -> str:
    """The team the user chose to pay; none: their only team."""
    team = _name(_one(options, "team"), "team")
    if team is None:
        if len(user_teams) != 1:
            which = ", ".join(user_teams) if user_teams else "none"
            raise FormError(
                "team",
                "choose which team pays"
                if user_teams
                else f"you are in no team that has an allocation (your teams: {which}); "
                "ask an administrator to add you to one",
            )
        team = user_teams[0]
    if team not in user_teams:
        raise FormError(
            "team", f"you are not a member of team {shown(team)} (yours: {', '.join(user_teams)})"
        )
    return team


def _asked_min_runtime(options: Mapping[str, Any], profile: Profile) -> float:
    """The minimum runtime the user asked for, under the profile's cap; none: its default."""
    raw_min = _one(options, "min_runtime")
    min_runtime = profile.min_runtime
    if raw_min is not None and raw_min != "":
        min_runtime = _runtime(raw_min, "min_runtime")
        if min_runtime > profile.max_min_runtime:
            raise FormError(
                "min_runtime",
                f"{_human(min_runtime)} is over the cap of {_human(profile.max_min_runtime)} "
                f"for {profile.display_name}",
            )
    return min_runtime


def _chosen_storage(options: Mapping[str, Any], profile: Profile) -> str | None:
    """The storage to mount: one the profile offers (the first if none is chosen)."""
    storage = _name(_one(options, "storage"), "storage")
    if profile.storage:
        if storage is None:
            storage = profile.storage[0]
        if storage not in profile.storage:
            raise FormError(
                "storage",
                f"unknown storage {shown(storage)} (offered: {', '.join(profile.storage)})",
            )
    elif storage is not None:
        raise FormError("storage", f"profile {profile.slug!r} mounts no storage")
    return storage


def _human(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def human_duration(seconds: float) -> str:
    """``90 min``, ``1 h``, ``45 s``: how the form and the queue messages write durations."""
    return _human(seconds)


def rounded_duration(seconds: float) -> str:
    """`human_duration` rounded to what a page needs to say (the Hub's pages and the
    budget service's alike): whole seconds under a minute, whole minutes under two
    hours, whole hours beyond; a negative span is 0 s."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        seconds = round(seconds)
    elif seconds < 2 * 3600:
        seconds = round(seconds / 60) * 60.0
    else:
        seconds = round(seconds / 3600) * 3600.0
    return _human(seconds)


def _count(n: float, unit: str) -> str:
    return f"{n:g} {unit}{'' if n == 1 else 's'}"


def profile_facts(profile: Profile) -> str:
    """``1 CPU, 2 GiB; protected 1 h by default, at most 8 h``."""
    protected = f"protected {_human(profile.min_runtime)} by default"
    if profile.max_min_runtime > profile.min_runtime:
        protected += f", at most {_human(profile.max_min_runtime)}"
    return f"{_count(profile.cpus, 'CPU')}, {profile.memory_gib:g} GiB; {protected}"


def _chosen(defaults: Mapping[str, Any], key: str) -> str:
    value = defaults.get(key)
    if isinstance(value, list):
        value = value[0] if len(value) == 1 else None
    return "" if value is None else str(value)


def render_form(
    profiles: Sequence[Profile],
    user_teams: Sequence[str],
    team_hints: Mapping[str, str],
    *,
    outlooks: Mapping[tuple[str, str], str] | None = None,
    free: Mapping[tuple[str, str], int] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> str:
    """The spawn form's HTML: profiles with their slice choices, team, priority, runtime.

    ``team_hints`` maps a team to a line about its budget (shown next to it);
    ``outlooks`` maps (profile slug, team) to what a session started now would get
    (funded or not, the estimated wait); ``free`` maps (profile slug, slice slug) to how
    many of that choice the free slices hold now; ``defaults`` are the values to show
    checked (the user's last choice, or what a refused form held). Bootstrap 5 classes,
    as the Hub's own pages use.
    """
    outlooks = outlooks or {}
    free = free or {}
    defaults = defaults or {}
    by_slug = {p.slug for p in profiles}
    chosen_profile = _chosen(defaults, "profile")
    if chosen_profile not in by_slug:
        chosen_profile = profiles[0].slug
    parts = ['<div class="budgethub-form">', '<fieldset class="mb-3">']
    parts.append('<legend class="fs-5">Profile</legend>')
    for p in profiles:
        parts += _profile_choice(p, p.slug == chosen_profile, user_teams, outlooks, free, defaults)
    parts.append("</fieldset>")
    parts += _team_field(user_teams, team_hints, _chosen(defaults, "team"))
    parts += _number_fields(defaults)
    parts.append(_FORM_SCRIPT)
    parts.append("</div>")
    return "\n".join(parts)


def _profile_choice(
    p: Profile,
    checked: bool,
    user_teams: Sequence[str],
    outlooks: Mapping[tuple[str, str], str],
    free: Mapping[tuple[str, str], int],
    defaults: Mapping[str, Any],
) -> list[str]:
    """One profile's radio button, its slice and storage choices and its outlook per team."""
    esc = html.escape
    pid = f"budgethub-profile-{esc(p.slug)}"
    parts = [f'<div class="form-check mb-2 budgethub-profile" data-profile="{esc(p.slug)}">']
    parts.append(
        f'<input class="form-check-input" type="radio" name="profile" id="{pid}" '
        f'value="{esc(p.slug)}"{" checked" if checked else ""}>'
        f'<label class="form-check-label" for="{pid}"><strong>{esc(p.display_name)}</strong>'
        + (f" &mdash; {esc(p.description)}" if p.description else "")
        + f' <span class="text-body-secondary">({esc(profile_facts(p))})</span></label>'
    )
    if len(p.slices) > 1:
        parts += _slice_select(p, checked, free, defaults)
    elif (p.slug, p.slices[0].slug) in free:
        parts.append(
            f'<span class="small text-body-secondary ms-2">{esc(p.slices[0].display_name)}'
            f"{esc(_free_text(free[(p.slug, p.slices[0].slug)], p.slices[0].gpu_weight > 0))}"
            "</span>"
        )
    if len(p.storage) > 1:
        parts.append(
            f'<select name="storage" data-profile="{esc(p.slug)}" '
            'class="form-select form-select-sm w-auto d-inline-block ms-2">'
        )
        for name in p.storage:
            selected = " selected" if _chosen(defaults, "storage") == name else ""
            parts.append(f'<option value="{esc(name)}"{selected}>{esc(name)}</option>')
        parts.append("</select>")
    rows = [(t, outlooks[(p.slug, t)]) for t in user_teams if (p.slug, t) in outlooks]
    if rows:
        parts.append('<ul class="list-unstyled small mb-0 ms-1 budgethub-outlook">')
        for team, text in rows:
            parts.append(
                f'<li data-team="{esc(team)}"><span class="badge text-bg-secondary">'
                f"{esc(team)}</span> {esc(text)}</li>"
            )
        parts.append("</ul>")
    parts.append("</div>")
    return parts


def _slice_select(
    p: Profile, checked: bool, free: Mapping[tuple[str, str], int], defaults: Mapping[str, Any]
) -> list[str]:
    """A profile's slice options, with how many are free now; the last choice selected."""
    esc = html.escape
    chosen_slice = _chosen(defaults, "slices")
    chosen_gpus = _chosen(defaults, "gpus")
    parts = [
        f'<select name="slices" data-profile="{esc(p.slug)}" '
        f'class="form-select form-select-sm w-auto d-inline-block ms-2" '
        f'aria-label="GPU slices for {esc(p.display_name)}">'
    ]
    for s in p.slices:
        selected = (
            " selected"
            if checked and (s.slug == chosen_slice or (chosen_gpus and str(s.gpus) == chosen_gpus))
            else ""
        )
        parts.append(
            f'<option value="{esc(s.slug)}"{selected}>{esc(s.display_name)}'
            f"{esc(_free_text(free.get((p.slug, s.slug))))}</option>"
        )
    parts.append("</select>")
    return parts


def _team_field(
    user_teams: Sequence[str], team_hints: Mapping[str, str], chosen_team: str
) -> list[str]:
    """The "Team that pays" choice, with each team's budget line."""
    esc = html.escape
    parts = ['<div class="mb-3">']
    parts.append('<label for="budgethub-team" class="form-label">Team that pays</label>')
    parts.append('<select id="budgethub-team" name="team" class="form-select">')
    for team in user_teams:
        selected = " selected" if team == chosen_team else ""
        parts.append(f'<option value="{esc(team)}"{selected}>{esc(team)}</option>')
    parts.append("</select>")
    for team in user_teams:
        hint = team_hints.get(team, "")
        if hint:
            parts.append(
                f'<div class="form-text budgethub-team-hint" data-team="{esc(team)}">'
                f"<strong>{esc(team)}</strong> {esc(hint)}</div>"
            )
    parts.append("</div>")
    return parts


def _number_fields(defaults: Mapping[str, Any]) -> list[str]:
    """The priority and minimum-runtime inputs."""
    esc = html.escape
    priority = _chosen(defaults, "priority") or "0"
    return [
        '<div class="mb-3"><label for="budgethub-priority" class="form-label">Priority inside '
        f"your team (0&ndash;{MAX_PRIORITY})</label>"
        '<input id="budgethub-priority" name="priority" type="number" min="0" '
        f'max="{MAX_PRIORITY}" value="{esc(priority)}" class="form-control"></div>',
        '<div class="mb-3"><label for="budgethub-min-runtime" class="form-label">Minimum '
        "runtime (protected when funded; e.g. 15m, 2h; empty: the profile default)</label>"
        '<input id="budgethub-min-runtime" name="min_runtime" class="form-control" '
        f'value="{esc(_chosen(defaults, "min_runtime"))}"></div>',
    ]


def _free_text(count: int | None, gpu: bool = True) -> str:
    """`` (2 free now)`` for a GPU choice, `` (room for 2 now)`` for a CPU-only one."""
    if count is None:
        return ""
    many = f"{count}{'+' if count >= 99 else ''}"
    if not gpu:
        return f" (room for {many} now)" if count else " (no room now)"
    return f" ({many} free now)" if count else " (none free now)"


_FORM_SCRIPT = """<script>
(function () {
  // Only the chosen profile's selects are submitted.
  function sync() {
    var chosen = document.querySelector('input[name=profile]:checked');
    document.querySelectorAll('select[data-profile]').forEach(function (s) {
      s.disabled = !chosen || s.dataset.profile !== chosen.value;
    });
  }
  document.querySelectorAll('input[name=profile]').forEach(function (r) {
    r.addEventListener('change', sync);
  });
  sync();
})();
</script>"""


# -- snapshots: restore (the default) or start fresh ------------------------------------

SNAPSHOT_FIELDS = frozenset({"restore", "fresh"})
"""Spawn options about a server's snapshot, taken out before ``resolve`` sees the rest."""

_KEY = re.compile(r"^[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$")
_YES = frozenset({"on", "true", "1", "yes"})
_NO = frozenset({"", "off", "false", "0", "no"})


def snapshot_choice(options: Mapping[str, Any]) -> tuple[str | None, bool]:
    """(the snapshot key asked for or None, start fresh?) from the spawn options.

    Whose the snapshot is, the spawner checks; here only its form (FormError)."""
    fresh_value = _one(options, "fresh")
    if isinstance(fresh_value, bool):
        fresh = fresh_value
    elif fresh_value is not None and not isinstance(fresh_value, str | int | float):
        raise FormError("fresh", f"must be on or off, not {_kind(fresh_value)}")
    elif fresh_value is None or str(fresh_value).lower() in _NO:
        fresh = False
    elif str(fresh_value).lower() in _YES:
        fresh = True
    else:
        raise FormError("fresh", f"must be on or off, not {shown(fresh_value)}")
    key = _one(options, "restore")
    if key is None or key == "":
        return None, fresh
    if not isinstance(key, str):
        raise FormError("restore", f"must be a string (a snapshot key), not {_kind(key)}")
    if not _KEY.match(key):
        raise FormError("restore", f"{shown(key)} is not a snapshot key")
    return key, fresh


def render_snapshot_choice(key: str, sentence: str) -> str:
    """The form's snapshot part: what the snapshot holds, restored unless the user
    ticks "Start fresh"."""
    esc = html.escape
    return (
        '<div class="budgethub-snapshot alert alert-info" role="status">'
        f"<p>{esc(sentence)}</p>"
        f'<input type="hidden" name="restore" value="{esc(key)}">'
        '<div class="form-check"><input class="form-check-input" type="checkbox" '
        'name="fresh" value="on" id="budgethub-fresh">'
        '<label class="form-check-label" for="budgethub-fresh">Start fresh (ignore the '
        "snapshot: no kernel state comes back; your files stay)</label></div></div>"
    )
