"""One small scenario per rule of the scheduling contract (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.builders import (
    DAY,
    HOUR,
    WEEK,
    outcome_of,
    request,
    rows_of,
    scenario,
    scheduler,
    simulation,
)
from scheduler_core import model
from scheduler_core.capacity import Capacity
from scheduler_core.errors import InputError
from scheduler_core.model import Pool, PoolKind, Request, SliceKind, Team
from scheduler_core.ranking import PoolRanking
from scheduler_core.registry import decide
from scheduler_core.rules import oversize
from scheduler_core.scenario import parse_scenario
from scheduler_core.settings import PlacementStrategy, SettingError, Settings, setting_from_text
from scheduler_core.teams import TeamTree
from scheduler_core.view import ClusterView


def heavy_usage(
    team: str, ratio: float, gpus: int = 8, share: float = 0.5, ago: float = 2 * DAY
) -> dict[str, Any]:
    """Seeded usage that puts ``team`` at ``ratio`` of its allocation: charged two days
    ago, inside the week's window but not in the last day's (see test_fast_lane.py);
    with ``ago`` an hour, its last day's share is spent too, so that a request larger
    than its share is not funded as a day slice either."""
    return {"team": team, "pool": "g", "gpu_seconds": ratio * share * gpus * WEEK, "ago": ago}


# Rule 1: order by occupancy ratio; priority only inside a team; then submit time.


def test_lower_occupancy_team_goes_first() -> None:
    # Both arrive together for the one 8-GPU node; b has used less of its share.
    out = rows_of(
        scenario(
            usage=[heavy_usage("a", 0.5)],
            requests=[request("a1", "a", 0, gpus=8), request("b1", "b", 0, gpus=8)],
        )
    )
    assert out["b1"]["starts"][0] == 0
    assert out["a1"]["starts"][0] == 3600


def test_priority_orders_only_inside_a_team() -> None:
    out = rows_of(
        scenario(
            usage=[heavy_usage("a", 0.2)],
            requests=[
                request("a-low", "a", 0, gpus=8, priority=0),
                request("a-high", "a", 5, gpus=8, priority=100),
                request("b-none", "b", 5, gpus=8, priority=-5),
            ],
        )
    )
    # a-low arrives alone and starts at 0; then b (lower ratio) beats a's priority 100.
    assert out["a-low"]["starts"][0] == 0
    assert out["b-none"]["starts"][0] == 3600
    assert out["a-high"]["starts"][0] == 7200


def test_priority_then_submit_time_inside_a_team() -> None:
    out = rows_of(
        scenario(
            requests=[
                request("first", "a", 0, gpus=8),
                request("old", "a", 1, gpus=8),
                request("urgent", "a", 2, gpus=8, priority=3),
            ]
        )
    )
    assert out["urgent"]["starts"][0] < out["old"]["starts"][0]


# Rule 2: funded while under the allocation, else unallocated.


def order_of(data: dict[str, Any]) -> list[str]:
    """The order a cycle at 10 s looks at the waiting requests in (`Decisions.order`,
    what queue positions show)."""
    parsed = parse_scenario(data)
    core = scheduler(parsed)
    for seeded in parsed.usage:
        core.ledger.add(seeded.team, seeded.pool, seeded.at, seeded.units)
    for waiting in parsed.requests:
        core.submit(waiting)
    return list(decide(core.view(10.0), 10.0).order)


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


def test_team_over_its_allocation_runs_unallocated() -> None:
    # a's week and day are spent and 6 GPUs are more than its share now (4 of 8):
    # unallocated.
    out = rows_of(
        scenario(
            usage=[heavy_usage("a", 1.2, ago=HOUR)],
            requests=[request("a1", "a", 0, gpus=6), request("b1", "b", 0, gpus=2)],
        )
    )
    assert out["a1"]["funded"] == [False]
    assert out["b1"]["funded"] == [True]


def test_a_team_is_funded_within_its_share_now_whatever_its_week() -> None:
    # a's week is spent, but its funded sessions stay within its share of the pool now.
    requests = [request("a1", "a", 0, gpus=4), request("a2", "a", 10, gpus=2)]
    out = rows_of(scenario(usage=[heavy_usage("a", 1.2)], requests=requests))
    assert out["a1"]["funded"] == [True]
    assert out["a2"]["funded"] == [False]  # 4 + 2 GPUs would pass the share
    # With the guarantee off only the window budget funds.
    off = rows_of(
        scenario(
            usage=[heavy_usage("a", 1.2)],
            requests=requests,
            policy={"guaranteed_share": 0},
        )
    )
    assert off["a1"]["funded"] == [False]


def test_the_window_budget_funds_at_most_the_burst_above_the_share() -> None:
    # Shares of 8 GPUs each on 16; a has budget to spare. Within 1.25 x 8 = 10 GPUs
    # (the default) its requests are funded: the third 4-GPU one would make 12,
    # unallocated; within 1.5 x 8 = 12 the fourth would make 16.
    nodes = [{"name": f"n{i}", "pool": "g", "gpus": 8} for i in (1, 2)]
    requests = [request(f"a{i}", "a", i, gpus=4) for i in range(4)]
    out = rows_of(scenario(nodes=nodes, requests=requests))
    assert [out[f"a{i}"]["funded"] for i in range(4)] == [[True], [True], [False], [False]]
    wider = rows_of(scenario(nodes=nodes, requests=requests, policy={"funded_burst": 1.5}))
    assert [wider[f"a{i}"]["funded"] for i in range(4)] == [[True], [True], [True], [False]]
    uncapped = rows_of(scenario(nodes=nodes, requests=requests, policy={"funded_burst": 0}))
    assert [uncapped[f"a{i}"]["funded"] for i in range(4)] == [[True]] * 4
    # A request bigger than the cap is funded while it is the team's only funded work.
    big = rows_of(scenario(nodes=nodes, requests=[request("a-big", "a", 0, gpus=8, nodes=2)]))
    assert big["a-big"]["funded"] == [True]


def test_budget_must_cover_the_protected_window() -> None:
    # b has used 99 % of its week; an 8 h protected window on 8 GPUs does not fit in 1 %.
    # (The window budget alone: with the guaranteed share on, 8 GPUs, more than b's
    # share, would be a day slice, funded from b's untouched last day.)
    out = rows_of(
        scenario(
            policy={"guaranteed_share": 0},
            usage=[heavy_usage("b", 0.99)],
            requests=[request("b1", "b", 0, gpus=8, min_runtime=28800, duration=600)],
        )
    )
    assert out["b1"]["funded"] == [False]


# Rule 3: placement.


def placement_cluster() -> dict[str, Any]:
    return scenario(
        nodes=[
            {"name": "full", "pool": "g", "gpus": 8},
            {"name": "empty", "pool": "g", "gpus": 8},
            {"name": "mig", "pool": "g", "gpus": 1, "mig": {"0": ["1g.10gb"] * 7}},
            {"name": "prep-a", "pool": "cpu", "cpus": 32, "labels": {"storage": "weka-a"}},
            {"name": "prep-b", "pool": "cpu", "cpus": 64, "labels": {"storage": "weka-b"}},
        ]
    )


def test_best_fit_keeps_whole_nodes_free() -> None:
    out = rows_of(
        placement_cluster()
        | {
            "requests": [
                request("six", "a", 0, gpus=6, duration=9000),
                request("two", "b", 10, gpus=2),
                request("eight", "a", 20, gpus=8),
            ]
        }
    )
    assert out["two"]["nodes"][0] == out["six"]["nodes"][0]
    assert out["eight"]["nodes"][0] != out["six"]["nodes"][0]
    assert out["eight"]["wait"] == 0


def test_mig_and_label_constraints() -> None:
    out = rows_of(
        placement_cluster()
        | {
            "requests": [
                request("m", "a", 0, gpus=0, mig="1g.10gb"),
                request("d", "b", 0, pool="cpu", gpus=0, cpus=8, labels={"storage": "weka-a"}),
            ]
        }
    )
    assert out["m"]["nodes"] == [["mig"]]
    assert out["d"]["nodes"] == [["prep-a"]]


def test_fractions_pack_onto_one_gpu() -> None:
    data = parse_scenario(placement_cluster())
    capacity = Capacity(data.nodes, [])
    grants = []
    for i, milli in enumerate([500, 250, 250, 500]):
        request = Request(f"f{i}", "u", "a", "g", 0.0, gpu_milli=milli)
        placed = capacity.place(request, PlacementStrategy.BEST_FIT)
        assert placed is not None
        grants.append(placed[0])
    first_gpu = {g.slices[0].gpu_uuid for g in grants[:3]}
    assert len(first_gpu) == 1  # 500 + 250 + 250 fill one GPU exactly
    assert grants[3].slices[0].gpu_uuid not in first_gpu
    assert all(g.slices[0].kind is SliceKind.FRACTION for g in grants)


def test_multi_node_request_gets_distinct_whole_nodes() -> None:
    out = rows_of(placement_cluster() | {"requests": [request("big", "a", 0, gpus=8, nodes=2)]})
    assert sorted(out["big"]["nodes"][0]) == ["empty", "full"]


# Rule 4: preemption.


def test_funded_request_preempts_unallocated_after_grace() -> None:
    out = rows_of(
        scenario(
            usage=[heavy_usage("a", 1.5, ago=HOUR)],
            requests=[
                request("idle-use", "a", 0, gpus=8, duration=50000),
                request("funded", "b", 30, gpus=4, min_runtime=3600),
            ],
        )
    )
    assert out["idle-use"]["funded"][0] is False
    # The grace (60 s) protects it until t=60; then it is preempted for b.
    assert out["funded"]["starts"][0] == 60
    assert out["idle-use"]["preemptions"] >= 1
    assert out["idle-use"]["ends"][0] == 60


def test_never_preempt_inside_a_protected_window() -> None:
    out = rows_of(
        scenario(
            usage=[heavy_usage("a", 0.9)],
            requests=[
                request("a-funded", "a", 0, gpus=8, min_runtime=7200, duration=7200 + 3600),
                request("b-funded", "b", 10, gpus=8, min_runtime=600),
            ],
        )
    )
    assert out["a-funded"]["funded"] == [True, True] or out["a-funded"]["funded"][0]
    assert out["b-funded"]["starts"][0] >= 7200  # not before a's protection ends


def test_no_preemption_of_a_team_that_ranks_above_after_the_swap() -> None:
    # b is *more* occupied than a, so b may not preempt a's funded session even
    # after a's protected window: a would rank below b after the swap.
    out = rows_of(
        scenario(
            usage=[heavy_usage("a", 0.1), heavy_usage("b", 0.6)],
            requests=[
                request("a1", "a", 0, gpus=8, min_runtime=600, duration=7200),
                request("b1", "b", 700, gpus=8, min_runtime=600, duration=600),
            ],
        )
    )
    assert out["a1"]["preemptions"] == 0
    assert out["b1"]["starts"][0] == 7200


def test_lower_ranked_funded_session_past_protection_is_preempted() -> None:
    out = rows_of(
        scenario(
            usage=[heavy_usage("a", 0.6), heavy_usage("b", 0.1)],
            requests=[
                request("a1", "a", 0, gpus=8, min_runtime=600, duration=7200, resumable=True),
                request("b1", "b", 700, gpus=8, min_runtime=600, duration=600),
            ],
        )
    )
    assert out["b1"]["starts"][0] == 700
    assert out["a1"]["preemptions"] == 1
    # Snapshotted: it keeps the 700 s it did, restores its 4 GiB and finishes 6500 s of
    # work after that (model.SNAPSHOT_RESTORE_*).
    assert out["a1"]["finished"]
    restore = model.SNAPSHOT_RESTORE_FIXED_S + model.SNAPSHOT_RESTORE_S_PER_GIB * 4
    assert out["a1"]["ends"][-1] - out["a1"]["starts"][-1] == pytest.approx(6500 + restore)


def short_today(weight: float) -> dict[str, dict[str, Any]]:
    """a ran hard two days ago (0.6 of its week), b in the last hour (0.3 of its week,
    2.1 of its day) and runs twice its share now (funded burst); a asks for its share
    at 700 s, when b's protected windows have ended."""
    return rows_of(
        scenario(
            policy={"funded_burst": 2.0, "day_rank_weight": weight},
            usage=[heavy_usage("a", 0.6), heavy_usage("b", 0.3, ago=HOUR)],
            requests=[
                request("b1", "b", 0, gpus=4, min_runtime=600, duration=7200, resumable=True),
                request("b2", "b", 0, gpus=4, min_runtime=600, duration=7200, resumable=True),
                request("a1", "a", 700, gpus=4, min_runtime=600, duration=600),
            ],
        )
    )


