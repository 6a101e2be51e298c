"""Builders of the things tests and benchmarks set up again and again: scenario dicts
and their requests, simulations and schedulers over them, nodes, pools, teams and
stores, and the random scenarios and per-cycle invariants of the property tests.

Each builder has the defaults most callers want and takes keyword overrides for the
rest, so a test states only what it is about. Two scenario shapes cover the unit
tests:

- `scenario` and `request`: one 8-GPU node ``n1`` in pool ``g`` (with an empty
  ``cpu`` pool), teams ``a`` and ``b`` at half each, a day long; one GPU for an hour.
- `gpu_scenario` and `gpu_request`: ``nodes`` nodes ``n-0``, ``n-1``, … of ``gpus``
  GPUs in pool ``gpu`` under the budget policy, teams ``a`` and ``b`` at half each,
  30 hours long; requests of a class, 20 hours of work, protected for an hour.

hypothesis and pytest are imported only by the builders that need them, so that a
benchmark can use the rest without the test dependencies.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from harness import REPO
from scheduler_core import model
from scheduler_core.capacity import Capacity
from scheduler_core.errors import InputError
from scheduler_core.metrics import result
from scheduler_core.model import Allocation
from scheduler_core.preemption import GANG_CHECKPOINT_SLACK, at_checkpoint, checkpoint_slack
from scheduler_core.scenario import Scenario, parse_scenario
from scheduler_core.scheduler import Actuator, Clock, Scheduler
from scheduler_core.settings import Settings
from scheduler_core.simulator import CycleObserver, RequestRecord, Simulation, VirtualClock
from scheduler_core.store import Store
from scheduler_core.view import Decisions

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

HOUR = 3600
DAY = 24 * HOUR
WEEK = 7 * DAY

EXAMPLE = REPO / "examples" / "debug-fast-start.json"
"""The example scenario the command-line tests run."""
TEST_DATA = REPO / "tests" / "data"
"""Small trace files (tests/data)."""


# Scenario dicts: one 8-GPU node in pool g.


@overload
def scenario(*, parse: Literal[False] = False, **overrides: Any) -> dict[str, Any]: ...
@overload
def scenario(*, parse: Literal[True], **overrides: Any) -> Scenario: ...
def scenario(*, parse: bool = False, **overrides: Any) -> dict[str, Any] | Scenario:
    """One 8-GPU node ``n1`` (64 CPUs, 512 GiB) in pool ``g``, an empty ``cpu`` pool,
    teams ``a`` and ``b`` with half of each, a day long and no requests; each keyword
    replaces that key. Parsed (`parse_scenario`) when ``parse``."""
    data: dict[str, Any] = {
        "name": "rule",
        "horizon": DAY,
        "pools": [{"name": "g", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"}],
        "nodes": [{"name": "n1", "pool": "g", "gpus": 8, "cpus": 64, "memory_gib": 512}],
        "teams": [{"name": "a", "share": 0.5}, {"name": "b", "share": 0.5}],
        "requests": [],
    }
    data.update(overrides)
    return parse_scenario(data) if parse else data


def request(rid: str, team: str, submit: float = 0, **fields: Any) -> dict[str, Any]:
    """A request of `scenario`: user ``u-<team>`` asks for one GPU of pool ``g`` for an
    hour; each keyword sets or replaces a field."""
    data: dict[str, Any] = {
        "id": rid,
        "user": f"u-{team}",
        "team": team,
        "submit": submit,
        "pool": "g",
        "gpus": 1,
        "duration": HOUR,
    }
    data.update(fields)
    return data


# Scenario dicts: nodes of a few GPUs in pool gpu, under the budget policy.


ONE_TEAM: list[dict[str, Any]] = [{"name": "a", "share": {"gpu": 1.0}}]
"""`gpu_scenario`'s ``teams`` for one team ``a`` with the whole pool (never changed)."""


