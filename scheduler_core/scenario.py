"""Reading a scenario (docs/architecture.md) into the model, with errors that name the field.

Every rule a scenario can break is checked here, before anything runs: the
simulator may then trust its input. Defaults (docs/architecture.md): request ``gpus`` 0,
``nodes`` 1, ``cpus`` 1, ``memory_gib`` 4, ``resumable`` false, ``priority`` 0,
``class`` interactive, ``min_runtime`` the policy's default, ``checkpoint_every`` 0
(none), ``restart_cost`` 0; a request that checkpoints is resumable (from its
checkpoint) unless it says otherwise. A node without
``cpus``/``memory_gib`` gets 64 CPUs and 512 GiB. Seeded ``usage`` is charged
all at once, ``ago`` seconds before the start. A top-level team with a plain
number as ``share`` holds that share of every pool.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_core.capacity import could_hold
from scheduler_core.errors import InputError
from scheduler_core.model import (
    MIG_SLICES,
    MILLI,
    Gpu,
    Health,
    Node,
    Pool,
    PoolKind,
    Request,
    RequestClass,
    Team,
    frozen_labels,
    mig_weight,
    virtual_gpus,
)
from scheduler_core.settings import SettingError, Settings, settings_from_mapping

NODE_DEFAULT_CPUS = 64.0
NODE_DEFAULT_MEMORY_GIB = 512.0
_SHARE_SLACK = 1e-9
_HEALTH_NAMES = ", ".join(h.value for h in Health)


@dataclass(frozen=True)
class SeededUsage:
    team: str
    pool: str
    units: float
    at: float


@dataclass(frozen=True)
class NodeEvent:
    at: float
    node: str
    health: Health


@dataclass(frozen=True)
class Scenario:
    name: str
    horizon: float
    settings: Settings
    pools: tuple[Pool, ...]
    nodes: tuple[Node, ...]
    teams: tuple[Team, ...]
    usage: tuple[SeededUsage, ...]
    requests: tuple[Request, ...]
    durations: Mapping[str, float]
    """Work each request needs, in seconds (known to the simulator, never to the policy)."""
    events: tuple[NodeEvent, ...]
    idle_after: Mapping[str, float] = field(default_factory=dict)
    """Seconds into each run after which the session sits idle until it ends (requests
    that name ``idle_after``); the simulator reports it as the agent would live."""


# -- small typed readers ---------------------------------------------------


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(where, f"must be an object, not {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(where, f"must be a list, not {type(value).__name__}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(where, "must be a non-empty string")
    return value


def _num(value: Any, where: str, *, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(where, f"must be a number, not {value!r}")
    if value < minimum or (strict and value == minimum):
        relation = "greater than" if strict else "at least"
        raise InputError(where, f"must be {relation} {minimum:g}, not {value!r}")
    return float(value)


def _int(value: Any, where: str, *, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InputError(where, f"must be a whole number, not {value!r}")
    if minimum is not None and value < minimum:
        raise InputError(where, f"must be at least {minimum}, not {value!r}")
    return int(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(where, f"must be true or false, not {value!r}")
    return value


def _labels(value: Any, where: str) -> Mapping[str, str]:
    labels = _obj(value, where)
    for key, item in labels.items():
        if not isinstance(item, str):
            raise InputError(f"{where}.{key}", "label values must be strings")
    return frozen_labels(labels)


def _known_keys(data: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    for key in data:
        if key not in allowed:
            raise InputError(f"{where}.{key}", "unknown field")


# -- sections ----------------------------------------------------------------

_NODE_KEYS = frozenset(
    {"name", "count", "pool", "gpus", "gpu_model", "gpu_memory_mib", "cpus", "memory_gib"}
    | {"labels", "mig", "state"}
)
_REQUEST_KEYS = frozenset(
    {"id", "user", "team", "submit", "pool", "gpus", "nodes", "gpu_fraction", "mig", "cpus"}
    | {"memory_gib", "labels", "min_runtime", "duration", "resumable", "priority", "class"}
    | {"profile", "idle_after", "checkpoint_every", "restart_cost"}
)


def _pools(raw: Any) -> dict[str, Pool]:
    pools: dict[str, Pool] = {}
    for i, item in enumerate(_list(raw, "pools")):
        where = f"pools[{i}]"
        data = _obj(item, where)
        _known_keys(data, frozenset({"name", "kind"}), where)
        name = _str(data.get("name"), f"{where}.name")
        if name in pools:
            raise InputError(f"{where}.name", f"pool {name!r} is defined twice")
        kind = data.get("kind", "gpu")
        if kind not in ("gpu", "cpu"):
            raise InputError(f"{where}.kind", f"must be 'gpu' or 'cpu', not {kind!r}")
        pools[name] = Pool(name, PoolKind(kind))
    if not pools:
        raise InputError("pools", "a scenario needs at least one pool")
    return pools


def _mig_layout(raw: Any, gpus: int, where: str) -> dict[int, list[str]]:
    layout: dict[int, list[str]] = {}
    for key, profiles in _obj(raw, where).items():
        try:
            index = int(key)
        except ValueError:
            raise InputError(f"{where}.{key}", "must be a GPU index") from None
        if not 0 <= index < gpus:
            raise InputError(f"{where}.{key}", f"GPU index out of range (node has {gpus} GPUs)")
        names = [_str(p, f"{where}.{key}[{j}]") for j, p in enumerate(_list(profiles, where))]
        slices = 0.0
        for j, profile in enumerate(names):
            try:
                slices += mig_weight(profile) * MIG_SLICES
            except ValueError as error:
                raise InputError(f"{where}.{key}[{j}]", str(error)) from None
        if slices > MIG_SLICES + 1e-6:
            raise InputError(f"{where}.{key}", f"profiles use {slices:g} of 7 compute slices")
        if not names:
            raise InputError(f"{where}.{key}", "a MIG-partitioned GPU needs instances")
        layout[index] = names
    return layout


GpuReader = Callable[[str, str], tuple[Gpu, ...]]
"""Reads a node's GPUs for a ``gpus`` value that is not a count (the live Hub's
``"nvml"``): (value, where) -> GPUs, raising InputError naming ``where``."""


def parse_node_list(
    raw: Any,
    pools: Mapping[str, Pool],
    *,
    where: str = "nodes",
    extra_keys: frozenset[str] = frozenset(),
    read_gpus: GpuReader | None = None,
) -> list[tuple[Node, Mapping[str, Any]]]:
    """Nodes as a scenario and the live Hub declare them, each with its raw item.

    One parser, one set of defaults (``cpus`` 64, ``memory_gib`` 512, ``gpus`` 0):
    the Hub passes the keys only it knows (its engines) as ``extra_keys`` and reads
    them from the raw item. An error names the field and the reason."""
    nodes: list[tuple[Node, Mapping[str, Any]]] = []
    seen: set[str] = set()
    known = _NODE_KEYS | extra_keys
    for i, item in enumerate(_list(raw, where)):
        at = f"{where}[{i}]"
        data = _obj(item, at)
        _known_keys(data, known, at)
        template = _str(data.get("name"), f"{at}.name")
        pool = _str(data.get("pool"), f"{at}.pool")
        if pool not in pools:
            raise InputError(f"{at}.pool", f"unknown pool {pool!r}")
        count = _int(data.get("count", 1), f"{at}.count", minimum=1)
        raw_gpus = data.get("gpus", 0)
        read: tuple[Gpu, ...] | None = None
        if read_gpus is not None and isinstance(raw_gpus, str):
            read = read_gpus(raw_gpus, f"{at}.gpus")
            gpus = len(read)
        else:
            gpus = _int(raw_gpus, f"{at}.gpus")
        if gpus and pools[pool].kind is PoolKind.CPU:
            raise InputError(f"{at}.gpus", f"pool {pool!r} is a CPU pool")
        model = _str(data.get("gpu_model", "GPU"), f"{at}.gpu_model")
        memory_mib = _int(data.get("gpu_memory_mib", 0), f"{at}.gpu_memory_mib")
        cpus = _num(data.get("cpus", NODE_DEFAULT_CPUS), f"{at}.cpus", strict=True)
        memory = _num(
            data.get("memory_gib", NODE_DEFAULT_MEMORY_GIB), f"{at}.memory_gib", strict=True
        )
        labels = _labels(data.get("labels", {}), f"{at}.labels")
        mig = _mig_layout(data.get("mig", {}), gpus, f"{at}.mig")
        state = data.get("state", "ready")
        if state not in {h.value for h in Health}:
            raise InputError(f"{at}.state", f"must be one of {_HEALTH_NAMES}, not {state!r}")
        if count > 1 and "{i" not in template:
            raise InputError(f"{at}.name", "a node with count > 1 needs {i} in its name")
        for n in range(count):
            try:
                name = template.format(i=n)
            except (KeyError, IndexError, ValueError) as error:
                raise InputError(f"{at}.name", f"bad name template: {error}") from None
            if name in seen:
                raise InputError(f"{at}.name", f"node {name!r} is defined twice")
            seen.add(name)
            gpu_list = (
                read if read is not None else virtual_gpus(name, gpus, model, mig, memory_mib)
            )
            node = Node(name, pool, cpus, memory, gpu_list, labels, Health(state))
            nodes.append((node, data))
    return nodes


def _teams(raw: Any, pools: Mapping[str, Pool]) -> list[Team]:
    items = _list(raw, "teams")
    names: dict[str, int] = {}
    for i, item in enumerate(items):
        data = _obj(item, f"teams[{i}]")
        name = _str(data.get("name"), f"teams[{i}].name")
        if name in names:
            raise InputError(f"teams[{i}].name", f"team {name!r} is defined twice")
        names[name] = i
    teams: list[Team] = []
    for i, item in enumerate(items):
        where = f"teams[{i}]"
        _known_keys(item, frozenset({"name", "share", "parent"}), where)
        parent = item.get("parent")
        if parent is not None:
            parent = _str(parent, f"{where}.parent")
            if parent not in names:
                raise InputError(f"{where}.parent", f"unknown team {parent!r}")
        raw_share = item.get("share", 0.0)
        share: dict[str, float] = {}
        if isinstance(raw_share, dict):
            for pool, value in raw_share.items():
                if pool not in pools:
                    raise InputError(f"{where}.share.{pool}", f"unknown pool {pool!r}")
                share[pool] = _num(value, f"{where}.share.{pool}")
                if share[pool] > 1.0:
                    raise InputError(f"{where}.share.{pool}", f"must be at most 1, not {value}")
        else:
            value = _num(raw_share, f"{where}.share")
            if value > 1.0:
                raise InputError(f"{where}.share", f"must be at most 1, not {value}")
            share = dict.fromkeys(pools, value)
        teams.append(Team(item["name"], share, parent))
    by_name = {t.name: t for t in teams}
    for i, team in enumerate(teams):
        seen = {team.name}
        parent = team.parent
        while parent is not None:
            if parent in seen:
                raise InputError(f"teams[{i}].parent", f"team {team.name!r} is its own ancestor")
            seen.add(parent)
            parent = by_name[parent].parent
    for pool in pools:
        groups: dict[str | None, float] = {}
        for team in teams:
            groups[team.parent] = groups.get(team.parent, 0.0) + team.share.get(pool, 0.0)
        for parent, total in groups.items():
            if total > 1.0 + _SHARE_SLACK:
                whose = "top-level teams" if parent is None else f"sub-teams of {parent!r}"
                i = max(names[t.name] for t in teams if t.parent == parent and t.share.get(pool))
                raise InputError(
                    f"teams[{i}].share",
                    f"shares of pool {pool!r} among {whose} sum to {total:g}, over 1",
                )
    return teams


def _request(
    data: dict[str, Any],
    where: str,
    pools: Mapping[str, Pool],
    teams: Mapping[str, Team],
    settings: Settings,
) -> tuple[Request, float]:
    _known_keys(data, _REQUEST_KEYS, where)
    request_id = data.get("id")
    if isinstance(request_id, int) and not isinstance(request_id, bool):
        request_id = str(request_id)
    request_id = _str(request_id, f"{where}.id")
    user = _str(data.get("user", "anonymous"), f"{where}.user")
    team = _str(data.get("team"), f"{where}.team")
    if team not in teams:
        raise InputError(f"{where}.team", f"unknown team {team!r}")
    pool = _str(data.get("pool"), f"{where}.pool")
    if pool not in pools:
        raise InputError(f"{where}.pool", f"unknown pool {pool!r}")
    gpus = _int(data.get("gpus", 0), f"{where}.gpus")
    nodes = _int(data.get("nodes", 1), f"{where}.nodes", minimum=1)
    milli = 0
    if data.get("gpu_fraction") is not None:
        fraction = _num(data["gpu_fraction"], f"{where}.gpu_fraction", strict=True)
        milli = round(fraction * MILLI)
        if not 0 < milli < MILLI:
            raise InputError(f"{where}.gpu_fraction", f"must be between 0 and 1, not {fraction}")
    mig = data.get("mig")
    if mig is not None:
        mig = _str(mig, f"{where}.mig")
        try:
            mig_weight(mig)
        except ValueError as error:
            raise InputError(f"{where}.mig", str(error)) from None
    if sum(bool(x) for x in (gpus, milli, mig)) > 1:
        raise InputError(where, "ask for one of gpus, gpu_fraction or mig, not several")
    if (milli or mig) and nodes > 1:
        raise InputError(f"{where}.nodes", "a GPU fraction or MIG instance is on one node")
    if (gpus or milli or mig) and pools[pool].kind is PoolKind.CPU:
        raise InputError(f"{where}.pool", f"pool {pool!r} is a CPU pool; it has no GPUs")
    klass = data.get("class", "interactive")
    if klass not in {c.value for c in RequestClass}:
        choices = ", ".join(c.value for c in RequestClass)
        raise InputError(f"{where}.class", f"must be one of {choices}, not {klass!r}")
    weight = (mig_weight(mig) if mig else milli / MILLI if milli else float(gpus)) * nodes
    if klass == "debug" and weight > settings.debug_max_gpus:
        raise InputError(
            f"{where}.gpus",
            f"a debug request holds at most {settings.debug_max_gpus} GPUs "
            f"(debug_max_gpus), not {weight:g}",
        )
    raw_min = data.get("min_runtime")
    min_runtime = None if raw_min is None else _num(raw_min, f"{where}.min_runtime")
    if "duration" not in data:
        raise InputError(f"{where}.duration", "missing: the work the request needs, in seconds")
    duration = _num(data["duration"], f"{where}.duration", strict=True)
    request = Request(
        id=request_id,
        user=user,
        team=team,
        pool=pool,
        submit=_num(data.get("submit", 0), f"{where}.submit"),
        gpus=gpus,
        nodes=nodes,
        gpu_milli=milli,
        mig=mig,
        cpus=_num(data.get("cpus", 1), f"{where}.cpus", strict=True),
        memory_gib=_num(data.get("memory_gib", 4), f"{where}.memory_gib", strict=True),
        labels=_labels(data.get("labels", {}), f"{where}.labels"),
        min_runtime=settings.capped_min_runtime(min_runtime, klass),
        priority=_int(data.get("priority", 0), f"{where}.priority", minimum=None),
        klass=RequestClass(klass),
        profile=data.get("profile"),
        **_price(data, where),
    )
    return request, duration


def _price(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """What a preemption of the request costs (`Request.lost_seconds`): resumability, the
    checkpoint interval and the restart cost."""
    every = _num(data.get("checkpoint_every", 0), f"{where}.checkpoint_every")
    resumable = _bool(data.get("resumable", every > 0), f"{where}.resumable")
    if every > 0 and not resumable:
        raise InputError(
            f"{where}.checkpoint_every",
            "a request that checkpoints resumes from its checkpoint: drop resumable false",
        )
    return {
        "resumable": resumable,
        "checkpoint_every": every,
        "restart_cost": _num(data.get("restart_cost", 0), f"{where}.restart_cost"),
    }


def why_unplaceable(request: Request, nodes: list[Node]) -> str | None:
    """Why no node of the cluster could ever hold the request, or None if one could."""
    pool_nodes = [n for n in nodes if n.pool == request.pool]
    fitting = [n for n in pool_nodes if could_hold(n, request)]
    if len(fitting) >= request.nodes:
        return None
    if not pool_nodes:
        return f"pool {request.pool!r} has no nodes"
    if request.mig is not None:
        need = f"a free {request.mig} MIG instance"
    elif request.gpu_milli:
        need = "a GPU that is not MIG-partitioned"
    else:
        need = f"{request.gpus} whole GPUs"
    labels = ", ".join(f"{k}={v}" for k, v in request.labels.items())
    where = f" with labels {labels}" if labels else ""
    return (
        f"no {request.nodes} node(s) of pool {request.pool!r}{where} could ever hold it "
        f"({need}, {request.cpus:g} CPUs, {request.memory_gib:g} GiB per node)"
    )


def parse_scenario(data: Any) -> Scenario:
    """A validated Scenario from a decoded JSON object; InputError names the bad field."""
    top = _obj(data, "scenario")
    _known_keys(
        top,
        frozenset({"name", "horizon", "policy", "pools", "nodes", "teams", "usage"})
        | {"requests", "events", "description"},
        "scenario",
    )
    name = _str(top.get("name", "scenario"), "name")
    if "horizon" not in top:
        raise InputError("horizon", "missing: how many seconds the scenario runs")
    horizon = _num(top["horizon"], "horizon", strict=True)
    settings = _settings(top.get("policy", {}))
    pools = _pools(top.get("pools"))
    nodes = [node for node, _raw in parse_node_list(top.get("nodes", []), pools)]
    teams = _teams(top.get("teams", []), pools)
    team_map = {t.name: t for t in teams}
    usage = _usage(top.get("usage", []), pools, team_map)
    requests, durations, idle_after = _requests(
        top.get("requests", []), pools, team_map, settings, nodes
    )
    events = _events(top.get("events", []), {n.name for n in nodes})
    return Scenario(
        name=name,
        horizon=horizon,
        settings=settings,
        pools=tuple(pools.values()),
        nodes=tuple(nodes),
        teams=tuple(teams),
        usage=tuple(sorted(usage, key=lambda u: u.at)),
        requests=tuple(sorted(requests, key=lambda r: (r.submit, r.id))),
        durations=durations,
        events=tuple(sorted(events, key=lambda e: e.at)),
        idle_after=idle_after,
    )


def _settings(raw: Any) -> Settings:
    """The ``policy`` object: a registered policy's name and its settings."""
    policy = _obj(raw, "policy")
    try:
        settings = settings_from_mapping(policy)
    except SettingError as error:
        raise InputError(f"policy.{error.key}", error.reason) from None
    from scheduler_core.registry import POLICIES

    if settings.name not in POLICIES:
        known = ", ".join(sorted(POLICIES))
        raise InputError("policy.name", f"unknown policy {settings.name!r} (known: {known})")
    return settings