def test_a_team_short_today_ranks_ahead_of_one_over_its_share_today() -> None:
    # The last day weighs in the rank (Settings.day_rank_weight, 0.3 by default):
    # a's rank 0.7 x 0.6 + 0.3 x 0 is ahead of b's 0.7 x 0.3 + 0.3 x 2.1, so a may
    # stop b's work past protection.
    out = short_today(0.3)
    assert out["b1"]["funded"][0] and out["b2"]["funded"][0]
    assert out["a1"]["starts"][0] == 700
    assert out["b1"]["preemptions"] + out["b2"]["preemptions"] == 1
    # With the window alone b ranks ahead (0.3 < 0.6), and a waits for b's work.
    out = short_today(0.0)
    assert out["a1"]["starts"][0] == 7200
    assert out["b1"]["preemptions"] + out["b2"]["preemptions"] == 0


@pytest.mark.parametrize("value", [1.5, -0.1, "a lot", True])
def test_a_day_rank_weight_outside_0_to_1_is_refused_by_name(value: Any) -> None:
    with pytest.raises(InputError) as caught:
        scenario(policy={"day_rank_weight": value}, parse=True)
    assert caught.value.where == "policy.day_rank_weight"
    assert "from 0 to 1" in str(caught.value)
    assert setting_from_text("day_rank_weight", "0.5") == 0.5
    with pytest.raises(SettingError, match="day_rank_weight: 'x' is not a number from 0 to 1"):
        setting_from_text("day_rank_weight", "x")


