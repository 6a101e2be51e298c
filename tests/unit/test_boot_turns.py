"""Sessions boot on a node in turns where its runtime gives turns (issue 50): the second of
two sessions on a one-turn node is created only once the first one's server answers, and
the start says how long each waited; a runtime without turns starts both at once.

No engine: the runtime is a stand-in whose "server" is a small HTTP server on the
session's port that answers after a boot time.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

from spawner.runtime.booking import Booking
from spawner.runtime.context import Nodes, SessionTable
from spawner.runtime.lifecycle import Lifecycle
from spawner.runtime.nodewatch import NodeWatch
from spawner.runtime.spec import LaunchSpec
from spawner.runtime.values import Timeouts

BOOT = 0.3
"""Seconds a stand-in session takes before its server answers."""


class _Runtime:
    def __init__(self, turns: int | None) -> None:
        self.node = "n-0"
        self.config = SimpleNamespace(address="127.0.0.1", network="host", storage={})
        self.events: list[str] = []
        self.servers: list[asyncio.Server] = []
        self._turns = asyncio.Semaphore(turns) if turns else None
        if turns:
            self.boot_slots = self._boot_slots

    async def _boot_slots(self) -> asyncio.Semaphore:
        assert self._turns is not None
        return self._turns

    async def launch(self, spec: LaunchSpec) -> str:
        self.events.append(f"create {spec.name}")
        port = int(spec.labels["port"])

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readline()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()

        async def boot() -> None:
            await asyncio.sleep(BOOT)
            self.servers.append(await asyncio.start_server(answer, "127.0.0.1", port))
            self.events.append(f"answers {spec.name}")

        asyncio.get_running_loop().create_task(boot())
        return spec.name

    async def state(self, runtime_id: str) -> Any:
        return SimpleNamespace(running=True, exit_code=0)

    async def remove(self, runtime_id: str, grace: float = 5.0) -> None:
        pass


class _Lifecycle(Lifecycle):
    def build_spec(self, allocation: Any, ask: Any, port: int) -> LaunchSpec:
        return LaunchSpec(
            name=allocation.id,
            image="none",
            command=(),
            environment={},
            labels={"port": str(port)},
            mounts=(),
            nano_cpus=10**9,
            mem_limit_bytes=2**30,
            gpu_device_ids=(),
        )


async def _start_two(turns: int | None) -> tuple[list[str], list[Any]]:
    runtime = _Runtime(turns)
    nodes = Nodes(
        backends={"n-0": runtime},  # type: ignore[dict-item]
        configured={},
        hub=SimpleNamespace(),  # type: ignore[arg-type]
        hub_name="test",
        timeouts=Timeouts(launch=10),
        changed=lambda: None,
        log=logging.getLogger("test_boot_turns"),
    )
    nodes.attach(SimpleNamespace(running={}, nodes={}), SimpleNamespace())  # type: ignore[arg-type]
    table = SessionTable(agents={}, notices={})
    booking = Booking(nodes=nodes, table=table, port_range=(41000, 41999), granted=lambda a: None)
    watch = NodeWatch(nodes=nodes, table=table, booking=booking)
    lifecycle = _Lifecycle(nodes=nodes, table=table, booking=booking, watch=watch, layout=None)
    ask = SimpleNamespace(base_url="/", agent_secret="")
    started = await asyncio.gather(
        *(
            lifecycle.start_session(
                SimpleNamespace(id=name, grants=[SimpleNamespace(node="n-0")]),  # type: ignore[arg-type]
                ask,  # type: ignore[arg-type]
            )
            for name in ("s1", "s2")
        )
    )
    for server in runtime.servers:
        server.close()
    return runtime.events, list(started)


def test_a_one_turn_node_boots_its_sessions_one_after_the_other() -> None:
    events, (first, second) = asyncio.run(_start_two(turns=1))
    assert events == ["create s1", "answers s1", "create s2", "answers s2"], events
    assert first.turn_s < BOOT / 2 and second.turn_s >= BOOT * 0.9, (first, second)
    assert first.boot_s >= BOOT * 0.9 and second.boot_s >= BOOT * 0.9


def test_a_runtime_without_turns_starts_them_at_once() -> None:
    events, (first, second) = asyncio.run(_start_two(turns=None))
    assert events[:2] == ["create s1", "create s2"], events
    assert first.turn_s < BOOT / 2 and second.turn_s < BOOT / 2