@overload
def gpu_scenario(
    requests: Sequence[dict[str, Any]],
    nodes: int = 2,
    gpus: int = 4,
    usage: dict[str, float] | None = None,
    *,
    cpus: float = 64,
    teams: list[dict[str, Any]] | None = None,
    events: Sequence[dict[str, Any]] = (),
    name: str = "fast-lane",
    parse: Literal[False] = False,
    **policy: Any,
) -> dict[str, Any]: ...
@overload
def gpu_scenario(
    requests: Sequence[dict[str, Any]],
    nodes: int = 2,
    gpus: int = 4,
    usage: dict[str, float] | None = None,
    *,
    cpus: float = 64,
    teams: list[dict[str, Any]] | None = None,
    events: Sequence[dict[str, Any]] = (),
    name: str = "fast-lane",
    parse: Literal[True],
    **policy: Any,
) -> Scenario: ...
def gpu_scenario(
    requests: Sequence[dict[str, Any]],
    nodes: int = 2,
    gpus: int = 4,
    usage: dict[str, float] | None = None,
    *,
    cpus: float = 64,
    teams: list[dict[str, Any]] | None = None,
    events: Sequence[dict[str, Any]] = (),
    name: str = "fast-lane",
    parse: bool = False,
    **policy: Any,
) -> dict[str, Any] | Scenario:
    """``nodes`` nodes ``n-0``, ``n-1``, … of ``gpus`` GPUs and ``cpus`` CPUs in pool
    ``gpu``, 30 hours long, under the budget policy with the ``policy`` settings.
    ``teams`` defaults to ``a`` and ``b`` with half of the pool each; ``usage`` maps a
    team to the GPU-seconds it was charged an hour before the start; ``events``, node
    health changes. Parsed (`parse_scenario`) when ``parse``."""
    data: dict[str, Any] = {
        "name": name,
        "horizon": 30 * HOUR,
        "policy": {"name": "budget", **policy},
        "pools": [{"name": "gpu", "kind": "gpu"}],
        "nodes": [{"name": "n-{i}", "count": nodes, "pool": "gpu", "gpus": gpus, "cpus": cpus}],
        "teams": teams
        if teams is not None
        else [
            {"name": "a", "share": {"gpu": 0.5}},
            {"name": "b", "share": {"gpu": 0.5}},
        ],
        "usage": [
            {"team": team, "pool": "gpu", "gpu_seconds": seconds, "ago": HOUR}
            for team, seconds in (usage or {}).items()
        ],
        "requests": list(requests),
        "events": list(events),
    }
    return parse_scenario(data) if parse else data


def gpu_request(
    rid: str, team: str, submit: float, gpus: int, klass: str, **extra: Any
) -> dict[str, Any]:
    """A request of `gpu_scenario`: user ``u-<rid>`` asks for ``gpus`` GPUs and 4 CPUs
    of pool ``gpu`` for work of class ``klass`` that takes 20 hours, protected for an
    hour; each keyword sets or replaces a field."""
    return {
        "id": rid,
        "user": f"u-{rid}",
        "team": team,
        "submit": submit,
        "pool": "gpu",
        "gpus": gpus,
        "cpus": 4,
        "min_runtime": HOUR,
        "duration": 20 * HOUR,
        "class": klass,
        **extra,
    }


def debug_request(rid: str, team: str, submit: float) -> dict[str, Any]:
    """A debug session of `gpu_scenario`: one GPU for 20 minutes, protected for 10."""
    return gpu_request(rid, team, submit, 1, "debug", min_runtime=600, duration=1200)


# Simulations and schedulers.


def simulation(
    data: dict[str, Any] | Scenario, observer: CycleObserver | None = None
) -> Simulation:
    """A simulation of ``data`` (parsed first when a dict), not yet run; ``observer``
    sees every cycle."""
    parsed = parse_scenario(data) if isinstance(data, dict) else data
    return Simulation(parsed, observer)


def records_of(data: dict[str, Any] | Scenario) -> dict[str, RequestRecord]:
    """What happened to each request when ``data`` ran, by request id."""
    return simulation(data).run().records


def outcome_of(
    data: dict[str, Any] | Scenario, observer: CycleObserver | None = None
) -> dict[str, Any]:
    """The result document (`scheduler_core.metrics.result`) of a run of ``data``."""
    return result(simulation(data, observer).run())


def rows_of(data: dict[str, Any] | Scenario) -> dict[str, dict[str, Any]]:
    """The result document's request rows of a run of ``data``, by request id."""
    return {row["id"]: row for row in outcome_of(data)["requests"]}


class Idle:
    """An actuator that starts every admission at once and stops nothing."""

    def launch(self, allocation: model.Allocation) -> None:
        pass

    def preempt(self, allocation: model.Allocation, reason: str) -> bool:
        return False


