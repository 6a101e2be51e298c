"""Admin changes to allocations and settings: checked like the configuration, merged over it.

The budget service checks a change here before it writes it to the store; the
embedded scheduler merges what the store holds over the configuration file at start
and in the cycle after a change. One module for both, so that what the form accepts
is exactly what the scheduler will run. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_core.errors import InputError
from scheduler_core.model import Health, Pool, Team
from scheduler_core.scenario import parse_teams
from scheduler_core.settings import (
    BOUNDS,
    SettingError,
    Settings,
    bound_fault,
    settings_from_mapping,
)
from scheduler_core.teams import share_fault

LIMITS = BOUNDS
"""What an admin may set each setting to, in seconds: the bounds the configuration has
too (scheduler_core.settings.BOUNDS), so that one definition holds for both."""
NODE_STATES = (Health.READY.value, Health.DRAINING.value)
"""What an admin may set a node to: drain it, or return it to service."""


class AdminError(ValueError):
    """A change that cannot be made: ``field`` names what is wrong, ``reason`` why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


_MISSING: Any = object()


def team_specs(teams: Iterable[Team]) -> list[dict[str, Any]]:
    """Teams as the store keeps them (and as the configuration writes them)."""
    return [
        {"name": t.name, "parent": t.parent, "share": dict(sorted(t.share.items()))}
        for t in sorted(teams, key=lambda t: t.name)
    ]


def check_teams(specs: Sequence[Mapping[str, Any]], pools: Mapping[str, Pool]) -> list[Team]:
    """Parse teams as the configuration is parsed; AdminError names ``teams.NAME.…``."""
    try:
        return parse_teams([dict(s) for s in specs], pools)
    except InputError as error:

        def by_name(match: re.Match[str]) -> str:
            i = int(match.group(1))
            name = specs[i].get("name") if i < len(specs) else None
            return f"teams.{name}" if isinstance(name, str) else match.group(0)

        raise AdminError(re.sub(r"teams\[(\d+)\]", by_name, error.where), error.reason) from None


def change_team(
    teams: Sequence[Team],
    pools: Mapping[str, Pool],
    name: Any,
    *,
    share: Any = _MISSING,
    parent: Any = _MISSING,
) -> list[Team]:
    """The teams with ``name``'s shares (some pools or all) and/or parent changed."""
    by_name = {t.name: t for t in teams}
    if not isinstance(name, str) or name not in by_name:
        known = ", ".join(sorted(by_name))
        raise AdminError("team", f"unknown team {name!r} (teams: {known})")
    if share is _MISSING and parent is _MISSING:
        raise AdminError("share", "give a share or a parent to change")
    specs = team_specs(teams)
    spec = next(s for s in specs if s["name"] == name)
    if share is not _MISSING:
        if not isinstance(share, Mapping) or not share:
            raise AdminError("share", f"must be an object of pool → fraction, not {share!r}")
        for pool, value in share.items():
            field = f"share.{pool}"
            if pool not in pools:
                raise AdminError(field, f"unknown pool {pool!r} (pools: {', '.join(pools)})")
            spec["share"][pool] = check_share(field, value)
    if parent is not _MISSING:
        if parent is not None and (not isinstance(parent, str) or parent not in by_name):
            raise AdminError("parent", f"unknown team {parent!r}")
        if parent == name:
            raise AdminError("parent", f"team {name!r} cannot be its own parent")
        spec["parent"] = parent
    try:
        return check_teams(specs, pools)
    except AdminError as error:
        # Name the field of the request: "teams.nlp.share.gpu" is "share.gpu" of nlp.
        prefix = f"teams.{name}."
        field = error.field[len(prefix) :] if error.field.startswith(prefix) else error.field
        pool = re.search(r"pool '([^']+)'", error.reason)
        if share is not _MISSING and field.endswith("share") and pool:
            field = f"share.{pool.group(1)}"  # a sum over 1: the share asked for
        elif parent is not _MISSING and (share is _MISSING or field.endswith("parent")):
            field = "parent"  # the new place in the tree is what does not fit
        raise AdminError(field, error.reason) from None


class _Constant(float):
    """A NaN or an infinity in a JSON body (Python's json reads them; JSON has none)."""

    def __new__(cls, text: str) -> _Constant:
        made = super().__new__(cls, text)
        made.text = text
        return made

    text: str


