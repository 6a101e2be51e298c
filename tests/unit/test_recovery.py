"""Restart recovery of the queue (`spawner.hub.recovery.recover`) over a real store: a debug
session that was stopped before it ran its course keeps its count of stops across a
Hub restart, so its next start is protected as long as it would have been without
the restart (the policy's doubling, tests/unit/test_fast_lane.py).

No engine is configured: the store holds no running session, so none is asked about.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from harness import builders
from harness.builders import HOUR, debug_request, gpu_scenario, scheduler
from scheduler_core.model import Allocation
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import VirtualClock
from scheduler_core.store import RequestState
from spawner.hub.recovery import recover
from spawner.hubapi import HubClient
from spawner.runtime.actuator import SessionActuator, Timeouts

NOW = 100 * HOUR


class _Started:
    """The core's actuator: what the first cycle after the restart starts."""

    def __init__(self) -> None:
        self.started: dict[str, Allocation] = {}

    def launch(self, allocation: Allocation) -> None:
        self.started[allocation.id] = allocation

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        raise AssertionError(f"nothing runs, so nothing is stopped ({allocation.id})")


def _restart(stopped: dict[str, int]) -> tuple[Scheduler, dict[str, Allocation]]:
    """A store left with one waiting debug request per entry of ``stopped`` (request id:
    preempt events in the log), taken back into a new core; then one cycle."""
    requests = [
        {**debug_request(rid, "a", NOW - HOUR + i), "id": f"u{i}/srv/{rid}"}
        for i, rid in enumerate(stopped)
    ]
    scenario = gpu_scenario(requests, parse=True)
    started = _Started()
    core = scheduler(scenario, clock=VirtualClock(NOW), actuator=started)
    hub = HubClient("")
    actuator = SessionActuator(
        {},
        scenario.nodes,
        hub,
        hub_name="test",
        timeouts=Timeouts(),
        port_range=(0, 0),
        granted=lambda allocation: None,
        preempted=lambda request_id: None,
        changed=lambda: None,
        respawn=lambda request_id: None,
        notices={},
        log=logging.getLogger("test_recovery"),
    )
    with builders.store(pools=scenario.pools, teams=scenario.teams) as store:
        for request in scenario.requests:
            store.add_request(request)
            times = stopped[request.id.rsplit("/", 1)[1]]
            for k in range(times):
                store.append_event(
                    NOW - HOUR + 60 * (k + 1),
                    "preempt",
                    {"request": request.id, "reason": "funded"},
                )
            if times:
                store.set_request_state(request.id, RequestState.REQUEUED)
        # Another request's stops count for it alone.
        store.append_event(NOW - 60, "preempt", {"request": "u9/srv/gone", "reason": "funded"})
        asyncio.run(recover(core, store, actuator, scenario.teams, NOW, 7 * 24 * HOUR))
    core.cycle()
    by_name = {a.id.rsplit("/", 1)[1]: a for a in started.started.values()}
    return core, by_name


def test_a_debug_sessions_stops_survive_a_restart() -> None:
    # Two debug sessions of 10 min each wait in the store: d2 was stopped twice before
    # the restart, d0 never. The first cycle after it starts both, funded: d0 protected
    # for its own 10 min, d2 for 10 min x 2^2. Without the count from the event log, d2
    # was protected for 10 min too.
    core, started = _restart({"d0": 0, "d2": 2})
    assert set(started) == {"d0", "d2"}
    protected: dict[str, Any] = {k: a.protected_until - a.start for k, a in started.items()}
    assert all(a.funded for a in started.values())
    assert protected == {"d0": 600, "d2": 2400}
    # Kept while d2 runs (a third stop would double it again); forgotten when it ends.
    assert core.stops == {"u1/srv/d2": 2}


def test_a_restart_counts_each_sessions_own_stops() -> None:
    core, started = _restart({"d1": 1, "d3": 3})
    assert {k: a.protected_until - a.start for k, a in started.items()} == {
        "d1": 1200,
        "d3": 4800,
    }
