"""Session profiles and the spawn form: what a researcher may ask for, checked.

Pure: no JupyterHub, no Docker. The spawner hands ``resolve`` the user's
options (from the form or straight from the REST API, which nobody has to
fill in honestly) and gets back a ``SessionSpec`` or a ``FormError`` naming
the field and the reason, which the spawner shows as a refusal.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
        klass_text = item.get("class", "interactive")
        if klass_text not in {c.value for c in RequestClass}:
            choices = ", ".join(c.value for c in RequestClass)
            raise FormError(f"{where}.class", f"must be one of {choices}, not {klass_text!r}")
        klass = RequestClass(klass_text)
        pool = _text(item.get("pool"), f"{where}.pool")
        if pool not in known_pools:
            raise FormError(f"{where}.pool", f"unknown pool {pool!r}")
        raw_slices = list(item.get("slices", []))
        raw_slices += [{"gpus": n} for n in item.get("gpus", [])]
        slices = tuple(
            _slice_option(option, f"{where}.slices[{j}]") for j, option in enumerate(raw_slices)
        ) or (SliceOption("cpu", "no GPU"),)
        if len({s.slug for s in slices}) != len(slices):
            raise FormError(f"{where}.slices", "two options share a slug")
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
        labels = item.get("labels", {})
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise FormError(f"{where}.labels", "must map strings to strings")
        storage = item.get("storage", [])
        if isinstance(storage, str):
            storage = [storage]
        storage = tuple(_text(s, f"{where}.storage") for s in storage)
        profiles.append(
            Profile(
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
        )
    if not profiles:
        raise FormError("profile_list", "offers no profile")
    return profiles


def _one(options: Mapping[str, Any], key: str) -> Any:
    """A form field arrives as a list of strings; the REST API may send a plain value."""
    value = options.get(key)
    if isinstance(value, list):
        if len(value) != 1:
            raise FormError(key, f"expected one value, got {len(value)}")
        return value[0]
    return value


def _whole(value: Any, key: str) -> int:
    if isinstance(value, bool):
        raise FormError(key, f"must be a whole number, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise FormError(key, f"must be a whole number, not {value!r}")


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
        raise FormError(sorted(unknown)[0], "is not a spawn option")
    by_slug = {p.slug: p for p in profiles}
    slug = _one(options, "profile")
    if slug in (None, ""):
        slug = profiles[0].slug
    if slug not in by_slug:
        raise FormError("profile", f"unknown profile {slug!r} (offered: {', '.join(by_slug)})")
    profile = by_slug[slug]

    slice_slug = _one(options, "slices")
    gpus = _one(options, "gpus")
    if slice_slug not in (None, "") and gpus not in (None, ""):
        raise FormError("gpus", "give either slices or gpus")
    choices = ", ".join(s.slug for s in profile.slices)
    if gpus not in (None, ""):
        count = _whole(gpus, "gpus")
        match = [s for s in profile.slices if s.gpus == count and not s.mig and not s.gpu_milli]
        if not match:
            raise FormError(
                "gpus", f"profile {profile.slug!r} does not offer {count} GPUs (offered: {choices})"
            )
        chosen = match[0]
    elif slice_slug not in (None, ""):
        match = [s for s in profile.slices if s.slug == str(slice_slug)]
        if not match:
            raise FormError(
                "slices",
                f"profile {profile.slug!r} does not offer {slice_slug!r} (offered: {choices})",
            )
        chosen = match[0]
    else:
        chosen = profile.slices[0]

    team = _one(options, "team")
    if team in (None, ""):
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
            "team", f"you are not a member of team {team!r} (yours: {', '.join(user_teams)})"
        )

    raw_priority = _one(options, "priority")
    priority = 0 if raw_priority in (None, "") else _whole(raw_priority, "priority")
    if not 0 <= priority <= MAX_PRIORITY:
        raise FormError("priority", f"must be between 0 and {MAX_PRIORITY}, not {priority}")

    raw_min = _one(options, "min_runtime")
    min_runtime = profile.min_runtime
    if raw_min not in (None, ""):
        min_runtime = _duration(raw_min, "min_runtime")
        if min_runtime > profile.max_min_runtime:
            raise FormError(
                "min_runtime",
                f"{_human(min_runtime)} is over the cap of {_human(profile.max_min_runtime)} "
                f"for {profile.display_name}",
            )

    storage = _one(options, "storage")
    if profile.storage:
        if storage in (None, ""):
            storage = profile.storage[0]
        if storage not in profile.storage:
            raise FormError(
                "storage",
                f"unknown storage {storage!r} (offered: {', '.join(profile.storage)})",
            )
    elif storage not in (None, ""):
        raise FormError("storage", f"profile {profile.slug!r} mounts no storage")
    else:
        storage = None
    return SessionSpec(profile, chosen, str(team), priority, min_runtime, storage)


def _human(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def render_form(
    profiles: Sequence[Profile], user_teams: Sequence[str], team_hints: Mapping[str, str]
) -> str:
    """The spawn form's HTML: profiles with their slice choices, team, priority, runtime.

    ``team_hints`` maps a team to a line about its budget (shown next to it).
    """
    esc = html.escape
    parts = ['<div class="budgethub-form">']
    for i, p in enumerate(profiles):
        checked = " checked" if i == 0 else ""
        parts.append(
            f'<div class="radio"><label><input type="radio" name="profile" '
            f'value="{esc(p.slug)}"{checked}> <strong>{esc(p.display_name)}</strong> '
            f"&mdash; {esc(p.description)} ({p.cpus:g} CPUs, {p.memory_gib:g} GiB; "
            f"protected up to {_human(p.max_min_runtime)})</label>"
        )
        if len(p.slices) > 1:
            parts.append(f'<select name="slices" data-profile="{esc(p.slug)}">')
            parts += [
                f'<option value="{esc(s.slug)}">{esc(s.display_name)}</option>' for s in p.slices
            ]
            parts.append("</select>")
        if len(p.storage) > 1:
            parts.append(f'<select name="storage" data-profile="{esc(p.slug)}">')
            parts += [f'<option value="{esc(s)}">{esc(s)}</option>' for s in p.storage]
            parts.append("</select>")
        parts.append("</div>")
    parts.append('<label for="budgethub-team">Team that pays</label>')
    parts.append('<select id="budgethub-team" name="team" class="form-control">')
    for team in user_teams:
        hint = team_hints.get(team, "")
        parts.append(f'<option value="{esc(team)}">{esc(team)} {esc(hint)}</option>')
    parts.append("</select>")
    parts.append(
        f'<label for="budgethub-priority">Priority inside your team (0&ndash;{MAX_PRIORITY})'
        '</label><input id="budgethub-priority" name="priority" type="number" min="0" '
        f'max="{MAX_PRIORITY}" value="0" class="form-control">'
    )
    parts.append(
        '<label for="budgethub-min-runtime">Minimum runtime (protected when funded; '
        "e.g. 15m, 2h; empty: the profile default)</label>"
        '<input id="budgethub-min-runtime" name="min_runtime" class="form-control">'
    )
    parts.append(_FORM_SCRIPT)
    parts.append("</div>")
    return "\n".join(parts)


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
