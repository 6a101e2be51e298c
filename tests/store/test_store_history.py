"""What the live Hub writes into the event log for `budgethub replay` (issue 51): a
waiting request that leaves the queue says when (its row keeps no time for it), and
the scheduler's state (settings, shares, nodes, running and queued) is one JSON object
a replay can start from. The Hub's starts, admin changes taken in and launches are
checked on a real Hub (tests/integration/test_replay_live.py)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

from sqlalchemy import select

from harness import builders
from scheduler_core import model
from scheduler_core.model import Health
from scheduler_core.scheduler import WallClock
from scheduler_core.store import RequestState
from scheduler_core.store.models import RequestRow
from spawner.hub.embedded import CANCEL, GRANTED, BudgetScheduler
from spawner.readmodel.status import QueueView

TEAMS = [model.Team("a", {"gpu": 0.25}), model.Team("b", {"gpu": 0.75})]


def _hub(tmp_path: Path) -> BudgetScheduler:
    node = builders.node("n1", pool="gpu", gpus=1)
    core = builders.scheduler(
        pools=builders.pools().values(), nodes=[node], teams=TEAMS, clock=WallClock()
    )
    store = builders.store(
        builders.sqlite_file_url(tmp_path), pools=builders.pools().values(), teams=TEAMS
    )
    hub = BudgetScheduler(hub_name="h1")
    hub.started, hub.store, hub.core, hub.core_teams = True, store, core, list(TEAMS)
    hub.view = QueueView(core, store)
    hub.kick = lambda: None  # type: ignore[method-assign]  # no cycle runs between
    return hub


def _ask(rid: str, team: str) -> model.Request:
    return model.Request(rid, rid.split("/")[0], team, "gpu", time.time(), gpus=1)


def test_a_request_that_leaves_the_queue_says_when(tmp_path: Path) -> None:
    hub = _hub(tmp_path)
    try:

        async def three() -> None:
            for rid, team in (("ann/x/1", "a"), ("bo/y/1", "b"), ("cy/z/1", "b")):
                hub.submit(_ask(rid, team), {})
            before = time.time()
            hub.cancel("ann/x/1", "the user gave up waiting")
            assert hub.withdraw("bo/y/1", "cancelled by an administrator: maintenance")
            assert not hub.withdraw("bo/y/1", "again")  # not queued any more: nothing written
            after = time.time()
            cancels = hub.store.list_events(kind=CANCEL)
            assert [(e.payload["request"], e.payload["reason"]) for e in cancels] == [
                ("ann/x/1", "the user gave up waiting"),
                ("bo/y/1", "cancelled by an administrator: maintenance"),
            ]
            assert all(before <= e.time <= after for e in cancels)

        asyncio.run(three())
        store = hub.store
        assert store.request_status("ann/x/1").state is RequestState.CANCELLED
        assert store.request_status("bo/y/1").state is RequestState.CANCELLED
        assert store.request_status("cy/z/1").state is RequestState.PENDING
        assert set(hub.core.pending) == {"cy/z/1"}
    finally:
        hub.store.close()


def test_the_state_a_replay_starts_from_is_plain_json(tmp_path: Path) -> None:
    hub = _hub(tmp_path)
    try:

        async def one() -> None:
            hub.submit(_ask("ann/x/1", "a"), {})

        asyncio.run(one())
        hub.core.set_health("n1", Health.DRAINING)
        state = json.loads(json.dumps(hub._history_state()))  # JSON as stored, nothing lost
        assert state["hub"] == "h1"
        assert state["settings"]["name"] == "budget"
        assert state["settings"]["placement"] == "best-fit"  # enums by their value
        assert state["settings"]["cycle_tick"] == hub.core.settings.cycle_tick
        assert state["teams"] == {"a": {"gpu": 0.25}, "b": {"gpu": 0.75}}
        assert state["nodes"] == {"n1": "draining"}
        assert (state["running"], state["queued"]) == ([], ["ann/x/1"])
    finally:
        hub.store.close()


def test_a_request_keeps_what_a_preemption_of_it_costs(tmp_path: Path) -> None:
    """Its checkpoint interval and restart cost are in the spec the store keeps, so a
    replay prices its preemption as the policy did."""
    hub = _hub(tmp_path)
    try:
        asked = replace(_ask("ann/x/1", "a"), checkpoint_every=600.0, restart_cost=30.0)
        hub.store.add_request(asked)
        with hub.store.engine.connect() as connection:
            spec = connection.execute(select(RequestRow.spec)).scalar_one()
        assert (spec["checkpoint_every"], spec["restart_cost"]) == (600.0, 30.0)
    finally:
        hub.store.close()


def test_a_grant_names_the_devices_it_holds(tmp_path: Path) -> None:
    """The store deletes an ended allocation's slices; the event log keeps them."""
    hub = _hub(tmp_path)
    try:
        node = hub.core.nodes["n1"]
        asked = _ask("ann/x/1", "a")
        whole = model.Slice(node.gpus[0].uuid, model.SliceKind.WHOLE)
        grant = model.NodeGrant("n1", (whole,), 1.0, 1.0)
        allocation = model.Allocation(asked, (grant,), 123.0, True, 183.0, 1.0)

        async def granted() -> None:
            hub._granted(allocation)

        asyncio.run(granted())
        [event] = hub.store.list_events(kind=GRANTED)
        assert event.time == 123.0
        assert dict(event.payload) == {
            "request": "ann/x/1",
            "funded": True,
            "devices": {"n1": [node.gpus[0].uuid]},
        }
    finally:
        hub.store.close()