def scheduler(
    data: dict[str, Any] | Scenario | None = None,
    *,
    settings: Settings | None = None,
    pools: Iterable[model.Pool] = (),
    nodes: Iterable[model.Node] = (),
    teams: Iterable[model.Team] = (),
    clock: Clock | None = None,
    actuator: Actuator | None = None,
) -> Scheduler:
    """A scheduler core over a scenario's settings, pools, nodes and teams (``data``,
    parsed first when a dict; its usage and requests are not given to it), or else over
    the parts given (default settings, nothing else). The clock stands at 0 unless
    given; the actuator is `Idle` unless given."""
    if data is not None:
        parsed = parse_scenario(data) if isinstance(data, dict) else data
        settings, pools, nodes, teams = parsed.settings, parsed.pools, parsed.nodes, parsed.teams
    return Scheduler(
        settings if settings is not None else Settings(),
        pools,
        nodes,
        teams,
        clock if clock is not None else VirtualClock(),
        actuator if actuator is not None else Idle(),
    )


# The model: pools, nodes and teams.


def pools(gpu: str = "gpu", cpu: str = "cpu") -> dict[str, model.Pool]:
    """A GPU pool and a CPU pool, by name."""
    return {gpu: model.Pool(gpu, model.PoolKind.GPU), cpu: model.Pool(cpu, model.PoolKind.CPU)}


def node(
    name: str,
    *,
    pool: str = "g",
    gpus: int = 8,
    cpus: float = 64.0,
    memory_gib: float = 512.0,
    mig: Sequence[str] = (),
    gpu_model: str = "virtual GPU",
    memory_mib: int = 0,
    **fields: Any,
) -> model.Node:
    """A node of ``gpus`` virtual GPUs (`model.virtual_gpus`: UUIDs derived from the
    node's name), GPU 0 cut into the ``mig`` instances when given; ``fields`` are the
    node's other fields (labels, health)."""
    devices = model.virtual_gpus(
        name, gpus, model=gpu_model, mig={0: list(mig)} if mig else None, memory_mib=memory_mib
    )
    return model.Node(name, pool, cpus, memory_gib, devices, **fields)


def teams(*names: str, pool: str = "gpu") -> list[model.Team]:
    """Top-level teams with equal shares of ``pool``."""
    return [model.Team(name, {pool: 1 / len(names)}) for name in names]


# Stores.


def sqlite_file_url(directory: Path) -> str:
    """The URL of a SQLite file ``store.sqlite`` in ``directory``."""
    return f"sqlite:///{directory / 'store.sqlite'}"


def store(
    url: str = "sqlite://",
    *,
    pools: Iterable[model.Pool] = (),
    teams: Iterable[model.Team] = (),
    nodes: Iterable[model.Node] = (),
) -> Store:
    """A migrated store on ``url`` (by default a private in-memory SQLite database)
    holding the given pools, teams and nodes; close it, or use it in a ``with``."""
    opened = Store.create(url)
    try:
        if pool_list := list(pools):
            opened.save_pools(pool_list)
        if team_list := list(teams):
            opened.save_teams(team_list)
        if node_list := list(nodes):
            opened.save_nodes(node_list)
    except BaseException:
        opened.close()
        raise
    return opened


# Random scenarios and the invariants every cycle keeps (the property tests).

PROPERTY_TEAMS = ["a", "b", "c", "d"]
"""The teams `scenarios` draws from, in order."""


def only_placeable(data: dict[str, Any]) -> Scenario:
    """The scenario with only the requests its drawn cluster could ever hold (the
    parser refuses the others)."""
    placeable = []
    for candidate in data["requests"]:
        try:
            parse_scenario(data | {"requests": [candidate]})
        except InputError:
            continue
        placeable.append(candidate)
    return parse_scenario(data | {"requests": placeable})


