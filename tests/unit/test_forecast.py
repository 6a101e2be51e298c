"""Forecasts (scheduler_core.forecast): the dry run's answers in the cases issue 40
reported, the estimate of the scheduler run forward and what it rests on, and the
ledger copy the forward run reads."""

from __future__ import annotations

import dataclasses

import pytest

from harness.builders import HOUR, Idle, gpu_request, gpu_scenario, scheduler
from scheduler_core import model
from scheduler_core.forecast import History, Reading, forecast, read, run_forward
from scheduler_core.ledger import UsageLedger
from scheduler_core.scenario import parse_scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import VirtualClock
from scheduler_core.view import Admission, Decisions


def core_of(data: dict, now: float = 0.0) -> tuple[Scheduler, VirtualClock]:
    parsed = parse_scenario(data)
    clock = VirtualClock(now)
    core = scheduler(parsed, clock=clock, actuator=Idle())
    for waiting in parsed.requests:
        core.submit(waiting)
    return core, clock


def ask(rid: str, team: str, gpus: int = 1, klass: str = "interactive", **extra) -> model.Request:
    data = gpu_scenario([gpu_request(rid, team, 0, gpus, klass, **extra)])
    return parse_scenario(data).requests[0]


def test_a_request_that_fits_starts_now_and_is_funded_as_the_cycle_funds_it() -> None:
    core, _ = core_of(gpu_scenario([]))
    said = forecast(core.view(0.0), 0.0, ask("x", "a"))
    assert (said.starts_now, said.funded, said.position, said.ahead) == (True, True, 1, ())
    assert said.protected_s == HOUR


def test_a_debug_request_with_a_free_mig_instance_starts_now_past_a_long_queue() -> None:
    """The old outlook put it behind every batch request of the pool (no debug lane)."""
    data = gpu_scenario(
        [gpu_request(f"q{i}", "a", 0, 4, "batch") for i in range(3)], nodes=1, gpus=4
    )
    data["nodes"].append({"name": "mig", "pool": "gpu", "gpus": 1, "mig": {"0": ["1g.10gb"]}})
    core, clock = core_of(data)
    core.cycle()  # q0 takes the node; q1, q2 wait
    clock.time = 60.0
    debug = dataclasses.replace(
        ask("d", "b", 0, "debug", min_runtime=600), gpus=0, mig="1g.10gb", submit=60.0
    )
    said = forecast(core.view(60.0), 60.0, debug)
    assert said.starts_now and said.funded and said.ahead == ()


def test_the_estimate_is_when_the_scheduler_run_forward_starts_it() -> None:
    """Two GPUs held by teams a and b, each within its share, protected for 1 h and 2 h;
    two more of a's wait. With no history the first starts when the first protection
    ends, the second at the second; with a median length of 3 h, both at 3 h."""
    data = gpu_scenario([], nodes=1, gpus=2)
    core, clock = core_of(data)
    for rid, team, hours in (("r1", "a", 1), ("r2", "b", 2)):
        core.submit(ask(rid, team, min_runtime=hours * HOUR))
    core.cycle()
    assert all(a.funded for a in core.running.values())
    clock.time = 10.0
    for rid in ("w1", "w2"):
        core.submit(dataclasses.replace(ask(rid, "a"), submit=10.0))
    starts = run_forward(core, 10.0, History())
    # exact within the first hour, then within 2 % of the distance past it (COARSEN)
    assert sorted(starts.values()) == [HOUR, pytest.approx(2 * HOUR, abs=0.02 * HOUR)]
    assert "no past sessions" in History().basis()

    history = History.of([("class:interactive", 3 * HOUR)] * 3)
    later = run_forward(core, 10.0, history)
    assert sorted(later.values()) == [pytest.approx(3 * HOUR, abs=0.04 * HOUR)] * 2
    assert "median length (of 3 past sessions)" in history.basis()


