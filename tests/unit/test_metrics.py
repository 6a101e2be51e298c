"""The result metrics on scenarios small enough to work out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from harness.builders import DAY, HOUR, outcome_of
from scheduler_core.metrics import result
from scheduler_core.scenario import parse_scenario
from scheduler_core.simulator import Segment, SimRun


def request(rid: str, team: str, submit: int, gpus: int, hours: float) -> dict[str, Any]:
    duration = round(hours * HOUR)
    return {
        "id": rid,
        "user": f"user-{team}",
        "team": team,
        "submit": submit,
        "pool": "h100",
        "gpus": gpus,
        "nodes": 1,
        "cpus": 8,
        "memory_gib": 64,
        "min_runtime": min(duration, 8 * HOUR),
        "duration": duration,
        "resumable": True,
        "class": "batch",
    }


def two_day_scenario() -> dict[str, Any]:
    """One 8-GPU node; team small owns 2 GPUs, team big 6.

    Day 0: big's 8-GPU job runs 0-8 h, protected all along; small's 8-GPU job
    waits from 60 s and runs 8-10 h. Day 1: small runs an 8-GPU job 24-25 h alone.
    """
    return {
        "name": "daily-fulfilment",
        "horizon": 2 * DAY,
        "policy": {"name": "budget"},
        "pools": [{"name": "h100", "kind": "gpu"}],
        "nodes": [{"name": "n1", "pool": "h100", "gpus": 8, "cpus": 96, "memory_gib": 1024}],
        "teams": [
            {"name": "small", "share": {"h100": 0.25}},
            {"name": "big", "share": {"h100": 0.75}},
        ],
        "usage": [],
        "requests": [
            request("r1", "big", 0, 8, 8),
            request("r2", "small", 60, 8, 2),
            request("r3", "small", DAY, 8, 1),
        ],
        "events": [],
    }


@pytest.fixture(scope="module")
def metrics() -> dict[str, Any]:
    out = outcome_of(two_day_scenario())
    starts = {r["id"]: r["starts"] for r in out["requests"]}
    assert starts == {"r1": [0.0], "r2": [8 * HOUR], "r3": [DAY]}  # the story above
    return out["metrics"]


def test_daily_fulfilment_caps_each_day_not_each_hour(metrics: dict[str, Any]) -> None:
    small = metrics["teams"]["small"]
    # Owed: 2 GPUs in each of hours 0-9 of day 0 (waiting or running), and hour 24.
    assert small["owed_gpu_h"] == pytest.approx(22.0)
    # Hourly: only hours 8, 9 and 24 deliver, 2 GPU-h each.
    assert small["delivered_gpu_h"] == pytest.approx(6.0)
    assert small["fulfilment"] == pytest.approx(6 / 22, abs=1e-4)
    # Daily: day 0 used 16 of 20 owed, day 1 used 8 of 2 owed (capped at 2).
    assert small["daily_delivered_gpu_h"] == pytest.approx(18.0)
    assert small["daily_fulfilment"] == pytest.approx(18 / 22, abs=1e-4)


def test_a_team_within_its_share_every_hour_is_whole_either_way(
    metrics: dict[str, Any],
) -> None:
    big = metrics["teams"]["big"]
    assert big["owed_gpu_h"] == pytest.approx(48.0)
    assert big["fulfilment"] == pytest.approx(1.0)
    assert big["daily_delivered_gpu_h"] == pytest.approx(48.0)
    assert big["daily_fulfilment"] == pytest.approx(1.0)


def test_run_daily_fulfilment_sums_top_level_teams(metrics: dict[str, Any]) -> None:
    assert metrics["fulfilment"] == pytest.approx((6 + 48) / 70, abs=1e-4)
    assert metrics["daily_fulfilment"] == pytest.approx((18 + 48) / 70, abs=1e-4)


def test_a_partial_last_day_counts_as_a_day() -> None:
    scenario = two_day_scenario()
    scenario["horizon"] = DAY + 2 * HOUR
    small = outcome_of(scenario)["metrics"]["teams"]["small"]
    assert small["daily_delivered_gpu_h"] == pytest.approx(18.0)
    assert small["daily_fulfilment"] == pytest.approx(18 / 22, abs=1e-4)


def eight_gpus_for_an_hour() -> Any:
    """One node of 8 GPUs, one team, an hour, no requests: runs are made by hand."""
    return parse_scenario(
        {
            "horizon": HOUR,
            "pools": [{"name": "g", "kind": "gpu"}],
            "nodes": [{"name": "g0", "pool": "g", "gpus": 8}],
            "teams": [{"name": "a", "share": {"g": 1.0}}],
            "requests": [],
        }
    )


def test_the_figures_do_not_depend_on_the_order_the_runs_were_recorded_in() -> None:
    """0.2 GPU for 1,138 s, 1 GPU for 1,552 s and 0.1 GPU for 2,292 s on 8 GPUs: an hour's
    occupancy of exactly 0.06975, which the float sum in one order rounds to 0.0697 and in
    the other to 0.0698. A replay rebuilds a run request by request, not in the order
    the simulator closed its stretches, and must still measure what the simulator did."""
    scenario = eight_gpus_for_an_hour()
    stretches = [
        Segment("a", "g", 0.0, end, rate, True)
        for end, rate in ((1138.0, 0.2), (1552.0, 1.0), (2292.0, 0.1))
    ]
    first = result(SimRun(scenario, {}, stretches, 0.0, 0, 0.0))
    other = result(SimRun(scenario, {}, stretches[::-1], 0.0, 0, 0.0))
    assert first["metrics"]["occupancy_hourly"] == [0.0697]
    assert other == first


def test_the_figures_do_not_move_with_times_off_by_less_than_a_store_keeps() -> None:
    """The same three stretches, one of them ending 76 ns late, as a time comes back from
    a store's epoch seconds (kept to about 0.24 µs): the hour's occupancy, exactly on the
    rounding's edge, must read the same."""
    scenario = eight_gpus_for_an_hour()
    ends = ((1138.0, 0.2), (1552.0, 1.0), (2292.0, 0.1))
    stretches = [Segment("a", "g", 0.0, end, rate, True) for end, rate in ends]
    stored = [*stretches[:2], Segment("a", "g", 0.0, 2292.0 + 7.6e-8, 0.1, True)]
    first = result(SimRun(scenario, {}, stretches, 0.0, 0, 0.0))
    assert result(SimRun(scenario, {}, stored, 0.0, 0, 0.0)) == first