def _usage(raw: Any, pools: Mapping[str, Pool], teams: Mapping[str, Team]) -> list[SeededUsage]:
    """The ``usage`` list: seeded history, in GPU- or core-seconds by its pool's kind."""
    usage: list[SeededUsage] = []
    for i, item in enumerate(_list(raw, "usage")):
        where = f"usage[{i}]"
        data_u = _obj(item, where)
        _known_keys(
            data_u, frozenset({"team", "pool", "gpu_seconds", "core_seconds", "ago"}), where
        )
        team = _str(data_u.get("team"), f"{where}.team")
        if team not in teams:
            raise InputError(f"{where}.team", f"unknown team {team!r}")
        pool = _str(data_u.get("pool"), f"{where}.pool")
        if pool not in pools:
            raise InputError(f"{where}.pool", f"unknown pool {pool!r}")
        field = "gpu_seconds" if pools[pool].kind is PoolKind.GPU else "core_seconds"
        if field not in data_u:
            raise InputError(f"{where}.{field}", f"missing: usage of pool {pool!r} is in {field}")
        units = _num(data_u[field], f"{where}.{field}")
        ago = _num(data_u.get("ago", 0), f"{where}.ago")
        usage.append(SeededUsage(team, pool, units, -ago))
    return usage


def _requests(
    raw: Any,
    pools: Mapping[str, Pool],
    teams: Mapping[str, Team],
    settings: Settings,
    nodes: list[Node],
) -> tuple[list[Request], dict[str, float], dict[str, float]]:
    """The ``requests`` list, each one some node could ever hold: the requests, and by
    request id the work each needs and when each goes idle (``idle_after``, if given)."""
    requests: list[Request] = []
    durations: dict[str, float] = {}
    idle_after: dict[str, float] = {}
    placeable: dict[tuple[object, ...], str | None] = {}
    for i, item in enumerate(_list(raw, "requests")):
        where = f"requests[{i}]"
        request, duration = _request(_obj(item, where), where, pools, teams, settings)
        if request.id in durations:
            raise InputError(f"{where}.id", f"request id {request.id!r} is used twice")
        shape = (
            request.pool,
            request.gpus,
            request.nodes,
            request.gpu_milli,
            request.mig,
            request.cpus,
            request.memory_gib,
            tuple(sorted(request.labels.items())),
        )
        if shape not in placeable:
            placeable[shape] = why_unplaceable(request, nodes)
        reason = placeable[shape]
        if reason is not None:
            raise InputError(where, reason)
        requests.append(request)
        durations[request.id] = duration
        if "idle_after" in item:
            idle_after[request.id] = _num(item["idle_after"], f"{where}.idle_after")
    return requests, durations, idle_after