def siblings(c1_ratio: float, c2_ratio: float) -> dict[str, dict[str, Any]]:
    """Sub-teams c1 and c2 of p, 4 GPUs of share each on one 8-GPU node: c1 runs two
    funded 4-GPU jobs past protection (``funded_burst`` 2), c2 asks for 4 GPUs at 700 s."""
    return rows_of(
        scenario(
            teams=[
                {"name": "p", "share": 1.0},
                {"name": "c1", "share": 0.5, "parent": "p"},
                {"name": "c2", "share": 0.5, "parent": "p"},
            ],
            policy={"funded_burst": 2.0},
            usage=[heavy_usage("c1", c1_ratio), heavy_usage("c2", c2_ratio)],
            requests=[
                request("c1a", "c1", 0, gpus=4, min_runtime=600, duration=7200, resumable=True),
                request("c1b", "c1", 0, gpus=4, min_runtime=600, duration=7200, resumable=True),
                request("c2a", "c2", 700, gpus=4, min_runtime=600, duration=600),
            ],
        )
    )


def test_a_sub_team_ranks_against_its_sibling_at_their_own_level() -> None:
    # Rule 1 compares two teams at the level where their paths split. c2's request,
    # charged, raises the parent's ratio for c1 as much as for c2, so c1 (heavier than
    # c2 under the same parent) ranks below c2 after the swap: its session past
    # protection is a victim. Compared on the whole key, c1's uncharged parent level
    # sorted first and c2 waited for c1 to end.
    out = siblings(0.6, 0.1)
    assert all(out[r]["funded"][0] for r in ("c1a", "c1b"))
    assert out["c2a"]["starts"][0] == 700
    assert out["c1a"]["preemptions"] + out["c1b"]["preemptions"] == 1


