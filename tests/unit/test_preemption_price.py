"""Issue 49: what a preemption costs, and victims chosen by it.

`Request.lost_seconds` is the one price: the policy weighs victims by it (R4, R8) and
the simulator counts it as lost work. Each case is worked out by hand; the property
test checks the victim search against every other set of victims on a node.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.builders import (
    HOUR,
    ONE_TEAM,
    gpu_request,
    gpu_scenario,
    outcome_of,
    records_of,
)
from scheduler_core import model, verdict
from scheduler_core.capacity import Capacity
from scheduler_core.errors import InputError
from scheduler_core.preemption import (
    CHECKPOINT_SLACK,
    NO_WAIT,
    PRICE_CAP,
    Victims,
    at_checkpoint,
    find_targets,
    lost_work,
    set_cost,
)
from scheduler_core.scenario import parse_scenario
from scheduler_core.simulator import Simulation
from scheduler_core.view import Decisions

# --- the price ------------------------------------------------------------------


def _request(**fields: Any) -> model.Request:
    return model.Request(id="r", user="u", team="a", pool="g", submit=0.0, **{"gpus": 1, **fields})


def test_a_run_that_starts_over_loses_all_of_it_and_its_restart() -> None:
    assert _request().lost_seconds(5000) == 5000
    assert _request(restart_cost=120).lost_seconds(5000) == 5120


def test_a_run_that_checkpoints_loses_the_time_since_its_last_checkpoint() -> None:
    every = _request(resumable=True, checkpoint_every=900, restart_cost=120)
    assert every.lost_seconds(5000) == 5000 - 5 * 900 + 120
    assert every.lost_seconds(1800) == 120  # just checkpointed
    assert every.saved_seconds(5000) == 4500


def test_a_snapshotted_session_loses_its_snapshot_scaled_by_its_memory() -> None:
    # What bench.snapshot measured: 4.81 s to take 1.07 GiB (hot), 7.55 s to restore 1 GiB.
    assert _request(resumable=True, memory_gib=1.07).take_seconds == pytest.approx(4.81, abs=0.01)
    assert _request(resumable=True, memory_gib=1).restart_seconds == pytest.approx(7.55)
    large = _request(resumable=True, memory_gib=100)
    take = model.SNAPSHOT_TAKE_FIXED_S + model.SNAPSHOT_TAKE_S_PER_GIB * 100
    restore = model.SNAPSHOT_RESTORE_FIXED_S + model.SNAPSHOT_RESTORE_S_PER_GIB * 100
    assert large.lost_seconds(10) == pytest.approx(take + restore)
    assert large.saved_seconds(10) == 10


def _one_request(**fields: Any) -> dict[str, Any]:
    return gpu_scenario([gpu_request("r", "a", 0, 1, "batch", **fields)], nodes=1)


def test_a_request_that_checkpoints_is_resumable_unless_it_says_otherwise() -> None:
    parsed = parse_scenario(_one_request(checkpoint_every=900, restart_cost=60)).requests[0]
    assert parsed.resumable and parsed.checkpoint_every == 900 and parsed.restart_cost == 60
    with pytest.raises(InputError) as error:
        parse_scenario(_one_request(checkpoint_every=900, resumable=False))
    assert error.value.where == "requests[0].checkpoint_every"
    with pytest.raises(InputError) as error:
        parse_scenario(_one_request(restart_cost=-1))
    assert error.value.where == "requests[0].restart_cost"


def _guest_and_owner(**guest: Any) -> dict[str, Any]:
    """One 8-GPU node. guest (no share) runs an 8-GPU batch job of 10 h from 0,
    unallocated; at 2 h 10 min owner (all of the share) needs the node for 1 h."""
    data = gpu_scenario(
        [
            gpu_request("job", "guest", 0, 8, "batch", duration=10 * HOUR, **guest),
            gpu_request("own", "owner", 7800, 8, "batch", duration=HOUR),
        ],
        nodes=1,
        gpus=8,
        teams=[{"name": "owner", "share": {"gpu": 1.0}}, {"name": "guest", "share": {}}],
    )
    data["horizon"] = 24 * HOUR
    return data


def test_the_simulator_runs_again_what_a_checkpointing_job_threw_away() -> None:
    """The owner's request at 7,800 s waits for the job's next checkpoint (R10: 8,100 s,
    the ninth of 900 s) and stops it then: the job keeps 8,100 s, its second run starts
    with its 120 s restart, and only that restart is lost, x 8 GPUs."""
    out = outcome_of(_guest_and_owner(checkpoint_every=900, restart_cost=120))
    job = next(r for r in out["requests"] if r["id"] == "job")
    assert job["starts"] == [0.0, 8100 + HOUR]
    assert job["ends"] == [8100, pytest.approx(8100 + HOUR + 120 + 10 * HOUR - 8100)]
    metrics = out["metrics"]
    assert metrics["lost_gpu_seconds"] == pytest.approx(120 * 8)
    assert metrics["lost_gpu_h_by_class"]["batch"] == round(120 * 8 / HOUR, 2)
    # Counted to the stop that caused it: a funded request's reclaim of borrowed work.
    assert out["lost_gpu_h_by_stop"] == {
        "funded/borrowed/batch/checkpoint": round(120 * 8 / HOUR, 2)
    }


def test_a_restarted_run_checkpoints_on_its_own_clock() -> None:
    """A run's checkpoints fall every ``checkpoint_every`` seconds from its start, its
    restart included (`Request.saved_seconds`, the clock the policy's price reads): a
    second run stopped 1,000 s in keeps 900 s less its 120 s restart, and loses 220 s."""
    job = _request(resumable=True, checkpoint_every=900, restart_cost=120)
    assert job.saved_seconds(1000) == 900
    assert job.lost_seconds(1000) == 100 + 120


def test_a_job_with_no_checkpoint_loses_its_whole_run() -> None:
    """Funded on the whole node, the job is stopped by the node going down at 7,800 s
    (R6, whatever its price) and starts over on the node's return."""
    data = gpu_scenario(
        [gpu_request("job", "owner", 0, 8, "batch", duration=10 * HOUR, resumable=False)],
        nodes=1,
        gpus=8,
        teams=[{"name": "owner", "share": {"gpu": 1.0}}],
    )
    data["events"] = [
        {"at": 7800, "node": "n-0", "state": "down"},
        {"at": 7800 + HOUR, "node": "n-0", "state": "ready"},
    ]
    data["horizon"] = 24 * HOUR
    out = outcome_of(data)
    job = next(r for r in out["requests"] if r["id"] == "job")
    assert job["ends"][-1] == pytest.approx(7800 + HOUR + 10 * HOUR)
    assert out["metrics"]["lost_gpu_seconds"] == pytest.approx(7800 * 8)


# --- victims by their price ----------------------------------------------------

NODE = model.Node("n", "g", cpus=256, memory_gib=4096, gpus=model.virtual_gpus("n", 8))
NOW = 20000.0


@st.composite
def _node_state(draw: st.DrawFn) -> tuple[list[model.Allocation], int]:
    """Sessions of teams b (funded) and c (unallocated) on one 8-GPU node, each of 1, 2
    or 4 GPUs, started at some time before ``NOW`` and priced three ways; and the GPUs a
    request of team a asks for, more than are free."""
    gpus = iter(NODE.gpus)
    left = 8
    allocations = []
    for i in range(draw(st.integers(1, 8))):
        size = draw(st.sampled_from([1, 1, 2, 4]))
        if size > left:
            break
        left -= size
        price = draw(st.sampled_from(["none", "checkpoint", "snapshot"]))
        funded = draw(st.booleans())
        request = model.Request(
            id=f"v{i}",
            user="u",
            team="b" if funded else "c",
            pool="g",
            submit=0.0,
            gpus=size,
            memory_gib=draw(st.sampled_from([1.0, 16.0, 64.0])),
            resumable=price != "none",
            checkpoint_every=900.0 if price == "checkpoint" else 0.0,
            restart_cost=draw(st.sampled_from([0.0, 60.0, 300.0])),
        )
        slices = tuple(model.Slice(next(gpus).uuid, model.SliceKind.WHOLE) for _ in range(size))
        start = NOW - draw(st.integers(1, 5000))
        allocations.append(
            model.Allocation(
                request, (model.NodeGrant("n", slices, 1.0, 1.0),), start, funded, start, size
            )
        )
    want = draw(st.integers(left + 1, 8)) if left < 8 else 8
    return allocations, want


def _rounded(cost: tuple[float, float, float, float]) -> tuple[float, ...]:
    """A set's cost with its lost work rounded: sums in another order differ in the last
    bits."""
    return (cost[0], cost[1], round(cost[2], 6), cost[3])


def _fits(free: int, chosen: tuple[model.Allocation, ...], want: int) -> bool:
    return free + sum(a.request.gpus for a in chosen) >= want


@settings(max_examples=300, deadline=None)
@given(_node_state(), st.sampled_from([NO_WAIT, CHECKPOINT_SLACK]))
def test_the_victims_chosen_are_the_cheapest_set_that_makes_room_and_none_is_unneeded(
    state: tuple[list[model.Allocation], int], slack: float
) -> None:
    """R4: against every other set of the sessions a's request may stop (b's funded ones
    within R8's price, c's unallocated ones; with R10's ``slack``, those that checkpoint
    only just after a checkpoint), the chosen set costs no more, and each of its victims
    is needed."""
    allocations, want = state
    free = 8 - sum(a.request.gpus for a in allocations)
    request = model.Request(id="q", user="u", team="a", pool="g", submit=0.0, gpus=want)
    capacity = Capacity([NODE], allocations)
    victims = Victims(allocations, NOW)
    victims.wait_for_checkpoints(slack, slack)
    targets = find_targets(request, capacity, victims, frozenset({"b"}), NOW)
    may_stop = [
        a
        for a in allocations
        if (not a.funded or a.request.lost_seconds(NOW - a.start) <= PRICE_CAP)
        and at_checkpoint(a.request, NOW - a.start, slack)
    ]
    others = [
        chosen
        for size in range(1, len(may_stop) + 1)
        for chosen in itertools.combinations(may_stop, size)
        if _fits(free, chosen, want)
    ]
    if targets is None:
        assert not others
        return
    (target,) = targets
    chosen = target.victims
    assert {a.id for a in chosen} <= {a.id for a in may_stop} and _fits(free, chosen, want)
    cost = _rounded(set_cost(chosen, NOW, victims))
    assert all(cost <= _rounded(set_cost(other, NOW, victims)) for other in others)
    for victim in chosen:
        assert not _fits(free, tuple(v for v in chosen if v is not victim), want)


def _decisions(data: dict[str, Any]) -> list[Decisions]:
    seen: list[Decisions] = []
    Simulation(parse_scenario(data), lambda _s, d, _t: seen.append(d)).run()
    return seen


def test_the_verdict_says_why_each_victim_was_chosen_and_what_it_cost() -> None:
    """One 4-GPU node, a with no usage. b's funded job (checkpointing, 2 GPUs), c's
    unallocated notebook (1 GPU, snapshotted) and b's borrowed job far from its first
    checkpoint (1 GPU) run; a's 3-GPU request comes at 2 h 6 min 40 s, 400 s after the
    job's checkpoint, waits for the next one (R10: 2 h 10 min, when the scheduler wakes)
    and then stops the cheapest set that makes room: both, one a borrower, one of a
    team ranking below."""
    data = gpu_scenario(
        [
            gpu_request("bj", "b", 0, 2, "batch", checkpoint_every=600, restart_cost=60),
            gpu_request("cn", "c", 0, 1, "interactive", resumable=True, memory_gib=8),
            gpu_request("fill", "b", 0, 1, "batch", checkpoint_every=20 * HOUR),
            gpu_request("a1", "a", 2 * HOUR + 400, 3, "batch", duration=HOUR),
        ],
        nodes=1,
        usage={"b": 4 * 24 * HOUR},
        teams=[
            {"name": "a", "share": {"gpu": 0.5}},
            {"name": "b", "share": {"gpu": 0.5}},
            {"name": "c", "share": {}},
        ],
    )
    verdicts = [d.verdicts["a1"] for d in _decisions(data) if "a1" in d.verdicts]
    placed = next(v for v in verdicts if v.placed)
    assert placed.reason == verdict.PREEMPTS
    why = {v.allocation_id: v for v in placed.victims}
    assert set(why) == {"bj", "cn"} == set(placed.preempts)
    assert why["cn"].code == verdict.VICTIM_BORROWED
    assert why["bj"].code == verdict.VICTIM_BELOW
    assert records_of(data)["a1"].starts[0] == 2 * HOUR + 600
    # bj: just checkpointed, so its 60 s restart only, on 2 GPUs.
    assert why["bj"].cost == pytest.approx(60 * 2)
    cn = parse_scenario(data).requests[1]
    assert why["cn"].cost == pytest.approx(cn.lost_seconds(0))
    for code in (why["bj"].code, why["cn"].code):
        assert code in verdict.VICTIM_CODES and verdict.message(code) != code


def test_lost_work_is_the_price_at_the_victims_size() -> None:
    request = _request(resumable=True, checkpoint_every=600, gpus=4)
    allocation = model.Allocation(request, (), 0.0, True, 0.0, 4.0)
    assert lost_work(allocation, 1000.0) == 400 * 4


# --- stopped at a checkpoint (R10) --------------------------------------------


def test_a_debug_session_does_not_wait_for_a_checkpoint() -> None:
    """R10 spares the fast lane (S1): owner's debug session at 7,800 s stops the guest's
    borrowed job at once, 600 s after its last checkpoint, not at the next one."""
    data = _guest_and_owner(checkpoint_every=900, restart_cost=120)
    data["requests"][1] = gpu_request("own", "owner", 7800, 1, "debug", duration=600)
    records = records_of(data)
    assert records["own"].starts == [7800]
    assert records["job"].ends[0] == 7800


def test_a_day_slice_ends_at_its_next_checkpoint() -> None:
    """R10 at S5's stop: one 8-GPU node; a (2 GPUs of share) runs an 8-GPU job that
    checkpoints every 3,000 s, funded as a day slice until a's day share is charged at
    6 h (21,600 s); b's waiting job ranks below it. Then 600 s from its checkpoint, which
    R8 would let go, the slice runs on to its next checkpoint (24,000 s) and is stopped
    then, with nothing since it to lose."""
    data = gpu_scenario(
        [
            gpu_request("a1", "a", 0, 8, "batch", checkpoint_every=3000),
            gpu_request("b1", "b", 1800, 6, "batch", resumable=True),
        ],
        nodes=1,
        gpus=8,
        day_rank_weight=0,
        teams=[{"name": "a", "share": {"gpu": 0.25}}, {"name": "b", "share": {"gpu": 0.75}}],
    )
    data["usage"] = [
        {"team": "b", "pool": "gpu", "gpu_seconds": 0.9 * 6 * 7 * 24 * HOUR, "ago": 48 * HOUR}
    ]
    out = outcome_of(data)
    a1 = next(r for r in out["requests"] if r["id"] == "a1")
    assert a1["starts"][0] == 0 and a1["ends"][0] == pytest.approx(24000)


def test_a_checkpoint_a_few_ulps_ahead_of_the_run_clock_counts_as_taken() -> None:
    """The cycle woken at a checkpoint reads the run's clock as now less its start: at
    these times, a few ulps short of the checkpoint. It is still at its checkpoint, with
    nothing since it to lose (a replayed history, whose times are shifted by ulps, must
    decide as the run it replays)."""
    start = 260447.01659774434
    elapsed = (start + 1920.0) - start
    assert elapsed < 1920.0
    request = _request(resumable=True, checkpoint_every=1920, restart_cost=120)
    assert at_checkpoint(request, elapsed, CHECKPOINT_SLACK)
    assert request.lost_seconds(elapsed) == 120
    assert request.saved_seconds(elapsed) == elapsed
    assert not at_checkpoint(request, 1920.0 - 0.01, CHECKPOINT_SLACK)


def test_a_protected_run_wakes_the_scheduler_at_its_first_checkpoint_after_the_window() -> None:
    """R10's wake-ups: a's funded job (protected for an hour, a checkpoint every 900 s)
    fills the one node and b's job waits. No rule stops a protected session, so its
    checkpoints at 900, 1,800 and 2,700 s wake nothing: the next wake-up is the window's
    end at 3,600 s (which falls on a checkpoint), and after it the checkpoint at 4,500 s."""
    scenario = gpu_scenario(
        [
            gpu_request("a1", "a", 0, 4, "batch", checkpoint_every=900, min_runtime=HOUR),
            gpu_request("b1", "b", 10, 4, "batch", resumable=True),
        ],
        nodes=1,
        parse=True,
    )
    sim = Simulation(scenario)
    scheduler = sim.scheduler
    requests = {r.id: r for r in scenario.requests}
    scheduler.submit(requests["a1"])
    scheduler.settle()
    assert "a1" in scheduler.running
    sim.clock.time = 10.0
    scheduler.submit(requests["b1"])
    scheduler.settle()
    assert "b1" in scheduler.pending
    assert scheduler.next_wake() == HOUR
    sim.clock.time = HOUR
    scheduler.settle()
    assert scheduler.next_wake() == HOUR + 900


def test_the_end_of_a_run_a_preemption_already_ended_wakes_no_cycle() -> None:
    """x runs on n-0 from 0 s, meant to end at 1,000 s; n-0's drain stops it at 100 s and
    it starts over on n-1. Its first run's end, still in the simulator's queue, is nothing
    the live Hub would see: the cycles are at 0, 100 and 1,100 s only (a cycle at
    1,000 s, where the budget's recheck was due and a node drains, was one no live
    Hub ran, and a replay of the run could not repeat it)."""
    scenario = gpu_scenario(
        [gpu_request("x", "a", 0, 1, "batch", min_runtime=0, duration=1000)],
        gpus=1,
        teams=ONE_TEAM,
        events=[{"at": 100, "node": "n-0", "state": "draining"}],
        parse=True,
    )
    scenario = dataclasses.replace(scenario, horizon=3000.0)  # before the drain's later wakes
    cycles: list[float] = []
    run = Simulation(scenario, lambda _s, _d, now: cycles.append(now)).run()
    assert run.records["x"].starts == [0.0, 100.0]
    assert run.records["x"].finish_time == 1100.0
    assert sorted(set(cycles)) == [0.0, 100.0, 1100.0]


# --- no turns (S10) and a session kept for its price (R9) ---------------------


def test_two_requests_do_not_take_turns_stopping_each_other() -> None:
    """Issue 38's case: one 4-GPU node; teams with shares 0.06, 0.31 and 0.62; a's
    0.25-GPU debug session and b's 4-GPU notebook, both at 0, no grace and no minimum
    runtime. Each may stop the other (a and b are both above their shares); once one
    has stopped the other, it is not stopped by it in return (S10)."""
    for resumable in (False, True):
        data = gpu_scenario(
            [
                gpu_request(
                    "dbg", "a", 0, 0, "debug", gpu_fraction=0.25, min_runtime=0, duration=1200
                ),
                gpu_request(
                    "big",
                    "b",
                    0,
                    4,
                    "interactive",
                    min_runtime=0,
                    duration=30000,
                    resumable=resumable,
                ),
            ],
            nodes=1,
            unallocated_grace=0,
            teams=[
                {"name": "a", "share": {"gpu": 0.06}},
                {"name": "b", "share": {"gpu": 0.31}},
                {"name": "c", "share": {"gpu": 0.62}},
            ],
        )
        del data["requests"][0]["gpus"]
        records = records_of(data)
        assert records["dbg"].finished and records["big"].finished
        stopped = [p for d in _decisions(data) for p in d.preemptions if p.for_request]
        pairs = {(p.allocation_id, p.for_request) for p in stopped}
        assert not {("dbg", "big"), ("big", "dbg")} <= pairs, stopped


def test_a_snapshotted_borrower_is_kept_for_its_own_restart_price() -> None:
    """R9: c's unallocated 1-GPU notebook of 64 GiB costs its snapshot to stop; it is
    protected that long (not only the 60 s grace), and stopped once it has run it."""
    data = gpu_scenario(
        [
            gpu_request("cn", "c", 0, 4, "interactive", resumable=True, memory_gib=64),
            gpu_request("a1", "a", 30, 4, "batch"),
        ],
        nodes=1,
        teams=[{"name": "a", "share": {"gpu": 1.0}}, {"name": "c", "share": {}}],
    )
    cn = parse_scenario(data).requests[0]
    price = cn.restart_seconds + cn.take_seconds
    assert price > 300
    records = records_of(data)
    assert records["cn"].ends[0] == pytest.approx(price)
    assert records["a1"].starts[0] == pytest.approx(price)


# --- R11: what borrows first ------------------------------------------------------


def test_the_least_a_reclaim_throws_away() -> None:
    """R11's price (`Request.reclaim_seconds`): a run that checkpoints, its restart; a
    snapshotted session, its take and restore; work that cannot resume, all of its run."""
    assert _request(resumable=True, checkpoint_every=900, restart_cost=120).reclaim_seconds == 120
    notebook = _request(resumable=True, memory_gib=240)
    assert notebook.reclaim_seconds == pytest.approx(notebook.lost_seconds(0))
    assert notebook.reclaim_seconds > model.BORROW_PRICE_CAP
    assert _request(resumable=True, memory_gib=16).reclaim_seconds < model.BORROW_PRICE_CAP
    assert _request().reclaim_seconds == float("inf")


def _two_borrowers(gpus: int) -> dict[str, Any]:
    """A node of ``gpus`` GPUs that nobody's share funds work on (team a owns it and
    asks for nothing). At 0, c's 4-GPU notebook (240 GiB, snapshotted: 1,265 s to stop)
    and d's 4-GPU job that checkpoints every 15 min (a 60 s restart) both want to borrow
    it; c sorts first (equal ranks, equal submit times, then the team's name)."""
    return gpu_scenario(
        [
            gpu_request(
                "cn", "c", 0, 4, "interactive", resumable=True, memory_gib=240, duration=HOUR
            ),
            gpu_request(
                "dj", "d", 0, 4, "batch", checkpoint_every=900, restart_cost=60, duration=2 * HOUR
            ),
        ],
        nodes=1,
        gpus=gpus,
        teams=[
            {"name": "a", "share": {"gpu": 1.0}},
            {"name": "c", "share": {}},
            {"name": "d", "share": {}},
        ],
    )


def test_work_cheap_to_reclaim_borrows_before_work_dear_to_reclaim() -> None:
    """R11: c's notebook sorts first, but its reclaim would throw away 1,265 s of its size
    and d's job's 60 s: d's job borrows the node, and the notebook runs when it ends."""
    records = records_of(_two_borrowers(gpus=4))
    assert records["dj"].starts == [0.0]
    assert records["cn"].starts == [pytest.approx(2 * HOUR)]


def test_work_dear_to_reclaim_borrows_what_the_rest_leaves() -> None:
    """R11 orders borrowers; it leaves nothing idle: on 8 GPUs both borrow at once."""
    records = records_of(_two_borrowers(gpus=8))
    assert records["dj"].starts == [0.0]
    assert records["cn"].starts == [0.0]