def _events(raw: Any, node_names: set[str]) -> list[NodeEvent]:
    """The ``events`` list: node health changes."""
    events: list[NodeEvent] = []
    for i, item in enumerate(_list(raw, "events")):
        where = f"events[{i}]"
        data_e = _obj(item, where)
        _known_keys(data_e, frozenset({"at", "node", "state"}), where)
        node = _str(data_e.get("node"), f"{where}.node")
        if node not in node_names:
            raise InputError(f"{where}.node", f"unknown node {node!r}")
        state = data_e.get("state")
        if state not in {h.value for h in Health}:
            raise InputError(f"{where}.state", f"must be one of {_HEALTH_NAMES}, not {state!r}")
        events.append(NodeEvent(_num(data_e.get("at"), f"{where}.at"), node, Health(state)))
    return events


def load_scenario(path: str) -> Scenario:
    """Read and validate a scenario file; InputError names the file, field or JSON position."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise InputError(path, error.strerror or str(error)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{path}:{error.lineno}:{error.colno}", f"not JSON: {error.msg}") from None
    return parse_scenario(data)


def parse_pools(raw: Any) -> dict[str, Pool]:
    """Pools from a list of ``{"name", "kind"}`` objects, as in a scenario."""
    return _pools(raw)


def parse_teams(raw: Any, pools: Mapping[str, Pool]) -> list[Team]:
    """Teams from a list of ``{"name", "share", "parent"}`` objects, as in a scenario."""
    return _teams(raw, pools)