def test_a_sub_team_does_not_stop_a_lighter_sibling() -> None:
    # The other side of the same comparison: the heavier sibling never stops the
    # lighter one's work (no ping-pong).
    out = siblings(0.1, 0.6)
    assert out["c2a"]["starts"][0] == 7200
    assert out["c1a"]["preemptions"] + out["c1b"]["preemptions"] == 0


def test_victims_that_lose_least_work_go_first() -> None:
    out = rows_of(
        scenario(
            usage=[heavy_usage("a", 1.5)],
            policy={"guaranteed_share": 0},  # both of a's sessions run unallocated
            requests=[
                request("old", "a", 0, gpus=4, duration=50000),
                request("checkpointed", "a", 0, gpus=4, duration=50000, resumable=True),
                request("b1", "b", 1000, gpus=4),
            ],
        )
    )
    assert out["checkpointed"]["preemptions"] == 1
    assert out["old"]["preemptions"] == 0


def test_min_runtime_is_capped() -> None:
    data = scenario(
        requests=[
            request("long", "a", min_runtime=99999),
            request("dbg", "a", min_runtime=3600, **{"class": "debug"}),
            request("default", "a"),
        ],
        parse=True,
    )
    by_id = {r.id: r for r in data.requests}
    assert by_id["long"].min_runtime == 8 * 3600
    assert by_id["dbg"].min_runtime == 15 * 60
    assert by_id["default"].min_runtime == 3600


