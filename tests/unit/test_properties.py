"""Properties of the policy over random clusters and request streams (hypothesis).

Every cycle of a simulated run is checked: no slice is booked twice, nothing
is preempted inside its protected window, a funded request never waits while
unallocated work past its grace holds room it would fit in, and charged usage
equals the funded time. A separate property shows that declared priority
cannot move work between teams.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_core.capacity import Capacity
from scheduler_core.errors import InputError
from scheduler_core.model import MILLI, Health, SliceKind
from scheduler_core.registry import decide
from scheduler_core.scenario import Scenario, parse_scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import Simulation
from scheduler_core.view import Decisions

TEAMS = ["a", "b", "c", "d"]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
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
    team_count = draw(st.integers(1, 4))
    raw = [draw(st.integers(1, 10)) for _ in range(team_count)]
    teams = [{"name": TEAMS[i], "share": round(w / sum(raw) * 0.99, 4)} for i, w in enumerate(raw)]
    usage = [
        {
            "team": t["name"],
            "pool": "g",
            "gpu_seconds": draw(st.sampled_from([0, 1e6, 1e7])),
            "ago": 3600,
        }
        for t in teams
    ]
    requests: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 30))):
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
        requests.append(request)
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


def only_placeable(data: dict[str, Any]) -> Scenario:
    """The scenario with only the requests its drawn cluster could ever hold (the
    parser refuses the others)."""
    placeable = []
    for request in data["requests"]:
        try:
            parse_scenario(data | {"requests": [request]})
        except InputError:
            continue
        placeable.append(request)
    return parse_scenario(data | {"requests": placeable})


def watch_protected_windows(simulation: Simulation, reasons: set[str] | None = None) -> list[str]:
    """A list that fills, as the simulation runs, with every preemption of a session on
    a node that is not down made inside its protected window (seen through the
    actuator); ``reasons``, if given, collects every preemption's reason."""
    inside: list[str] = []
    actuator = simulation.scheduler.actuator
    real_preempt = actuator.preempt

    def preempt(allocation: Any, reason: str) -> bool:
        now = simulation.clock.now()
        if reasons is not None:
            reasons.add(reason)
        healthy = all(
            simulation.scheduler.nodes[n].health is not Health.DOWN for n in allocation.node_names
        )
        if healthy and allocation.protected_until > now + 1e-9:
            inside.append(f"{allocation.id} at {now} ({reason})")
        return real_preempt(allocation, reason)

    actuator.preempt = preempt  # type: ignore[method-assign]
    return inside


def check_no_double_booking(scheduler: Scheduler) -> None:
    devices: dict[str, str] = {}
    shared: dict[str, int] = defaultdict(int)
    whole: set[str] = set()
    for allocation in scheduler.running.values():
        for grant in allocation.grants:
            for piece in grant.slices:
                if piece.kind is SliceKind.FRACTION:
                    shared[piece.gpu_uuid] += piece.milli
                else:
                    assert piece.device_id not in devices, (piece, devices[piece.device_id])
                    devices[piece.device_id] = allocation.id
                    if piece.kind is SliceKind.WHOLE:
                        whole.add(piece.gpu_uuid)
    for gpu, milli in shared.items():
        assert milli <= MILLI
        assert gpu not in whole


def check_free_matches_allocations(scheduler: Scheduler) -> None:
    """The scheduler's running tally of free capacity equals a recount."""
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
    """No pending funded request could fit by stopping unallocated work past its grace."""
    capacity = Capacity(scheduler.nodes.values(), scheduler.running.values())
    for node, holder in scheduler.reservations.items():
        for name in holder:
            capacity.reserved[name] = node
    idle = [a for a in scheduler.running.values() if not a.funded and a.protected_until <= now]
    for request in scheduler.pending.values():
        if not scheduler.funded.get(request.id):
            continue
        fits = 0
        for node_free in capacity.pool_nodes(request.pool):
            if not capacity.eligible(node_free, request):
                continue
            trial = node_free.copy()
            for allocation in idle:
                for grant in allocation.grants:
                    if grant.node == node_free.node.name:
                        trial.give(grant)
            if trial.slices_for(request) is not None:
                fits += 1
        assert fits < request.nodes, f"{request.id} waits while unallocated work holds room"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_every_cycle(scenario: Scenario) -> None:
    def observe(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
        check_no_double_booking(scheduler)
        check_free_matches_allocations(scheduler)
        if not decisions.follow_up:
            check_funded_not_blocked_by_unallocated(scheduler, decisions, now)

    simulation = Simulation(scenario, observe)
    preempted_inside = watch_protected_windows(simulation)
    run = simulation.run()
    assert not preempted_inside

    charged: dict[tuple[str, str], float] = defaultdict(float)
    for segment in run.segments:
        if segment.funded:
            charged[(segment.team, segment.pool)] += segment.rate * (segment.end - segment.start)
    ledger = simulation.scheduler.ledger
    for (team, pool), units in charged.items():
        seeded = sum(u.units for u in scenario.usage if u.team == team and u.pool == pool)
        total = ledger.charged(team, pool, -1e12, scenario.horizon) - seeded
        assert abs(total - units) < 1e-6 * max(1.0, units)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.dictionaries(st.sampled_from(TEAMS), st.integers(-50, 50)))
def test_priority_never_moves_work_between_teams(
    scenario: Scenario, offsets: dict[str, int]
) -> None:
    """Shifting every priority of a team by a constant changes no decision at all."""

    def decisions_of(scn: Scenario) -> list[tuple[Any, ...]]:
        seen: list[tuple[Any, ...]] = []

        def observe(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
            seen.append(
                (
                    now,
                    decisions.order,
                    tuple((a.request.id, a.grants, a.funded) for a in decisions.admissions),
                    tuple(p.allocation_id for p in decisions.preemptions),
                )
            )

        Simulation(scn, observe).run()
        return seen

    shifted = dataclasses.replace(
        scenario,
        requests=tuple(
            dataclasses.replace(r, priority=r.priority + offsets.get(r.team, 0))
            for r in scenario.requests
        ),
    )
    assert decisions_of(scenario) == decisions_of(shifted)


def test_decide_does_not_change_its_view() -> None:
    data = parse_scenario(
        {
            "name": "pure",
            "horizon": 100,
            "pools": [{"name": "g", "kind": "gpu"}],
            "nodes": [{"name": "n", "pool": "g", "gpus": 8}],
            "teams": [{"name": "a", "share": 1.0}],
            "requests": [
                {"id": "x", "team": "a", "pool": "g", "gpus": 4, "duration": 10},
                {"id": "y", "team": "a", "pool": "g", "gpus": 8, "duration": 10},
            ],
        }
    )
    simulation = Simulation(data)
    for request in data.requests:
        simulation.scheduler.submit(request)
    view = simulation.scheduler.view(0.0)
    before = repr(view)
    first = decide(view, 0.0)
    second = decide(view, 0.0)
    assert repr(view) == before
    assert first == second
