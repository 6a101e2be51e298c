"""The rules that serve a saturated cluster: the debug fast lane and held-node backfill.

Each test runs a small scenario through the simulator (the same policy code as the
live scheduler) in which the rule, and only the rule, lets a request start when it
does; without the rule the request waits hours.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.builders import (
    HOUR,
    debug_request,
    gpu_request,
    gpu_scenario,
    records_of,
    scheduler,
    simulation,
)
from scheduler_core.errors import InputError
from scheduler_core.kept import queue_key
from scheduler_core.model import Request, RequestClass
from scheduler_core.registry import decide
from scheduler_core.scenario import parse_scenario
from scheduler_core.simulator import RequestRecord

WEEK_GPU_S = 7 * 24 * HOUR


def test_debug_comes_first_in_its_teams_queue_whatever_its_priority_or_submit_time() -> None:
    batch = Request("x", "u", "a", "gpu", 0.0, gpus=4, priority=3, klass=RequestClass.BATCH)
    debug = Request("d", "u", "a", "gpu", 50.0, gpus=1, priority=0, klass=RequestClass.DEBUG)
    assert sorted([batch, debug], key=queue_key) == [debug, batch]

    # One node, full until 1 h with a's protected notebook. a's high-priority batch job
    # (4 GPUs) was submitted before a's debug session; when the node frees, the debug
    # session goes first, so the batch job no longer fits and waits.
    requests = [
        gpu_request("a0", "a", 0, 4, "interactive", min_runtime=HOUR, duration=HOUR),
        gpu_request("x", "a", 10, 4, "batch", priority=3, resumable=True),
        debug_request("d", "a", 20),
    ]
    records = records_of(gpu_scenario(requests, nodes=1))
    assert records["d"].starts[0] == pytest.approx(HOUR)
    assert records["x"].starts[0] >= HOUR + 1200


def test_debug_sessions_of_every_team_come_before_any_teams_other_work() -> None:
    # One node, full until 1 h with b's protected notebook. a has used far more of its
    # budget than b, so b's team comes first; still, when the node frees, a's debug
    # session (submitted after b's batch job) starts, and b's batch job, which no
    # longer fits, waits the 10 min until it ends. Without the rule the batch job
    # takes the node and the debug session waits at least for its hour of protection.
    requests = [
        gpu_request("b0", "b", 0, 4, "interactive", min_runtime=HOUR, duration=HOUR),
        gpu_request("x", "b", 10, 4, "batch", resumable=True),
        gpu_request("d", "a", 20, 1, "debug", min_runtime=600, duration=600),
    ]
    records = records_of(gpu_scenario(requests, nodes=1, usage={"a": WEEK_GPU_S}))
    assert records["d"].starts == [pytest.approx(HOUR)]
    assert records["d"].finish_time == pytest.approx(HOUR + 600)
    assert records["x"].starts[0] == pytest.approx(HOUR + 600)


def test_an_unfunded_debug_session_that_stopped_funded_work_keeps_its_place() -> None:
    # Only the window budget funds (guaranteed_share 0): a has spent its budget, b has
    # not and runs two funded 2-GPU jobs, twice its share (funded_burst 2). a's debug
    # session at 2 h runs unallocated; the lane stops one of b's jobs for it (b is above
    # its share). It then keeps its place for its protected window, not the 60 s grace
    # of unallocated work: before, b's job came back a minute later and stopped it,
    # and the lane stopped b's work for it again, over and over.
    requests = [
        gpu_request("b1", "b", 0, 2, "batch", resumable=True),
        gpu_request("b2", "b", 0, 2, "batch", resumable=True),
        gpu_request("d", "a", 2 * HOUR, 1, "debug", min_runtime=600, duration=600),
    ]
    scenario = gpu_scenario(
        requests,
        nodes=1,
        usage={"a": 10 * WEEK_GPU_S},
        guaranteed_share=0,
        funded_burst=2,
    )
    records = records_of(scenario)
    assert records["b1"].funded[0] and records["b2"].funded[0]
    assert records["d"].funded == [False]
    assert records["d"].starts == [pytest.approx(2 * HOUR, abs=60)]
    assert records["d"].finish_time == pytest.approx(2 * HOUR + 600, abs=60)
    assert records["b1"].preemptions + records["b2"].preemptions == 1


def test_a_debug_session_stops_its_own_teams_work_past_its_protection() -> None:
    # a's batch job holds every GPU, past its 1 h protection from 1 h on; b has nothing
    # running, so no other team's work may go. a's debug session at 2 h stops it (it is
    # resumable and comes back) and runs funded in its place.
    requests = [
        gpu_request("a1", "a", 0, 4, "batch", resumable=True),
        debug_request("d", "a", 2 * HOUR),
    ]
    records = records_of(gpu_scenario(requests, nodes=1))
    assert records["d"].starts[0] == pytest.approx(2 * HOUR, abs=60)
    assert records["d"].funded == [True]
    assert records["a1"].preemptions >= 1


def test_an_unfunded_debug_session_takes_the_place_of_unallocated_work() -> None:
    # Both teams have spent their window budget and only the budget funds
    # (guaranteed_share 0): everything runs unallocated. b's resumable batch job and
    # a's notebook fill both nodes; a's debug session, unfunded too, stops b's batch
    # job (which loses no work), not a's notebook, and starts at once.
    spent = {"a": 10 * WEEK_GPU_S, "b": 10 * WEEK_GPU_S}
    requests = [
        gpu_request("a0", "a", 0, 4, "interactive"),
        gpu_request("b1", "b", 0, 4, "batch", resumable=True),
        debug_request("d", "a", 2 * HOUR),
    ]
    records = records_of(gpu_scenario(requests, usage=spent, guaranteed_share=0))
    assert records["a0"].funded[0] is False and records["b1"].funded[0] is False
    assert records["d"].starts[0] == pytest.approx(2 * HOUR, abs=60)
    assert records["d"].funded == [False]
    assert records["b1"].preemptions >= 1
    assert records["a0"].preemptions == 0


def test_a_debug_session_may_take_from_a_team_above_its_share_that_ranks_above() -> None:
    # b has used little and ranks above a, but holds 6 of the 8 GPUs, past their
    # protection from 1 h on (4 + 2 funded, its share is 4). a's notebook holds the
    # other 2. a's funded debug session at 2 h may not stop b's work by rank, but b
    # is above its share: one of its jobs goes (both lose no work). The job comes back
    # funded beyond b's share, and such work may stop only unallocated sessions, so
    # the debug session is not stopped in turn (the two would take turns otherwise).
    requests = [
        gpu_request("b1", "b", 0, 4, "batch", resumable=True),
        gpu_request("b2", "b", 0, 2, "batch", resumable=True),
        gpu_request("a1", "a", 0, 2, "interactive", min_runtime=8 * HOUR),
        debug_request("d", "a", 2 * HOUR),
    ]
    # (funded_burst 1.5: b's 6 GPUs are funded, 1.5 times its share.)
    records = records_of(gpu_scenario(requests, usage={"a": 2 * WEEK_GPU_S}, funded_burst=1.5))
    assert records["b1"].funded[0] and records["b2"].funded[0]
    assert records["d"].starts[0] == pytest.approx(2 * HOUR, abs=60)
    assert records["d"].funded == [True]
    assert records["b1"].preemptions + records["b2"].preemptions == 1
    assert records["d"].preemptions == 0
    assert records["a1"].preemptions == 0


def test_a_debug_session_that_stopped_a_job_is_not_stopped_by_it_in_return() -> None:
    # One node. b has used little and ranks above a; its 4-GPU job is larger than b's
    # share (2 GPUs), so it is a day slice that may stop a's sessions past protection.
    # a's funded 30-min debug session at 2 h stops the job (b is above its share). Once
    # its 10 min of protection end, the job may not stop it in return (S10): it runs its
    # whole 30 min, and the job resumes after it. Without S10 the job came back after
    # its 1 h and stopped it, and S2's doubled protection alone took three starts.
    requests = [
        gpu_request("b1", "b", 0, 4, "batch", resumable=True),
        gpu_request("d", "a", 2 * HOUR, 1, "debug", min_runtime=600, duration=1800),
    ]
    records = records_of(gpu_scenario(requests, nodes=1, usage={"a": 2 * WEEK_GPU_S}))
    d, job = records["d"], records["b1"]
    assert d.funded == [True] and d.preemptions == 0
    assert d.starts == [2 * HOUR] and d.finish_time == pytest.approx(2 * HOUR + 1800)
    assert job.preemptions == 1 and job.starts[1] == pytest.approx(2 * HOUR + 1800)


@pytest.mark.parametrize("stops", [0, 1, 2])
def test_a_debug_session_stopped_before_its_end_is_protected_twice_as_long_each_start(
    stops: int,
) -> None:
    """S2: funded, a debug request stopped ``stops`` times before it ran its course is
    protected for its 10 min x 2^stops on its next start."""
    data = gpu_scenario([], nodes=1)
    core = scheduler(data)
    request = parse_scenario(
        gpu_scenario([gpu_request("d", "a", 0, 1, "debug", min_runtime=600)], nodes=1)
    ).requests[0]
    core.submit(request, stops=stops)
    decisions = decide(core.view(60.0), 60.0)
    verdict = decisions.verdicts["d"]
    assert verdict.funded and verdict.placed
    assert verdict.protected_s == pytest.approx(600 * 2**stops)


def test_held_nodes_are_backfilled_with_resumable_work_that_yields_to_the_holder() -> None:
    # One 8-GPU node. b's notebook holds 4 GPUs, protected until it ends at 5 h. a's
    # funded 8-GPU job waits; at 2 h (the starvation bound) it holds the node. b's
    # resumable batch job (unfunded: b is at its share) fills the held node's other 4
    # GPUs from 3 h and is stopped the moment the notebook ends, when a's job starts.
    requests = [
        gpu_request("b0", "b", 0, 4, "interactive", min_runtime=5 * HOUR, duration=5 * HOUR),
        gpu_request("a1", "a", 60, 8, "batch", resumable=True),
        gpu_request("b1", "b", 3 * HOUR, 4, "batch", resumable=True),
    ]
    records = records_of(gpu_scenario(requests, nodes=1, gpus=8))
    assert records["b1"].funded[0] is False
    assert records["b1"].starts[0] == pytest.approx(3 * HOUR, abs=60)
    assert records["b1"].ends[0] == pytest.approx(5 * HOUR, abs=60)
    assert records["a1"].starts[0] == pytest.approx(5 * HOUR, abs=60)


def test_only_resumable_work_backfills_a_held_node() -> None:
    # As above, but b's later request is a notebook, which would lose its work when the
    # holder takes the node back: it waits instead.
    requests = [
        gpu_request("b0", "b", 0, 4, "interactive", min_runtime=5 * HOUR, duration=5 * HOUR),
        gpu_request("a1", "a", 60, 8, "batch", resumable=True),
        gpu_request("b1", "b", 3 * HOUR, 4, "interactive"),
    ]
    records = records_of(gpu_scenario(requests, nodes=1, gpus=8))
    assert records["a1"].starts[0] == pytest.approx(5 * HOUR, abs=60)
    assert records["b1"].starts[0] > 5 * HOUR


def test_a_debug_session_takes_a_held_nodes_free_slices() -> None:
    # As above, but b's later request is a debug session. With every slice outside the
    # hold taken by protected work, it would wait for the holder's whole run (20 h);
    # it starts at once on the held node's free GPUs and ends before the holder fits.
    requests = [
        gpu_request("b0", "b", 0, 4, "interactive", min_runtime=5 * HOUR, duration=5 * HOUR),
        gpu_request("a1", "a", 60, 8, "batch", resumable=True),
        debug_request("b1", "b", 3 * HOUR),
    ]
    records = records_of(gpu_scenario(requests, nodes=1, gpus=8))
    assert records["b1"].starts == [pytest.approx(3 * HOUR, abs=60)]
    assert records["b1"].finished and records["b1"].preemptions == 0
    assert records["a1"].starts[0] == pytest.approx(5 * HOUR, abs=60)


def test_a_debug_session_on_a_held_node_yields_to_the_holder_past_its_protection() -> None:
    # The debug session runs past its 10-minute protection when the notebook ends at
    # 5 h: b, over its share with it, ranks below a (it has used more), so the holder
    # stops it then rather than wait for it to end at 8 h. It checkpoints every 10 min,
    # so stopping it throws away at most 10 min of its GPU (R8 allows 15).
    requests = [
        gpu_request("b0", "b", 0, 4, "interactive", min_runtime=5 * HOUR, duration=5 * HOUR),
        gpu_request("a1", "a", 60, 8, "batch", resumable=True),
        gpu_request(
            "b1",
            "b",
            3 * HOUR,
            1,
            "debug",
            min_runtime=600,
            duration=5 * HOUR,
            checkpoint_every=600,
        ),
    ]
    records = records_of(gpu_scenario(requests, nodes=1, gpus=8))
    assert records["b1"].starts[0] == pytest.approx(3 * HOUR, abs=60)
    assert records["b1"].ends[0] == pytest.approx(5 * HOUR, abs=60)
    assert records["a1"].starts[0] == pytest.approx(5 * HOUR, abs=60)


def test_a_holder_waits_for_a_session_whose_stop_costs_more_than_it_is_worth() -> None:
    # As above, but the debug session keeps no checkpoint: at 5 h it has run 2 h, and
    # stopping it throws them away, more than R8's 15 min of its size. The holder waits
    # for it to end at 8 h.
    requests = [
        gpu_request("b0", "b", 0, 4, "interactive", min_runtime=5 * HOUR, duration=5 * HOUR),
        gpu_request("a1", "a", 60, 8, "batch", resumable=True),
        gpu_request("b1", "b", 3 * HOUR, 1, "debug", min_runtime=600, duration=5 * HOUR),
    ]
    records = records_of(gpu_scenario(requests, nodes=1, gpus=8))
    assert records["b1"].preemptions == 0 and records["b1"].finished
    assert records["a1"].starts[0] == pytest.approx(8 * HOUR, abs=60)


def _slice_scenario(b_gpus: int, charged: dict[str, float]) -> dict[str, Any]:
    """One 8-GPU node; a (2 GPUs of share) asks for all of it at 0, b (6 GPUs) for
    ``b_gpus`` half an hour later; ``charged`` GPU-seconds per team, two days ago.
    Teams rank by the window alone (``day_rank_weight`` 0), as these cases were built:
    with the last day in the rank, a's job, at four times a's share, would put a below
    b within hours, and b would stop it by rank before the day slice ends."""
    scenario = gpu_scenario(
        [
            gpu_request("a1", "a", 0, 8, "batch", resumable=True),
            gpu_request("b1", "b", 1800, b_gpus, "batch", resumable=True),
        ],
        nodes=1,
        gpus=8,
        day_rank_weight=0,
    )
    scenario["teams"] = [
        {"name": "a", "share": {"gpu": 0.25}},
        {"name": "b", "share": {"gpu": 0.75}},
    ]
    scenario["usage"] = [
        {"team": team, "pool": "gpu", "gpu_seconds": seconds, "ago": 2 * 24 * HOUR}
        for team, seconds in charged.items()
    ]
    return scenario


def test_a_job_larger_than_its_teams_share_is_time_sliced_by_the_day() -> None:
    # a's share is 2 GPUs (48 GPU-h a day); its one 8-GPU job may run funded, as a
    # team's only funded session may be larger than its share, but only until it has
    # been charged a day's share: 6 h. b ranks below a (it used 90 % of its week two
    # days ago), so by rank its waiting job could not stop a's until it ends at 20 h.
    records = records_of(_slice_scenario(6, {"b": 0.9 * 6 * WEEK_GPU_S}))
    a1, b1 = records["a1"], records["b1"]
    assert a1.starts[0] == 0 and a1.funded[0]
    # Stopped at the first cycle after its day's share is charged (cycles run at least
    # every 5 minutes), and b's job starts in its place.
    assert 6 * HOUR <= a1.ends[0] <= 6 * HOUR + 300
    assert b1.starts[0] == pytest.approx(a1.ends[0])
    assert a1.preemptions >= 1


def test_a_day_slice_runs_on_while_no_other_team_waiting_is_owed_its_day() -> None:
    # As above, but b was also charged its whole day's share (6 GPUs for 24 h) an hour
    # before the start, so until 23 h b's day owes it nothing and b's job could only
    # run unallocated. Stopping a's job at 6 h would only lend its GPUs to work that
    # a's job stops again as its day slides on: a's job runs on to its end at 20 h, and
    # b's job starts then. (Before, a's job was stopped at 6 h whoever waited.)
    scenario = _slice_scenario(6, {"b": 0.9 * 6 * WEEK_GPU_S})
    scenario["usage"].append(
        {"team": "b", "pool": "gpu", "gpu_seconds": 6 * 24 * HOUR, "ago": HOUR}
    )
    records = records_of(scenario)
    a1, b1 = records["a1"], records["b1"]
    assert a1.starts == [0] and a1.funded == [True]
    assert a1.preemptions == 0 and a1.ends == [pytest.approx(20 * HOUR)]
    assert b1.starts[0] == pytest.approx(20 * HOUR, abs=300)


def test_without_a_guaranteed_share_nothing_is_time_sliced() -> None:
    # guaranteed_share 0: only the window budget funds, so day slices are off, and so
    # is their stop. a's 8-GPU job is funded as its team's only session and runs to its
    # end at 20 h; b's job, ranked below, waits for it. (The stop used to take every
    # funded resumable job whose team had been charged a day's share.)
    scenario = _slice_scenario(6, {"b": 0.9 * 6 * WEEK_GPU_S})
    scenario["policy"]["guaranteed_share"] = 0
    records = records_of(scenario)
    a1, b1 = records["a1"], records["b1"]
    assert a1.starts == [0] and a1.funded == [True]
    assert a1.preemptions == 0 and a1.ends == [pytest.approx(20 * HOUR)]
    assert b1.starts[0] == pytest.approx(20 * HOUR, abs=300)


def test_the_fast_lane_never_stops_a_debug_session() -> None:
    # One 2-GPU node, no grace and no minimum runtime: nothing is protected. a's two
    # debug sessions (the later one of higher priority, so first in a's queue) each
    # want the whole node. The lane may stop a's own work, but not another debug
    # session: the first runs to its end and the second starts then, once. (Letting
    # the lane stop debug work, the two took turns stopping each other without end,
    # the simulated clock standing still.)
    requests = [
        gpu_request("d1", "a", 0, 2, "debug", min_runtime=0, duration=1200),
        gpu_request("d2", "a", 60, 2, "debug", min_runtime=0, duration=1200, priority=2),
    ]
    records = records_of(gpu_scenario(requests, nodes=1, gpus=2, unallocated_grace=0))
    d1, d2 = records["d1"], records["d2"]
    assert d1.starts == [0] and d1.preemptions == 0
    assert d2.starts == [pytest.approx(1200)]


def test_a_gang_holds_the_nodes_that_clear_soonest() -> None:
    # Three 8-GPU nodes, all b's: a notebook of 2 GPUs on n-0 protected until 8 h, and
    # two 8-GPU jobs on n-1 and n-2, protected until 3 h, that end at 4 h. b ranks above
    # a (a has spent most of its week), so a's funded 2-node gang may stop none of it
    # and holds two nodes at the starvation bound (2 h). Holding those with the most
    # free GPUs now (n-0 and n-1) lets b's next job take n-2 at 4 h, and the gang waits
    # for the notebook until 10 h; holding those that clear soonest, it starts at 4 h.
    week = 3 * 8 * 7 * 24 * HOUR
    requests = [
        gpu_request("b0", "b", 0, 2, "interactive", min_runtime=8 * HOUR, duration=10 * HOUR),
        gpu_request("b1", "b", 1, 8, "batch", min_runtime=3 * HOUR, duration=4 * HOUR),
        gpu_request("b2", "b", 2, 8, "batch", min_runtime=3 * HOUR, duration=4 * HOUR),
        gpu_request("a1", "a", 60, 8, "batch", nodes=2, min_runtime=HOUR, duration=HOUR),
        gpu_request("b3", "b", HOUR, 8, "batch", min_runtime=HOUR, duration=10 * HOUR),
    ]
    scenario = gpu_scenario(requests, nodes=3, gpus=8, funded_burst=0)
    scenario["teams"] = [{"name": "a", "share": {"gpu": 0.7}}, {"name": "b", "share": {"gpu": 0.3}}]
    scenario["usage"] = [{"team": "a", "pool": "gpu", "gpu_seconds": 0.6 * week, "ago": HOUR}]
    records = records_of(scenario)
    assert all(records[r].funded[0] for r in ("b0", "b1", "b2", "a1"))
    assert records["b0"].nodes[0] == ["n-0"]
    assert records["a1"].starts[0] == pytest.approx(4 * HOUR, abs=60)
    assert records["b3"].starts[0] >= 5 * HOUR


def test_a_held_request_ranks_as_its_team_stands_before_its_own_charge() -> None:
    # Two 4-GPU nodes, both b's jobs (funded, protected for the first hour, charging
    # 8 GPU-h an hour). a was charged 24 GPU-h an hour ago and asks for 4 GPUs
    # protected for 4 h (16 GPU-h) at 1 min. Counted with that charge, a ranks behind
    # b until 5 h, and may stop none of b's work before then; but from 2 h (the
    # starvation bound) it holds nodes, and a holder ranks as its team stands now,
    # which is ahead of b from 3 h: it stops one of b's jobs then (they checkpoint every
    # 10 min, so the stop throws away less than R8's 15 min).
    requests = [
        gpu_request("b1", "b", 0, 4, "batch", checkpoint_every=600),
        gpu_request("b2", "b", 1, 4, "batch", checkpoint_every=600),
        gpu_request("a1", "a", 60, 4, "batch", min_runtime=4 * HOUR, duration=HOUR),
    ]
    records = records_of(gpu_scenario(requests, usage={"a": 24 * HOUR}, funded_burst=0))
    assert records["b1"].funded[0] and records["b2"].funded[0]
    assert 3 * HOUR <= records["a1"].starts[0] <= 3.5 * HOUR
    assert records["a1"].funded[0]
    assert records["b1"].preemptions + records["b2"].preemptions == 1


def test_a_job_larger_than_its_teams_share_is_not_funded_once_its_day_is_spent() -> None:
    # a's share is 2 GPUs (48 GPU-h a day) and it was charged 48 GPU-h an hour ago: its
    # day is spent, though its week's budget (336 GPU-h) is not. Its 8-GPU job, alone,
    # runs at once on the idle node, but unallocated (preemptible), not funded from
    # the week's budget.
    scenario = gpu_scenario(
        [gpu_request("a1", "a", 0, 8, "batch", resumable=True, duration=2 * HOUR)],
        nodes=1,
        gpus=8,
    )
    scenario["teams"] = [
        {"name": "a", "share": {"gpu": 0.25}},
        {"name": "b", "share": {"gpu": 0.75}},
    ]
    scenario["usage"] = [{"team": "a", "pool": "gpu", "gpu_seconds": 48 * HOUR, "ago": HOUR}]
    records = records_of(scenario)
    assert records["a1"].starts == [0]
    assert records["a1"].funded == [False]


def _beside_scenario(notebook_gpus: int = 1, job_nodes: int = 2) -> dict[str, Any]:
    requests = [
        gpu_request(
            "a0", "a", 0, notebook_gpus, "interactive", min_runtime=8 * HOUR, duration=20 * HOUR
        ),
        gpu_request("b1", "b", 1, 8, "batch", resumable=True),
        gpu_request("b2", "b", 2, 8, "batch", resumable=True),
        gpu_request("c1", "c", 3, 8, "batch", resumable=True, min_runtime=8 * HOUR),
        gpu_request("a1", "a", HOUR, 8, "batch", nodes=job_nodes, resumable=True),
    ]
    scenario = gpu_scenario(requests, nodes=4, gpus=8)
    scenario["teams"] = [
        {"name": "a", "share": {"gpu": 0.25}},
        {"name": "b", "share": {"gpu": 0.125}},
        {"name": "c", "share": {"gpu": 0.625}},
    ]
    scenario["usage"] = [{"team": "b", "pool": "gpu", "gpu_seconds": 4 * 24 * HOUR, "ago": HOUR}]
    return scenario


def test_a_job_larger_than_its_share_is_day_sliced_beside_its_teams_other_work() -> None:
    # Four 8-GPU nodes. a's share is 8 GPUs (192 GPU-h a day) and its notebook runs on
    # n-0. b (4 GPUs of share, its day spent) runs two jobs unallocated on n-1 and n-2;
    # c's job on n-3 is protected for 8 h. a's 2-node gang, larger than a's share and
    # beside a's notebook, is funded from a's day: it stops b's unallocated jobs at
    # once (burst work may stop only unallocated sessions; it holds no nodes), and is
    # stopped once the day's share has paid for it and the notebook, 17 GPUs together:
    # about 11.2 h, for c's 2-node job submitted at 11 h (c's day is not spent; b's is,
    # and for b alone the stop would not be made, S5). Funded only as a team's only
    # session, it waited for the notebook and c's job to end at 20 h.
    scenario = _beside_scenario()
    scenario["requests"].append(gpu_request("c2", "c", 11 * HOUR, 8, "batch", nodes=2))
    records = records_of(scenario)
    a1 = records["a1"]
    assert records["b1"].funded[0] is False and records["b2"].funded[0] is False
    assert a1.starts[0] == pytest.approx(HOUR, abs=60) and a1.funded[0]
    assert sorted(a1.nodes[0]) == ["n-1", "n-2"]
    assert records["c1"].preemptions == 0 and records["a0"].preemptions == 0
    # (192 GPU-h less the notebook's first hour) / 17 GPUs, then the next cycle.
    assert 11.1 * HOUR <= a1.ends[0] - HOUR <= 11.3 * HOUR + 300
    assert records["c2"].starts[0] == pytest.approx(a1.ends[0])


def _short_slice_scenario(b1_resumable: bool) -> dict[str, Any]:
    # Two 4-GPU nodes. a's share is 2 GPUs (48 GPU-h a day), 46 of them charged an hour
    # ago; b (6 GPUs of share, well behind a over the week) runs a batch job on n-0 and
    # a notebook on n-1, both funded. a's 4-GPU job, larger than a's share and
    # protected for 1 h, is what a's day can pay for 30 min of. Teams rank by the
    # window alone (with the last day in the rank, a's spent day puts it below b).
    requests = [
        gpu_request("b1", "b", 0, 4, "batch", min_runtime=600, resumable=b1_resumable),
        gpu_request("b2", "b", 0, 4, "interactive", min_runtime=600),
        gpu_request("a1", "a", HOUR / 2, 4, "batch", resumable=True, duration=10 * HOUR),
    ]
    scenario = gpu_scenario(requests, nodes=2, gpus=4, day_rank_weight=0)
    scenario["teams"] = [
        {"name": "a", "share": {"gpu": 0.25}},
        {"name": "b", "share": {"gpu": 0.75}},
    ]
    scenario["usage"] = [
        {"team": "a", "pool": "gpu", "gpu_seconds": 46 * HOUR, "ago": HOUR},
        {"team": "b", "pool": "gpu", "gpu_seconds": 500 * HOUR, "ago": 48 * HOUR},
    ]
    return scenario


def test_a_day_slice_shorter_than_an_hour_is_funded_and_stops_only_resumable_work() -> None:
    # The 30 min a's day pays for fund a slice (15 min is the shortest): a1 stops b's
    # resumable job, whose team ranks below, and runs until the day is spent. With
    # slices of at least an hour, a1 waited unfunded until b's sessions ended at 20 h.
    records = records_of(_short_slice_scenario(b1_resumable=True))
    a1, b1 = records["a1"], records["b1"]
    assert b1.funded[0] and records["b2"].funded[0]
    assert a1.starts[0] == pytest.approx(HOUR / 2, abs=60) and a1.funded[0]
    assert a1.nodes[0] == ["n-0"] and b1.preemptions == 1
    assert a1.ends[0] == pytest.approx(HOUR, abs=120)  # the day's 2 GPU-h over 4 GPUs
    assert records["b2"].preemptions == 0


def test_a_day_slice_shorter_than_an_hour_stops_no_session_that_cannot_resume() -> None:
    # The same with b's batch job not resumable: a slice of an hour or more could stop
    # it or the notebook (past protection, their team below); a 30-min one may stop
    # neither, and a1 waits.
    records = records_of(_short_slice_scenario(b1_resumable=False))
    assert records["b1"].preemptions == 0 and records["b2"].preemptions == 0
    assert records["a1"].starts[0] == pytest.approx(20 * HOUR, abs=60)


def test_a_team_runs_one_job_larger_than_its_share_beside_its_other_work() -> None:
    # As above, with a second 2-node gang of a's at 2 h. a's funded sessions (the
    # notebook and the first gang, 17 GPUs) are beyond its share of 8 already, so the
    # second is no day slice; beyond 1.5 x the share, the window budget does not fund
    # it either: it would run unallocated, at every cycle that weighs it.
    scenario = _beside_scenario()
    scenario["requests"].append(
        gpu_request("a2", "a", 2 * HOUR, 8, "batch", nodes=2, resumable=True)
    )
    weighed: list[bool] = []

    def watch(scheduler: Any, decisions: Any, now: float) -> None:
        if "a2" in decisions.funded and now < 10 * HOUR:
            weighed.append(decisions.funded["a2"])

    records = simulation(scenario, watch).run().records
    assert records["a1"].funded[0] and records["a1"].starts[0] == pytest.approx(HOUR, abs=60)
    assert weighed and not any(weighed)


def test_a_job_larger_than_its_share_holds_no_nodes_beside_its_teams_other_work() -> None:
    # Three 8-GPU nodes: a's notebook on n-0 until 20 h, c's jobs on n-1 (until 4 h) and
    # n-2 (until 10 h), both protected to their ends. a's 2-node gang, beside the
    # notebook, is funded from a's day but may stop nothing here. Past the starvation
    # bound it holds no nodes, so c's next job takes n-1 when it frees at 4 h. (Held,
    # n-1 sat idle until 10 h, and the gang started no sooner: at 20 h, as here.)
    requests = [
        gpu_request("a0", "a", 0, 1, "interactive", min_runtime=8 * HOUR, duration=20 * HOUR),
        gpu_request("c1", "c", 1, 8, "batch", min_runtime=4 * HOUR, duration=4 * HOUR),
        gpu_request("c2", "c", 2, 8, "batch", min_runtime=10 * HOUR, duration=10 * HOUR),
        gpu_request("a1", "a", HOUR / 2, 8, "batch", nodes=2, resumable=True),
        gpu_request("c3", "c", 3 * HOUR, 8, "batch", resumable=True),
    ]
    scenario = gpu_scenario(requests, nodes=3, gpus=8)
    scenario["teams"] = [
        {"name": "a", "share": {"gpu": 0.25}},
        {"name": "c", "share": {"gpu": 0.75}},
    ]
    records = records_of(scenario)
    assert records["c3"].starts[0] == pytest.approx(4 * HOUR, abs=60)
    assert records["c3"].nodes[0] == ["n-1"]
    assert records["a1"].starts[0] == pytest.approx(20 * HOUR, abs=60)


def test_a_job_larger_than_its_share_is_day_sliced_whatever_its_weeks_budget() -> None:
    # a's share is 2 GPUs (48 GPU-h a day, 336 a week). Two days ago it was charged
    # 370 GPU-h (running beyond its share, as burst work may): its week's budget is
    # spent, its last day's share is not. Its one 8-GPU job is a day slice, funded as
    # the guaranteed share is, whatever the week's budget: it starts funded and is
    # stopped once the day's 48 GPU-h are charged (6 h), for b's waiting job (b, at
    # 1.5 of its week, ranks above a and may not stop it before). Gated by the week,
    # it ran unallocated, and so did b's, which then could not stop it.
    records = records_of(_slice_scenario(8, {"a": 370 * HOUR, "b": 1.5 * 6 * WEEK_GPU_S}))
    a1, b1 = records["a1"], records["b1"]
    assert a1.starts[0] == 0 and a1.funded[0]
    assert 6 * HOUR <= a1.ends[0] <= 6 * HOUR + 300
    assert b1.starts[0] == pytest.approx(a1.ends[0]) and b1.funded[0]


def _own_slice_scenario(requests: list[dict[str, Any]], after: str = "2h") -> dict[str, Any]:
    # Two 8-GPU nodes; a's share is 8 GPUs (192 GPU-h a day), b's the other 8.
    return gpu_scenario(requests, nodes=2, gpus=8, own_slice_after=after)


def test_a_job_larger_than_its_share_stops_its_own_teams_work_after_the_bound() -> None:
    # a runs a 4-GPU job (within its share) and then asks for a 16-GPU gang: beside
    # that job the gang is funded neither by the share nor by the burst cap, so it
    # would wait for the job to end at 20 h. Past the starvation bound (2 h), with
    # a's only funded job resumable and past its protected window, the team slices
    # itself: the gang is funded from a's day, stops a's own job and starts; it is
    # stopped once the day's share is charged, for b's job waiting since 3 h (b, at
    # 1.5 of its week two days ago, ranks below a and may not stop it before; its day
    # is owed, and a's own job alone would not stop it, S5), and a's job comes back.
    scenario = _own_slice_scenario(
        [
            gpu_request("a1", "a", 0, 4, "batch", resumable=True),
            gpu_request("a2", "a", 60, 8, "batch", nodes=2, resumable=True, duration=20 * HOUR),
            gpu_request("b1", "b", 3 * HOUR, 8, "batch", resumable=True),
        ]
    )
    week = 8 * 7 * 24 * HOUR
    scenario["usage"] = [{"team": "b", "pool": "gpu", "gpu_seconds": 1.5 * week, "ago": 48 * HOUR}]
    records = records_of(scenario)
    a1, a2 = records["a1"], records["a2"]
    assert records["b1"].starts[0] == pytest.approx(a2.ends[0])
    assert 2 * HOUR + 60 <= a2.starts[0] <= 2 * HOUR + 660 and a2.funded[0]
    assert a1.ends[0] == pytest.approx(a2.starts[0]) and a1.preemptions >= 1
    # The gang ran for a's day (192 GPU-h less what a1 was charged: 8 GPU-h) at 16 GPUs.
    assert a2.ends[0] == pytest.approx(a2.starts[0] + 11.5 * HOUR, abs=600)
    assert len(a1.starts) >= 2 and a1.starts[1] >= a2.ends[0]


def test_a_teams_new_batch_work_waits_unfunded_behind_its_gang_past_the_bound() -> None:
    # As above, but a's 4-GPU job is protected until 8 h, so the gang cannot stop it
    # before then. a's next 4-GPU job (at 3 h, protected 8 h if funded) would be funded
    # by the share and hold the gang off until 11 h; behind the gang past the bound it
    # is not funded (it runs unallocated on the free node), and the gang starts at 8 h.
    records = records_of(
        _own_slice_scenario(
            [
                gpu_request("a1", "a", 0, 4, "batch", resumable=True, min_runtime=8 * HOUR),
                gpu_request("a2", "a", 60, 8, "batch", nodes=2, resumable=True, duration=HOUR),
                gpu_request("a3", "a", 3 * HOUR, 4, "batch", resumable=True, min_runtime=8 * HOUR),
            ]
        )
    )
    a1, a2, a3 = records["a1"], records["a2"], records["a3"]
    assert a3.starts[0] == pytest.approx(3 * HOUR, abs=60) and a3.funded[0] is False
    assert a2.starts[0] == pytest.approx(8 * HOUR, abs=600) and a2.funded[0]
    assert a1.preemptions >= 1 and a3.preemptions >= 1


def test_a_team_slices_itself_only_when_turned_on() -> None:
    # The first scenario with own_slice_after off (0): the gang is funded neither
    # beside a's job nor by the day, so it waits for that job to end at 20 h.
    requests = [
        gpu_request("a1", "a", 0, 4, "batch", resumable=True),
        gpu_request("a2", "a", 60, 8, "batch", nodes=2, resumable=True, duration=HOUR),
    ]
    records = records_of(_own_slice_scenario(requests, after="0"))
    assert records["a1"].preemptions == 0
    assert records["a2"].starts[0] == pytest.approx(20 * HOUR, abs=600)
    with pytest.raises(InputError) as error:
        parse_scenario(_own_slice_scenario(requests, after="soon"))
    assert "own_slice_after" in error.value.where


@pytest.mark.parametrize("resumable", [False, True])
def test_a_team_slicing_itself_stops_only_resumable_sessions(resumable: bool) -> None:
    # As the first own-slice scenario, with b's 2-GPU session beside a's job from the
    # start, b ranking behind a (b was charged its week an hour ago). Past the bound
    # a's gang may stop a's own job, but b's session only if it resumes where it
    # stopped: a notebook is left to end at 6 h, and the gang starts then; a resumable
    # job is stopped at once. With a funded request's usual rights, the gang stopped
    # the notebook past its protected hour at 2 h and threw away 2 h of its work.
    requests = [
        gpu_request("a1", "a", 0, 4, "batch", resumable=True),
        gpu_request(
            "b1",
            "b",
            1,
            2,
            "batch" if resumable else "interactive",
            resumable=resumable,
            duration=6 * HOUR,
        ),
        gpu_request("a2", "a", 60, 8, "batch", nodes=2, resumable=True, duration=HOUR),
    ]
    scenario = _own_slice_scenario(requests)
    scenario["usage"] = [{"team": "b", "pool": "gpu", "gpu_seconds": 8 * WEEK_GPU_S, "ago": HOUR}]
    records = records_of(scenario)
    a2, b1 = records["a2"], records["b1"]
    assert a2.funded[0] and records["a1"].preemptions >= 1
    if resumable:
        assert b1.preemptions >= 1
        assert a2.starts[0] == pytest.approx(2 * HOUR, abs=660)
    else:
        assert b1.preemptions == 0 and b1.ends == [pytest.approx(6 * HOUR, abs=5)]
        assert a2.starts[0] == pytest.approx(6 * HOUR, abs=660)


def _gang_or_notebook(notebook_hours: float) -> dict[str, RequestRecord]:
    # a and b have spent their week and only the budget funds (guaranteed_share 0), so
    # b's resumable 2-node gang and a's notebook (one node) run unallocated on the
    # three nodes. c's 4-GPU job, funded, comes at ``notebook_hours`` and must stop one.
    scenario = gpu_scenario(
        [
            gpu_request("g", "b", 0, 4, "batch", nodes=2, resumable=True),
            gpu_request("nb", "a", 0, 4, "interactive"),
            gpu_request("x", "c", notebook_hours * HOUR, 4, "batch"),
        ],
        nodes=3,
        usage={"a": 10 * WEEK_GPU_S, "b": 10 * WEEK_GPU_S},
        guaranteed_share=0,
    )
    scenario["teams"] = [
        {"name": "a", "share": {"gpu": 0.3}},
        {"name": "b", "share": {"gpu": 0.3}},
        {"name": "c", "share": {"gpu": 0.4}},
    ]
    return records_of(scenario)


def test_a_gang_costs_its_place_as_a_victim() -> None:
    # Stopping the gang loses no work, but to start again it needs two whole nodes at
    # once: that costs it up to max_min_runtime (8 h) at its 8 GPUs, 64 GPU-h. So the
    # notebook, 2 h old (8 GPU-h of work lost), is stopped instead.
    records = _gang_or_notebook(2)
    assert records["g"].funded[0] is False and records["nb"].funded[0] is False
    assert records["x"].starts[0] == pytest.approx(2 * HOUR, abs=60)
    assert records["nb"].preemptions == 1 and records["g"].preemptions == 0


def test_a_gang_is_stopped_when_the_notebook_would_lose_more() -> None:
    # The same at 17 h: the notebook would lose 68 GPU-h of work, more than the gang's
    # 64, so the gang goes.
    records = _gang_or_notebook(17)
    assert records["x"].starts[0] == pytest.approx(17 * HOUR, abs=60)
    assert records["g"].preemptions == 1 and records["nb"].preemptions == 0


def test_a_job_within_its_share_is_day_sliced_beside_its_teams_other_work() -> None:
    # Four 8-GPU nodes. a's share is 8 GPUs and its 4-GPU notebook runs on n-0; b (4 GPUs
    # of share, its day spent) runs two jobs unallocated on n-1 and n-2; c's job on n-3
    # is protected for 8 h. At 1 h a asks for an 8-GPU job: within its share, but with
    # the notebook 12 GPUs, past 1.25 x the share, so the week's budget does not fund
    # it. a runs below its share, so its day does: beside the notebook it is burst work,
    # which stops one of b's unallocated jobs at once. Unfunded, it stopped no one and
    # waited for a node to come free at 20 h.
    scenario = _beside_scenario(notebook_gpus=4, job_nodes=1)
    records = records_of(scenario)
    a1 = records["a1"]
    assert records["b1"].funded[0] is False and records["b2"].funded[0] is False
    assert a1.starts[0] == pytest.approx(HOUR, abs=60) and a1.funded[0]
    assert a1.nodes[0][0] in ("n-1", "n-2")
    assert records["b1"].preemptions + records["b2"].preemptions == 1
    assert records["c1"].preemptions == 0 and records["a0"].preemptions == 0