# Rule 6: unhealthy nodes.


def test_draining_node_finishes_protection_then_nothing_lands() -> None:
    out = rows_of(
        scenario(
            nodes=[
                {"name": "n1", "pool": "g", "gpus": 8},
                {"name": "n2", "pool": "g", "gpus": 8},
            ],
            requests=[
                request("on-n1", "a", 0, gpus=8, min_runtime=1800, duration=7200, resumable=True),
                request("later", "b", 100, gpus=8, duration=20000),
                request("after-drain", "b", 2000, gpus=4, duration=600),
            ],
            events=[{"at": 50, "node": "n1", "state": "draining"}],
        )
    )
    assert out["on-n1"]["nodes"][0] == ["n1"]
    assert out["on-n1"]["ends"][0] == 1800  # protected window ran out, then drained
    assert out["later"]["nodes"][0] == ["n2"]
    for starts_nodes in out["after-drain"]["nodes"]:
        assert starts_nodes != ["n1"]


def test_down_node_ends_its_sessions_and_takes_no_work() -> None:
    out = rows_of(
        scenario(
            nodes=[
                {"name": "n1", "pool": "g", "gpus": 8},
                {"name": "n2", "pool": "g", "gpus": 4},
            ],
            requests=[request("x", "a", 0, gpus=8, min_runtime=7200, duration=3600)],
            events=[{"at": 600, "node": "n1", "state": "down"}],
        )
    )
    assert out["x"]["ends"][0] == 600
    assert out["x"]["preemptions"] == 1
    assert out["x"]["finished"] is False  # no other node has 8 GPUs


# Rule 7: reservations against starvation.


def starvation_case(
    max_reservations: int,
    a_ratio: float = 0.5,
    held: list[float] | None = None,
    ago: float = 2 * DAY,
) -> dict[str, dict[str, Any]]:
    # b (the lower ratio, so first in line) keeps the one node full of funded,
    # protected 2-GPU sessions; a's 8-GPU request never finds the node empty.
    small = [
        request(f"s{i}", "b", i * 300, gpus=2, duration=1200, resumable=True) for i in range(200)
    ]

    def watch(scheduler: Any, decisions: Any, now: float) -> None:
        if held is not None and "big" in decisions.reservations:
            held.append(now)

    data = scenario(
        horizon=200 * 300 + 7200,
        policy={
            "name": "budget",
            "starvation_bound": 1800,
            "max_reservations_per_pool": max_reservations,
            "funded_burst": 0,
        },
        requests=[request("small0", "b", 0, gpus=2, duration=1200), *small]
        + [request("big", "a", 10, gpus=8, duration=600)],
        usage=[heavy_usage("a", a_ratio, ago=ago)],
    )
    finished = outcome_of(data, watch)
    return {r["id"]: r for r in finished["requests"]}


