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

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.builders import (
    PROPERTY_TEAMS,
    check_free_matches_allocations,
    check_funded_not_blocked_by_unallocated,
    check_no_double_booking,
    scenarios,
    watch_protected_windows,
)
from scheduler_core.registry import decide
from scheduler_core.scenario import Scenario, parse_scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import Simulation
from scheduler_core.view import Decisions


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_every_cycle(scenario: Scenario) -> None:
    def observe(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
        check_no_double_booking(scheduler)
        check_free_matches_allocations(scheduler)
        # After a cycle over the whole queue that calls for no follow-up: a cycle over
        # new arrivals weighs no one else, and a follow-up comes in the same instant.
        if not decisions.follow_up and scheduler.last_full_cycle == now:
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
@given(scenarios(), st.dictionaries(st.sampled_from(PROPERTY_TEAMS), st.integers(-50, 50)))
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
