"""The actuator's collaborators (spawner/runtime): a preempted session's way out through
`SessionActuator`'s facade on a runtime that answers at once, the values they share, and
how their modules import each other.

No engine: the node's runtime is a stand-in that keeps its sessions in a dict.
"""

from __future__ import annotations

import ast
import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import builders
from harness.builders import HOUR, gpu_request, gpu_scenario, scheduler
from scheduler_core.model import Allocation
from scheduler_core.simulator import VirtualClock
from spawner.runtime.actuator import Agent, SessionActuator, Timeouts
from spawner.runtime.interface import Answer, SessionState
from spawner.runtime.snaprecord import kernel_state, unsaved_entries
from spawner.runtime.spec import LABEL_PREFIX, LaunchSpec

NOW = 100 * HOUR
RUNTIME = Path(__file__).resolve().parents[2] / "spawner" / "runtime"


class _Config:
    url = None
    address = "127.0.0.1"
    network = "host"
    storage: dict[str, str] = {}
    nvidia = False


class _Runtime:
    """One node's sessions in a dict; ``removed`` in the order they went."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.config = _Config()
        self.running: dict[str, SessionState] = {}
        self.removed: list[str] = []

    async def ping(self) -> Answer:
        return Answer.OK

    def watch(self, hub: str, on_exit: Callable[[SessionState], None]) -> None:
        pass

    async def launch(self, spec: LaunchSpec) -> str:
        raise AssertionError("nothing is started here")

    async def state(self, runtime_id: str) -> SessionState | None:
        return self.running.get(runtime_id)

    async def remove(self, runtime_id: str, grace: float = 5.0) -> None:
        await asyncio.sleep(0.01)  # a runtime takes a while: the booking must wait
        self.running.pop(runtime_id, None)
        self.removed.append(runtime_id)

    async def sessions(self, hub: str) -> list[SessionState]:
        return list(self.running.values())

    async def archive(self, runtime_id: str, path: str) -> bytes | None:
        return None

    async def logs(self, runtime_id: str, tail: int = 20) -> str:
        return ""


class _Hub:
    def __init__(self) -> None:
        self.stopped: list[str] = []

    async def stop_server(self, request_id: str) -> None:
        self.stopped.append(request_id)


def _take_down(agent_known: bool) -> dict[str, Any]:
    """r1 runs on the only node (as job 17); it is preempted through the facade and the
    core finishes it; r2 is granted the same GPUs. What each part saw, in order."""
    scenario = gpu_scenario(
        [
            {**gpu_request("r1", "a", NOW - 60, 4, "interactive"), "id": "u1/s/r1"},
            {**gpu_request("r2", "b", NOW - 30, 4, "interactive"), "id": "u2/s/r2"},
        ],
        nodes=1,
        parse=True,
    )
    runtime = _Runtime("n-0")
    hub = _Hub()
    seen: list[str] = []
    notices: dict[tuple[str, str], str] = {}
    actuator = SessionActuator(
        {},
        scenario.nodes,
        hub,  # type: ignore[arg-type]
        hub_name="test",
        timeouts=Timeouts(),
        port_range=(0, 0),
        granted=lambda allocation: seen.append(f"granted {allocation.id}"),
        preempted=lambda request_id: seen.append(f"preempted {request_id}"),
        changed=lambda: None,
        respawn=lambda request_id: seen.append(f"respawn {request_id}"),
        notices=notices,
        log=logging.getLogger("test_actuator_collaborators"),
        runtimes={"n-0": runtime},  # type: ignore[dict-item]
    )
    core = scheduler(scenario, clock=VirtualClock(NOW), actuator=actuator)
    r1, r2 = scenario.requests

    async def run() -> dict[str, Any]:
        with builders.store(
            pools=scenario.pools, teams=scenario.teams, nodes=scenario.nodes
        ) as store:
            actuator.attach(core, store)
            store.add_request(r1)
            core.submit(r1)
            core.cycle()
            first: Allocation = core.running[r1.id]
            runtime.running["17"] = SessionState("17", True, 0, {f"{LABEL_PREFIX}.request": r1.id})
            actuator.live.add(r1.id)
            if agent_known:
                actuator.table.agents[r1.id] = Agent("u1", "s", "secret", "/", runtime_id="17")
            requeue = actuator.preempt(first, "funded")
            teardown = actuator.table.teardowns[r1.id]
            core.finish(r1.id)
            store.add_request(r2)
            core.submit(r2)
            core.cycle()  # r2 fits on r1's GPUs: booked only once r1 is gone
            seen.append("cycle done")
            await teardown.freed
            seen.append(f"freed, removed {runtime.removed}")
            await teardown.done
            for _ in range(100):  # the booking that waited runs once the victim is free
                if f"granted {r2.id}" in seen:
                    break
                await asyncio.sleep(0.01)
            return {
                "requeue": requeue,
                "seen": seen,
                "stopped": hub.stopped,
                "notice": notices.get(("u1", "s"), ""),
                "live": set(actuator.live),
                "agents": set(actuator.table.agents),
                "teardowns": set(actuator.table.teardowns),
                "snapshots": store.list_snapshots(user="u1"),
            }

    return asyncio.run(run())


@pytest.mark.parametrize("agent_known", [True, False])
def test_a_preemptors_booking_waits_for_the_victim_to_go(agent_known: bool) -> None:
    # With the agent known its runtime id is used; without it, the session is found by
    # its label on the node. Either way r2 is granted only after r1's session is removed.
    out = _take_down(agent_known)
    assert out["seen"] == [
        "granted u1/s/r1",
        "preempted u1/s/r1",
        "cycle done",
        "freed, removed ['17']",
        "granted u2/s/r2",
    ]
    assert out["requeue"] is False  # interactive work is not resumable: not spawned again
    assert out["stopped"] == ["u1/s/r1"]
    assert out["notice"].startswith("Your session was stopped at ")
    assert "u1/s/r1" not in out["live"] | out["agents"] | out["teardowns"]
    assert out["snapshots"] == []  # no snapshot store: nothing recorded


def test_an_agent_saved_by_an_earlier_hub_keeps_its_runtime_id() -> None:
    old = {"user": "ann", "server": "", "secret": "s", "base_url": "/", "container_id": "c0"}
    agent = Agent.from_state(old)
    assert agent is not None and agent.runtime_id == "c0"
    both = Agent.from_state({**old, "runtime_id": "4242"})
    assert both is not None and both.runtime_id == "4242"
    assert "container_id" not in Agent("a", "", "s", "/").__dict__


def test_kernel_state_says_why_not_first() -> None:
    busy = [{"notebook": "a.ipynb", "state": "busy", "error": None, "unsaved": {"x": "big"}}]
    done = [{"notebook": "b.ipynb", "state": "saved", "error": None, "unsaved": {}}]
    assert kernel_state(done, None, None) == ("saved", None)
    assert kernel_state(busy + done, None, None) == ("partial", "a.ipynb: busy")
    assert kernel_state(busy, None, "its agent did not answer") == (
        "not saved",
        "its agent did not answer",
    )
    assert kernel_state(busy, "disk full", "late") == ("not saved", "disk full")
    assert unsaved_entries(busy, {"not_flushed": {"c.ipynb": "read-only"}}) == {
        "a.ipynb:x": "big",
        "c.ipynb (unsaved changes)": "read-only",
    }


def _runtime_imports() -> dict[str, set[str]]:
    """Per module of spawner/runtime, the modules of spawner/runtime it imports (anywhere
    in it, TYPE_CHECKING blocks included)."""
    graph: dict[str, set[str]] = {}
    for path in RUNTIME.glob("*.py"):
        tree = ast.parse(path.read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "spawner.runtime."
            ):
                found.add(str(node.module).rsplit(".", 1)[1])
        graph[path.stem] = found
    return graph


def test_the_actuators_modules_import_one_way() -> None:
    graph = _runtime_imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for imported in graph.get(module, ()):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
    for path in RUNTIME.glob("*.py"):
        assert "TYPE_CHECKING" not in path.read_text(), path.name
    # The calls run one way: Takedown -> Lifecycle -> NodeWatch -> Booking.
    assert "takedown" not in graph["lifecycle"] | graph["nodewatch"] | graph["booking"]
    assert "lifecycle" not in graph["nodewatch"] | graph["booking"] | graph["snaprecord"]
    assert "nodewatch" not in graph["booking"]