def test_a_large_request_gets_a_reservation() -> None:
    starved = starvation_case(0)["big"]
    reserved = starvation_case(2)["big"]
    assert starved["wait"] is None or starved["wait"] > 10000
    assert reserved["wait"] is not None and reserved["wait"] <= 1800 + 1200
    assert reserved["funded"] == [True]


def two_starving(policy: dict[str, Any]) -> set[tuple[str, ...]]:
    """The holds seen in the first 6 h: c's 16 protected sessions fill both nodes, and
    a and b, with nothing charged, each wait with a funded 8-GPU request."""
    seen: set[tuple[str, ...]] = set()

    def watch(scheduler: Any, decisions: Any, now: float) -> None:
        if now < 6 * HOUR:
            seen.add(tuple(sorted(decisions.reservations)))

    busy = [request(f"c{i}", "c", 0, duration=8 * HOUR, min_runtime=6 * HOUR) for i in range(16)]
    data = scenario(
        horizon=8 * HOUR,
        nodes=[
            {"name": f"n{i}", "pool": "g", "gpus": 8, "cpus": 64, "memory_gib": 512} for i in (1, 2)
        ],
        teams=[
            {"name": "a", "share": 0.3},
            {"name": "b", "share": 0.3},
            {"name": "c", "share": 0.4},
        ],
        policy={"starvation_bound": 1800, "funded_burst": 0, **policy},
        requests=[*busy, request("ga", "a", 60, gpus=8), request("gb", "b", 60, gpus=8)],
    )
    simulation(data, watch).run()
    return seen


def test_a_pool_holds_for_one_starving_request_at_a_time() -> None:
    # By default one hold per pool (Settings.max_reservations_per_pool): the second
    # starving request waits without draining a node of its own.
    assert max(len(holds) for holds in two_starving({})) == 1
    assert ("ga", "gb") in two_starving({"max_reservations_per_pool": 2})


def test_a_request_that_would_run_unallocated_holds_no_nodes() -> None:
    # The same, but a's week and day are spent: holding the node would idle it for
    # work that any funded request may stop at once.
    held: list[float] = []
    over = starvation_case(2, a_ratio=1.5, held=held, ago=HOUR)["big"]
    assert over["wait"] is None or over["wait"] > 10000
    assert held == []


def test_a_hold_ends_when_its_request_would_no_longer_be_funded() -> None:
    # a's own 2-GPU session keeps the node from ever fitting its 8-GPU request and
    # keeps charging a's week: once "big" would run unallocated, its hold must go.
    # (Funded by the week's budget alone: with the guaranteed share on, a job larger
    # than the share is funded from the day instead and, beside a0, holds nothing.)
    hour = 3600
    small = [
        request(f"s{i}", "b", i * 300, gpus=2, duration=1200, resumable=True) for i in range(432)
    ]
    data = scenario(
        horizon=36 * hour,
        policy={"starvation_bound": 1800, "funded_burst": 0, "guaranteed_share": 0},
        usage=[heavy_usage("a", 0.97)],
        requests=[
            request("a0", "a", 0, gpus=2, duration=48 * hour),
            request("big", "a", 10, gpus=8, duration=600),
            *small,
        ],
    )
    held: list[float] = []

    def watch(scheduler: Any, decisions: Any, now: float) -> None:
        if "big" in decisions.reservations:
            held.append(now)

    run_ = simulation(data, watch).run()
    assert held and held[0] <= 1800 + 300  # held while funded
    assert held[-1] < 12 * hour  # and let go once a's week ran out (about 5 h in)
    starts = [t for r in run_.records.values() if r.team == "b" for t in r.starts]
    assert any(t > held[-1] for t in starts)  # b's work lands there again


