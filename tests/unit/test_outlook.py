"""The projected admission order that queue positions show."""

from __future__ import annotations

from harness.builders import request, scenario, scheduler
from scheduler_core.outlook import admission_order
from scheduler_core.scenario import parse_scenario


def order_of(data: dict) -> list[str]:
    parsed = parse_scenario(data)
    core = scheduler(parsed)
    for seeded in parsed.usage:
        core.ledger.add(seeded.team, seeded.pool, seeded.at, seeded.units)
    for waiting in parsed.requests:
        core.submit(waiting)
    return admission_order(core.view(10.0), 10.0)


def test_teams_take_turns_as_each_funded_admission_is_charged() -> None:
    """Team a submitted first, but once its first request is counted against its share,
    team b (still at nothing) comes next: a2 is not second, as a plain sort by the
    teams' ratios now would show."""
    data = scenario(
        requests=[
            request("a1", "a", 0, gpus=2),
            request("a2", "a", 1, gpus=2),
            request("a3", "a", 2, gpus=2),
            request("b1", "b", 3, gpus=2),
            request("b2", "b", 4, gpus=2),
        ]
    )
    assert order_of(data) == ["a1", "b1", "a2", "b2", "a3"]


def test_a_team_over_its_allocation_is_not_charged_and_keeps_its_place_behind() -> None:
    """b has used twice its budget: none of its requests is funded, so it never
    overtakes a, whatever a is charged."""
    data = scenario(
        usage=[{"team": "b", "pool": "g", "gpu_seconds": 2 * 0.5 * 8 * 7 * 86400, "ago": 3600}],
        requests=[
            request("b1", "b", 0),
            request("a1", "a", 1, gpus=4),
            request("a2", "a", 2, gpus=4),
            request("b2", "b", 3),
        ],
    )
    assert order_of(data) == ["a1", "a2", "b1", "b2"]