def scenarios() -> SearchStrategy[Scenario]:
    """Random scenarios (hypothesis): up to four GPU nodes in pool ``g``, some with MIG,
    a CPU node in pool ``cpu``, up to four teams of `PROPERTY_TEAMS` with seeded usage,
    up to 30 whole, fractional, MIG and CPU requests, and perhaps a node event."""
    from hypothesis import strategies as st

    @st.composite
    def draw_scenario(draw: st.DrawFn) -> Scenario:
        # The parts are drawn in this order, as they always were: the same seeds give
        # the same scenarios.
        nodes = _draw_nodes(draw)
        teams, usage = _draw_teams(draw)
        requests = [_draw_request(draw, i, teams) for i in range(draw(st.integers(1, 30)))]
        events = []
        if draw(st.booleans()):
            events.append(
                {
                    "at": draw(st.integers(0, 20000)),
                    "node": "g0",
                    "state": draw(st.sampled_from(["draining", "down", "ready"])),
                }
            )
        data = {
            "name": "prop",
            "horizon": 40000,
            "policy": {
                "name": "budget",
                "starvation_bound": 3600,
                # the opt-in rule a team slices itself with must keep every invariant too
                "own_slice_after": draw(st.sampled_from([0, 0, 3600])),
            },
            "pools": [{"name": "g", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"}],
            "nodes": nodes,
            "teams": teams,
            "usage": usage,
            "requests": requests,
            "events": events,
        }
        return only_placeable(data)

    return draw_scenario()


def _draw_nodes(draw: Any) -> list[dict[str, Any]]:
    """One to four GPU nodes in pool ``g`` (some with MIG instances) and the CPU node."""
    from hypothesis import strategies as st

    nodes: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        node: dict[str, Any] = {
            "name": f"g{i}",
            "pool": "g",
            "gpus": gpus,
            "cpus": draw(st.sampled_from([8, 32, 64])),
            "memory_gib": 256,
        }
        if draw(st.booleans()) and gpus >= 2:
            node["mig"] = {"0": ["1g.10gb"] * draw(st.integers(1, 7))}
        nodes.append(node)
    nodes.append({"name": "c0", "pool": "cpu", "cpus": 32, "labels": {"storage": "s1"}})
    return nodes


def _draw_teams(draw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one to four teams sharing 99 %, their seeded usage of pool ``g``)."""
    from hypothesis import strategies as st

    team_count = draw(st.integers(1, 4))
    raw = [draw(st.integers(1, 10)) for _ in range(team_count)]
    teams = [
        {"name": PROPERTY_TEAMS[i], "share": round(w / sum(raw) * 0.99, 4)}
        for i, w in enumerate(raw)
    ]
    usage = [
        {
            "team": t["name"],
            "pool": "g",
            "gpu_seconds": draw(st.sampled_from([0, 1e6, 1e7])),
            "ago": 3600,
        }
        for t in teams
    ]
    return teams, usage


def _draw_request(draw: Any, i: int, teams: list[dict[str, Any]]) -> dict[str, Any]:
    """Request ``r{i}``: whole GPUs (on one or two nodes), a fraction, MIG, or CPU only."""
    from hypothesis import strategies as st

    kind = draw(st.sampled_from(["whole", "fraction", "mig", "cpu"]))
    request: dict[str, Any] = {
        "id": f"r{i}",
        "user": "u",
        "team": draw(st.sampled_from([t["name"] for t in teams])),
        "submit": draw(st.integers(0, 4000)),
        "pool": "g",
        "duration": draw(st.integers(60, 20000)),
        "min_runtime": draw(st.sampled_from([0, 300, 900, 3600, 28800])),
        "resumable": draw(st.booleans()),
        "priority": draw(st.integers(-2, 2)),
        "class": draw(st.sampled_from(["debug", "interactive", "batch"])),
        "cpus": draw(st.sampled_from([1, 4, 8])),
    }
    if kind == "whole":
        request["gpus"] = draw(st.sampled_from([1, 2, 4, 8]))
        request["nodes"] = draw(st.sampled_from([1, 1, 1, 2]))
    elif kind == "fraction":
        request["gpu_fraction"] = draw(st.sampled_from([0.25, 0.5, 0.75]))
    elif kind == "mig":
        request["mig"] = "1g.10gb"
    else:
        request.update(pool="cpu", labels={"storage": "s1"}, **{"class": "dataprep"})
    return request


def watch_protected_windows(simulation: Simulation, reasons: set[str] | None = None) -> list[str]:
    """A list that fills, as the simulation runs, with every preemption of a session on
    a node that is not down made inside its protected window (seen through the
    actuator); ``reasons``, if given, collects every preemption's reason."""
    inside: list[str] = []
    scheduler = simulation.scheduler
    scheduler.actuator = _Watched(scheduler.actuator, simulation, inside, reasons)
    return inside


class _Watched:
    """An actuator that notes preemptions inside protected windows, then passes every
    call on (the compiled simulator's actuator takes no patched methods)."""

    def __init__(
        self, inner: Actuator, simulation: Simulation, inside: list[str], reasons: set[str] | None
    ) -> None:
        self.inner = inner
        self.simulation = simulation
        self.inside = inside
        self.reasons = reasons

    def launch(self, allocation: Allocation) -> None:
        self.inner.launch(allocation)

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        simulation = self.simulation
        now = simulation.clock.now()
        if self.reasons is not None:
            self.reasons.add(reason)
        healthy = all(
            simulation.scheduler.nodes[n].health is not model.Health.DOWN
            for n in allocation.node_names
        )
        if healthy and allocation.protected_until > now + 1e-9:
            self.inside.append(f"{allocation.id} at {now} ({reason})")
        return self.inner.preempt(allocation, reason)


def check_no_double_booking(scheduler: Scheduler) -> None:
    """No device is held twice, and a GPU's fractions add up to at most one whole GPU
    and never share it with a whole-GPU holder."""
    devices: dict[str, str] = {}
    shared: dict[str, int] = defaultdict(int)
    whole: set[str] = set()
    for allocation in scheduler.running.values():
        for grant in allocation.grants:
            for piece in grant.slices:
                if piece.kind is model.SliceKind.FRACTION:
                    shared[piece.gpu_uuid] += piece.milli
                else:
                    assert piece.device_id not in devices, (piece, devices[piece.device_id])
                    devices[piece.device_id] = allocation.id
                    if piece.kind is model.SliceKind.WHOLE:
                        whole.add(piece.gpu_uuid)
    for gpu, milli in shared.items():
        assert milli <= model.MILLI
        assert gpu not in whole


def check_free_matches_allocations(scheduler: Scheduler) -> None:
    """The scheduler's running tally of free capacity equals a recount."""
    import pytest

    recount = Capacity(scheduler.nodes.values(), scheduler.running.values())
    tally = scheduler.view(0.0).free
    assert tally is not None
    for name, fresh in recount.free.items():
        kept = tally[name]
        assert kept.node == fresh.node
        assert (kept.cpus, kept.memory_gib) == pytest.approx((fresh.cpus, fresh.memory_gib))
        assert [g.uuid for g in kept.whole] == [g.uuid for g in fresh.whole]
        assert kept.shared == fresh.shared
        assert {p: sorted(i.uuid for _, i in v) for p, v in kept.mig.items() if v} == {
            p: sorted(i.uuid for _, i in v) for p, v in fresh.mig.items() if v
        }


def check_funded_not_blocked_by_unallocated(
    scheduler: Scheduler, decisions: Decisions, now: float
) -> None:
    """No pending funded request could fit by stopping unallocated work past its grace
    that the policy may stop for it now: a run that checkpoints only just after a
    checkpoint (R10), and never the session whose admission stopped the request (S10)."""
    capacity = Capacity(scheduler.nodes.values(), scheduler.running.values())
    for node_name, holder in scheduler.reservations.items():
        for name in holder:
            capacity.reserved[name] = node_name
    # Past its grace, and not started in this very instant: nothing is stopped in the
    # instant it started (S9), so a debug session the fast lane (S1) placed in this cycle
    # may hold slices a funded request waits for until the next one.
    borrowed = [
        a
        for a in scheduler.running.values()
        if not a.funded and a.protected_until <= now and a.start < now
    ]
    slack = checkpoint_slack(scheduler.settings.cycle_tick)
    for pending in scheduler.pending.values():
        if not scheduler.funded.get(pending.id):
            continue
        wait = slack if pending.nodes == 1 else max(slack, GANG_CHECKPOINT_SLACK)
        # S10: a request that a preemption put back does not stop its stopper in return.
        stopper = scheduler.stopped_by.get(pending.id)
        idle = [
            a
            for a in borrowed
            if at_checkpoint(a.request, now - a.start, wait) and a.request.id != stopper
        ]
        fits = 0
        for node_free in capacity.pool_nodes(pending.pool):
            if not capacity.eligible(node_free, pending):
                continue
            trial = node_free.copy()
            for allocation in idle:
                for grant in allocation.grants:
                    if grant.node == node_free.node.name:
                        trial.give(grant)
            if trial.slices_for(pending) is not None:
                fits += 1
        assert fits < pending.nodes, f"{pending.id} waits while unallocated work holds room"
