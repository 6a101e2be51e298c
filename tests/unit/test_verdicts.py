"""The policy's verdicts (scheduler_core/verdict.py): one per request a cycle looks at,
agreeing with the cycle's order, funding and admissions, and right on small cases."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from harness.builders import HOUR, WEEK, request, scenario, scenarios
from scheduler_core import verdict
from scheduler_core.registry import decide
from scheduler_core.scenario import Scenario, parse_scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import Simulation
from scheduler_core.view import Decisions


def check_consistent(decisions: Decisions, now: float) -> None:
    """Verdicts agree with ``order``, ``funded`` and the admissions."""
    verdicts = decisions.verdicts
    assert tuple(verdicts) == decisions.order
    assert len(verdicts) == len(decisions.order)
    admitted = {a.request.id: a for a in decisions.admissions}
    for position, request_id in enumerate(decisions.order):
        found = verdicts[request_id]
        assert found.request_id == request_id and found.position == position
        assert found.funded is decisions.funded[request_id]
        assert (found.ground in verdict.FUNDED_GROUNDS) is found.funded
        assert found.ground in verdict.MESSAGES and found.reason in verdict.MESSAGES
        assert found.protected_s >= 0
        admission = admitted.get(request_id)
        assert found.placed is (admission is not None)
        if admission is not None:
            assert found.grants == admission.grants and found.preempts == admission.preempts
            assert found.protected_s == admission.protected_until - now
            assert admission.funded is found.funded
            assert (found.reason == verdict.PREEMPTS) is bool(admission.preempts)
        else:
            assert found.grants == () and found.preempts == ()
        if found.reason == verdict.HOLDING:
            assert request_id in decisions.reservations
    assert "nobody" not in verdicts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_verdicts_agree_with_every_cycle(data: Scenario) -> None:
    def observe(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
        check_consistent(decisions, now)

    Simulation(data, observe).run()


def first_cycle(data: dict[str, Any]) -> tuple[Decisions, float]:
    """The budget policy's decisions on the scenario's requests, all waiting at 0."""
    parsed = parse_scenario(data)
    simulation = Simulation(parsed)
    for item in parsed.requests:
        simulation.scheduler.submit(item)
    view = simulation.scheduler.view(0.0)
    decisions = decide(view, 0.0)
    check_consistent(decisions, 0.0)
    return decisions, 0.0


def test_placed_and_waiting_say_why() -> None:
    # Team a (half of the 8-GPU node): 4 GPUs fit within its share; 8 more do not fit.
    decisions, _ = first_cycle(
        scenario(requests=[request("x", "a", 0, gpus=4), request("y", "a", 0, gpus=8)])
    )
    x, y = decisions.verdicts["x"], decisions.verdicts["y"]
    assert (x.position, y.position) == (0, 1)
    assert x.funded and x.ground == verdict.SHARE and x.reason == verdict.PLACED
    assert x.grants and x.grants[0].node == "n1" and x.protected_s > 0
    assert not y.placed and y.grants == ()
    # 8 GPUs are more than a's share: funded from the day's share (S5), which pays
    # for it beside x; nothing a funded request may stop makes room.
    assert y.funded and y.ground == verdict.DAY_SLICE and y.reason == verdict.NO_VICTIMS
    assert "funded" in y.funding_message and "waiting" in y.placement_message


def test_over_budget_is_unfunded_and_may_stop_no_one() -> None:
    # Team a spent twice its week's budget an hour ago (so its day too). Its first
    # 2 GPUs are within the guaranteed share; 4 more beside them need the budget.
    spent = {"team": "a", "pool": "g", "gpu_seconds": 2.0 * 0.5 * 8 * WEEK, "ago": HOUR}
    decisions, _ = first_cycle(
        scenario(
            usage=[spent],
            requests=[
                request("a0", "a", 0, gpus=2),
                request("a1", "a", 0, gpus=4),
                request("b1", "b", 0, gpus=4),
            ],
        )
    )
    b1, a0, a1 = (decisions.verdicts[r] for r in ("b1", "a0", "a1"))
    assert [b1.position, a0.position, a1.position] == [0, 1, 2]
    assert b1.placed and b1.ground == verdict.SHARE
    assert a0.placed and a0.funded and a0.ground == verdict.SHARE
    assert not a1.funded and a1.ground == verdict.OVER_BUDGET
    assert a1.reason == verdict.NO_ROOM and not a1.placed
    assert a1.protected_s == parse_scenario(scenario()).settings.unallocated_grace
    assert verdict.message(a1.ground).startswith("not funded")


def test_a_dry_run_leaves_the_view_alone_and_answers_the_same() -> None:
    data = parse_scenario(
        scenario(requests=[request("x", "a", 0, gpus=4), request("y", "b", 0, gpus=8)])
    )
    simulation = Simulation(data)
    for item in data.requests:
        simulation.scheduler.submit(item)
    view = simulation.scheduler.view(0.0)
    before = repr(view)
    first = decide(view, 0.0)
    second = decide(view, 0.0)
    assert repr(view) == before
    assert dict(first.verdicts) == dict(second.verdicts)
