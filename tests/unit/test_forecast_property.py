"""The forecast is the policy's own answer (issue 40): for random clusters stopped at a
random moment (hypothesis) and a random request asked for then, what `forecast` says
(funded or not, starts now or not, its place in the order and who stays ahead of it)
is what the scheduler's next cycle does once the request is submitted.

The forecast is a dry run on the live view without the cycle index; the cycle it is
held to is the real one, with the scheduler's kept index, so the property also holds
the two roads of `decide` to the same answer.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.builders import Idle, scenarios
from scheduler_core.forecast import forecast, read
from scheduler_core.scenario import Scenario
from scheduler_core.simulator import Simulation


@st.composite
def snapshot_and_request(draw: st.DrawFn) -> tuple[Scenario, int, float]:
    scenario = draw(scenarios().filter(lambda s: bool(s.requests)))
    pick = draw(st.integers(0, len(scenario.requests) - 1))
    stop = draw(st.integers(0, 30000))
    return scenario, pick, float(stop)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot_and_request())
def test_the_forecast_is_what_the_next_cycle_does(case: tuple[Scenario, int, float]) -> None:
    scenario, pick, stop = case
    asked = scenario.requests[pick]
    rest = tuple(r for r in scenario.requests if r.id != asked.id)
    simulation = Simulation(dataclasses.replace(scenario, requests=rest, horizon=stop))
    simulation.run()
    core = simulation.scheduler
    now = simulation.clock.now()
    request = dataclasses.replace(asked, submit=now)
    said = forecast(core.view(now), now, request)

    core.actuator = Idle()  # the cycle's decisions are what is compared
    request = core.submit(request)
    decisions = core.cycle()
    pools = {r: q.pool for r, q in core.pending.items()}
    pools.update({a.request.id: a.request.pool for a in decisions.admissions})
    pools[request.id] = request.pool
    done = read(decisions, request, pools, now)

    assert (said.funded, said.starts_now) == (done.funded, done.starts_now), (said, done)
    assert (said.position, said.waiting, said.ahead) == (done.position, done.waiting, done.ahead)
    assert said.protected_s == done.protected_s
    assert (said.ground, said.reason) == (done.ground, done.reason)  # the verdict's codes