def _constant_at(value: Any, where: str) -> tuple[str, str] | None:
    """(where, its text) of the first NaN or infinity in a parsed body."""
    if isinstance(value, _Constant):
        return where, value.text
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _constant_at(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def json_body(raw: bytes | str) -> Any:
    """A request's JSON body, as JSON has it: ``NaN``, ``Infinity`` and ``-Infinity``
    (which Python's json would read as numbers) are refused, naming where they are
    (``share.gpu``; ``body`` for the whole body). AdminError; ValueError if not JSON."""
    parsed = json.loads(raw, parse_constant=_Constant)
    found = _constant_at(parsed, "")
    if found is not None:
        where, text = found
        raise AdminError(
            where or "body",
            f"must be a number, not {text} (JSON has no NaN or Infinity)"
            if where
            else f"must be a JSON object, not {text} (JSON has no NaN or Infinity)",
        )
    return parsed


def form_number(raw: str) -> int | float:
    """A number typed into a form, as it was typed: ``-1`` stays an int, so an error says
    "-1", not "-1.0" (the API's JSON keeps it so too). ValueError if it is none."""
    text = raw.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


def check_share(field: str, value: Any) -> float:
    """A share an admin may give: 0 (none), or from 0.001 to 1 (the configuration's
    bound too: scheduler_core.teams.share_fault)."""
    reason = share_fault(value)
    if reason is not None:
        raise AdminError(field, reason)
    return float(value)


def check_setting(key: Any, value: Any) -> float:
    """A duration setting an admin may change, in seconds ("7d", "8h" or a number)."""
    if key not in LIMITS:
        raise AdminError("setting", f"unknown setting {key!r} (settings: {', '.join(LIMITS)})")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise AdminError(
            key, f"must be a number of seconds or a duration such as '7d', not {value!r}"
        )
    try:
        seconds = float(getattr(settings_from_mapping({key: value}), key))
    except SettingError as error:
        raise AdminError(key, error.reason) from None
    reason = bound_fault(key, seconds)
    if reason is not None:
        raise AdminError(key, reason)
    return seconds


def check_node_state(nodes: Iterable[str], name: Any, state: Any) -> str:
    names = sorted(nodes)
    if not isinstance(name, str) or name not in names:
        raise AdminError("node", f"unknown node {name!r} (nodes: {', '.join(names)})")
    if state not in NODE_STATES:
        raise AdminError("state", f"must be one of {', '.join(NODE_STATES)}, not {state!r}")
    return str(state)


@dataclass(frozen=True, slots=True)
class Effective:
    """The configuration with what an admin changed merged over it."""

    teams: tuple[Team, ...]
    settings: Settings
    drained: frozenset[str]
    ignored: tuple[str, ...] = ()
    """Stored changes that no longer fit the configuration, and why (logged)."""


def effective(
    teams: Sequence[Team],
    settings: Settings,
    pools: Mapping[str, Pool],
    nodes: Iterable[str],
    overrides: Mapping[str, Any],
) -> Effective:
    """What the scheduler runs: the store's admin changes win over the configuration.

    Teams come from the configuration (they are the Hub's groups); a stored team's
    shares and parent replace its configured ones. A stored change that no longer
    checks against the configuration (a pool removed, say) is ignored, with the reason.
    """
    ignored: list[str] = []
    result_teams = list(teams)
    stored = overrides.get("teams")
    if isinstance(stored, list):
        by_name = {s.get("name"): s for s in stored if isinstance(s, Mapping)}
        specs = []
        for spec in team_specs(teams):
            override = by_name.get(spec["name"])
            if override is not None:
                spec = {
                    "name": spec["name"],
                    "parent": override.get("parent"),
                    "share": {
                        p: v for p, v in dict(override.get("share", {})).items() if p in pools
                    },
                }
            specs.append(spec)
        try:
            result_teams = check_teams(specs, pools)
        except AdminError as error:
            ignored.append(f"teams: {error}")
    changes: dict[str, float] = {}
    for key in LIMITS:
        if key in overrides:
            try:
                changes[key] = check_setting(key, overrides[key])
            except AdminError as error:
                ignored.append(str(error))
    node_names = set(nodes)
    drained = overrides.get("drained", [])
    drained_set = (
        frozenset(n for n in drained if n in node_names)
        if isinstance(drained, list)
        else frozenset()
    )
    return Effective(tuple(result_teams), settings.replace(**changes), drained_set, tuple(ignored))