def test_a_declared_length_wins_over_the_history_and_protection_is_the_floor() -> None:
    request = ask("r", "a", min_runtime=HOUR)
    grant = model.NodeGrant("n-0", (), 1.0, 1.0)
    running = model.Allocation(request, (grant,), 100.0, True, 100.0 + HOUR, 1.0)
    assert History().end(running) == 100.0 + HOUR
    short = History.of([("class:interactive", 60.0)])
    assert short.end(running) == 100.0 + HOUR  # never before its protection ends
    long = History.of([("class:interactive", 5 * HOUR)], declared={"r": 2 * HOUR})
    assert long.end(running) == 100.0 + 2 * HOUR


def test_the_forward_run_leaves_the_live_core_as_it_was() -> None:
    data = gpu_scenario([], nodes=1, gpus=1)
    core, clock = core_of(data)
    core.submit(ask("r1", "a"))
    core.cycle()
    core.submit(ask("w", "b"))
    before = (dict(core.pending), dict(core.running), core.ledger.charged("a", "gpu", 0, 50))
    run_forward(core, 0.0, History(), ask("x", "b"))
    after = (dict(core.pending), dict(core.running), core.ledger.charged("a", "gpu", 0, 50))
    assert before == after


def test_a_ledger_copy_answers_as_the_ledger_for_windows_after_its_start() -> None:
    ledger = UsageLedger()
    for i in range(20):
        ledger.start_charging("a", "gpu", i * 100.0, 1.0 + i)
        ledger.stop_charging("a", "gpu", i * 100.0 + 50, 1.0 + i)
    ledger.add("b", "gpu", 10.0, 7.0)
    copy = ledger.copy(since=1000.0)
    for start, end in ((1000.0, 2000.0), (1234.0, 1900.0), (1500.0, 5000.0)):
        assert copy.charged("a", "gpu", start, end) == ledger.charged("a", "gpu", start, end)
        assert copy.charged("b", "gpu", start, end) == ledger.charged("b", "gpu", start, end)
    copy.start_charging("a", "gpu", 3000.0, 2.0)  # the copy moves on alone
    assert copy.charged("a", "gpu", 3000, 3010) == 20.0
    assert ledger.charged("a", "gpu", 3000, 3010) == 0.0


def test_one_reading_of_the_whole_queue_says_what_each_request_read_alone_says() -> None:
    """`standing` reads every waiting request off one `Reading` (built once, so the read
    model's rebuild is linear in the queue): each answer is the one-request `read`'s, and
    that is the order re-derived by hand, with an id listed twice, an admitted entry, an
    entry of no known pool and a request the cycle did not look at."""
    a, b, c, d, late = (ask(r, "a") for r in ("a", "b", "c", "d", "late"))
    other = dataclasses.replace(ask("o", "a"), pool="cpu")
    pools = {"a": "gpu", "b": "gpu", "c": "gpu", "d": "gpu", "late": "gpu", "o": "cpu"}
    decisions = Decisions(
        admissions=(Admission(b, (), True, 10.0 + HOUR, 1.0),),
        order=("a", "o", "b", "ghost", "c", "a", "d"),
        funded={"a": True, "c": False, "d": True, "o": False},
    )
    reading = Reading(decisions, pools)
    for request in (a, b, c, d, late, other):
        said = reading.read(request, 10.0)
        assert said == read(decisions, request, pools, 10.0)
        order = [r for r in decisions.order if pools.get(r) == request.pool]
        place = order.index(request.id) if request.id in order else len(order)
        waiting = len(order) + (request.id not in order)
        ahead = tuple(r for r in order[:place] if r != "b")
        assert (said.position, said.waiting, said.ahead) == (place + 1, waiting, ahead)
        assert said.starts_now is (request is b)
    assert reading.read(d, 10.0).ahead == ("a", "c", "a")
    assert (reading.read(late, 10.0).position, reading.read(late, 10.0).waiting) == (6, 6)
    alone = reading.read(other, 10.0)
    assert (alone.position, alone.waiting, alone.ahead) == (1, 1, ())
