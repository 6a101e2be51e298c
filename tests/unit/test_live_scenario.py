"""The live run's plan (harness/liverun.py), simulated alone: it keeps what issue 51's
live test needs (40-60 sessions of the three profiles and three teams over about four
minutes, a preemption of resumable work, the drain) and what makes its outcome robust on a
loaded machine (every funded session protected for all its work, so only the guests'
unallocated notebooks are stopped, each once its grace is over). A change of the policy
or of the plan that loses one of these fails here, in seconds, not in the live test."""

from __future__ import annotations

from harness import liverun
from scheduler_core.research.evaluation import headline
from scheduler_core.research.replay import outcome
from scheduler_core.scenario import parse_scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import Simulation
from scheduler_core.view import Decisions


def test_the_plan_has_what_the_live_test_needs() -> None:
    sessions = liverun.plan_sessions()
    assert 40 <= len(sessions) <= 60
    assert {s.profile for s in sessions} == {"debug", "notebook", "dataprep"}
    assert {s.team for s in sessions} == {"nlp", "vision", "guests"}
    assert max(s.at for s in sessions) <= liverun.SPAN
    assert len({(s.user, s.server) for s in sessions}) == len(sessions)
    minimum = {p["slug"]: float(p["min_runtime"].removesuffix("s")) for p in liverun.PROFILES}
    for s in sessions:
        if s.team != "guests":  # protected for all their work: no funded preemption
            assert s.work <= minimum[s.profile], s


def test_the_plan_simulated_stops_guests_only_and_legacy_makes_debug_wait() -> None:
    stopped: list[tuple[str, bool, str]] = []
    funded_of: dict[str, bool] = {}

    # The simulator's observer, not a subclass of its actuator: the compiled core's
    # classes cannot be subclassed from Python. A stopped session ran in an earlier
    # cycle (S9), so its funding is known from what ran then.
    def watch(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
        for p in decisions.preemptions:
            stopped.append((p.allocation_id, funded_of[p.allocation_id], p.reason))
        funded_of.update((a.id, a.funded) for a in scheduler.running.values())

    data = liverun.scenario(liverun.plan_sessions())
    assert [(e["node"], e["state"]) for e in data["events"]] == [
        ("gpu-2", "draining"),
        ("gpu-2", "ready"),
    ]
    simulation = Simulation(parse_scenario(data), watch)
    run = simulation.run()
    assert stopped and all(
        not funded and rid.startswith(("gus/", "hal/")) for rid, funded, _ in stopped
    )
    last_end = max(r.ends[-1] for r in run.records.values())
    assert last_end <= liverun.DEADLINE - 60  # room for the live run's lost seconds
    assert all(r.finished for r in run.records.values())
    data["policy"] = {**data["policy"], "name": "legacy"}
    legacy = Simulation(parse_scenario(data)).run()
    budget_p90 = headline(outcome("budget", run))["debug_p90_s"]
    assert headline(outcome("legacy", legacy))["debug_p90_s"] > budget_p90