def test_a_holder_searches_for_victims_whatever_another_holder_found() -> None:
    # p1 and p2 have one shape (a quarter GPU and a whole node's CPUs) and each holds a
    # node: p1 the one a's own funded a0 keeps, p2 the one b's unallocated b0 keeps
    # through its two-hour grace. When the grace ends, p1's search still fails (a may
    # not stop its own funded work); that must not stop p2 from stopping b0, since a
    # holder's search counts its own held node.
    held: list[dict[str, tuple[str, ...]]] = []

    def watch(scheduler: Any, decisions: Any, now: float) -> None:
        if decisions.reservations:
            held.append(dict(decisions.reservations))

    quarter = {"gpus": 0, "gpu_fraction": 0.25, "cpus": 8}
    data = scenario(
        horizon=12 * HOUR,
        nodes=[
            {"name": "n1", "pool": "g", "gpus": 1, "cpus": 8, "memory_gib": 64},
            {"name": "n2", "pool": "g", "gpus": 1, "cpus": 8, "memory_gib": 64},
        ],
        teams=[{"name": "a", "share": 0.9}, {"name": "b", "share": 0.1}],
        policy={
            "starvation_bound": 1800,
            "unallocated_grace": 2 * HOUR,
            "max_reservations_per_pool": 2,
        },
        usage=[heavy_usage("b", 1.5, gpus=2, share=0.1, ago=HOUR)],
        requests=[
            request("a0", "a", 0, **quarter, duration=30000),
            request("b0", "b", 0, gpus=1, cpus=8, duration=30000),
            request("p1", "a", 10, **quarter, duration=600),
            request("p2", "a", 20, **quarter, duration=600),
        ],
    )
    finished = outcome_of(data, watch)
    out = {r["id"]: r for r in finished["requests"]}
    assert out["b0"]["funded"][0] is False
    assert {"p1": ("n1",), "p2": ("n2",)} in held  # the case above, as set up
    assert out["p2"]["starts"][0] == 2 * HOUR  # not at 30000, when a0 ends
    assert out["b0"]["ends"][0] == 2 * HOUR
    assert out["p1"]["starts"][0] < 30000  # then p1 took n2 once p2 was done


def test_a_team_without_a_share_of_the_pool_is_never_funded_there() -> None:
    out = rows_of(
        scenario(
            teams=[{"name": "a", "share": {"g": 1.0}}, {"name": "b", "share": {"g": 0.0}}],
            requests=[request("b1", "b", 0, gpus=1)],
        )
    )
    assert out["b1"]["funded"] == [False]


def test_a_job_the_size_of_its_share_is_never_larger_than_it() -> None:
    # 0.29 x 100 GPUs is 28.999999999999996 in floating point: a 29-GPU job is the
    # team's share, not larger, wherever it is asked; the guaranteed part scales it.
    settings = Settings()
    assert not oversize(29.0, 0.29 * 100, settings)
    assert oversize(29.5, 0.29 * 100, settings)
    assert oversize(15.0, 0.29 * 100, replace(settings, guaranteed_share=0.5))
    assert not oversize(14.5, 0.29 * 100, replace(settings, guaranteed_share=0.5))


@given(
    top=st.floats(0.05, 0.95),
    child=st.floats(0.05, 0.95),
    gpus=st.integers(1, 2048),
    window=st.sampled_from([DAY, WEEK, 30 * DAY]),
)
def test_the_policys_share_figure_and_the_schedulers_agree(
    top: float, child: float, gpus: int, window: float
) -> None:
    # The policy reads a team's share from its ranking (leaf budget over the window);
    # the time-slice stops and the scheduler's cycle trigger from the team tree (own
    # share x capacity). A job is larger than its share by both or by neither.
    tree = TeamTree.build(
        [
            Team("parent", {"g": top}),
            Team("child", {"g": child}, parent="parent"),
            Team("other", {"g": 1 - top}),
        ]
    )
    view = ClusterView(
        settings=Settings(),
        pools={"g": Pool("g", PoolKind.GPU)},
        nodes=(),
        allocations=(),
        pending=(),
        teams=tree,
        usage={},
        window=window,
        capacity={"g": float(gpus)},
    )
    ranking = PoolRanking(view, "g", 0.0)
    for team in ("parent", "child", "other"):
        from_ranking = ranking.leaf(team)[1] / window
        from_tree = tree.own_share(team, "g") * gpus
        assert from_ranking == pytest.approx(from_tree, rel=1e-12, abs=1e-12)
        for rate in {round(from_tree), round(from_tree, 3), from_tree}:
            assert oversize(rate, from_ranking, view.settings) == oversize(
                rate, from_tree, view.settings
            )
