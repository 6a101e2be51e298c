"""Booking: a session's port, and its slices from the core's grant to the session's end.

The core calls `launch` inside a cycle (the core's Actuator protocol): the admission's
slices are booked in the store once the victims on its nodes are gone
(`spawner.runtime.takedown`), then the grant is handed on. `release` and `requeue` free them.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler_core.model import Allocation
from scheduler_core.store import RequestState, SliceConflict, StoreError
from spawner.runtime.context import Nodes, SessionTable


@dataclass(eq=False, kw_only=True)
class Booking:
    """Ports, and slices booked and released. Owns the ports; calls no other
    collaborator."""

    nodes: Nodes
    table: SessionTable
    port_range: tuple[int, int]
    granted: Callable[[Allocation], None]
    """Hand a booked grant on (to its spawner)."""
    ports: dict[int, str] = field(default_factory=dict, init=False)
    """Per port, the request whose session holds it."""

    # -- ports ---------------------------------------------------------------------

    def allocate_port(self, request_id: str) -> int:
        """A free port for a session, never one another session holds."""
        low, high = self.port_range
        for _ in range(high - low + 1):
            port = secrets.randbelow(high - low + 1) + low
            if port in self.ports:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            self.ports[port] = request_id
            return int(port)
        raise RuntimeError(f"no free port in {low}-{high}")

    def hold_port(self, port: int, request_id: str) -> None:
        self.ports[port] = request_id

    def free_ports(self, request_id: str) -> None:
        for port in [p for p, holder in self.ports.items() if holder == request_id]:
            del self.ports[port]

    # -- booking and release (the core's Actuator protocol, and the ends of sessions) ----

    def launch(self, allocation: Allocation) -> None:
        """Book the admission's slices in the store, then hand the grant on; after the
        victims on its nodes are gone (and, for preempted work that waits
        again, after its own snapshot)."""
        waits = [
            t.done if request_id == allocation.id else t.freed
            for request_id, t in self.table.teardowns.items()
            if request_id == allocation.id or t.node in allocation.node_names
        ]
        if waits:
            self.nodes.background(self._launch_after(allocation, waits))
            return
        self._book(allocation)

    async def _launch_after(
        self, allocation: Allocation, waits: list[asyncio.Future[None]]
    ) -> None:
        await asyncio.gather(*(asyncio.shield(w) for w in waits), return_exceptions=True)
        if self.nodes.core.running.get(allocation.id) is allocation:
            self._book(allocation)

    def _book(self, allocation: Allocation) -> None:
        try:
            self.nodes.store.book(allocation)
        except (SliceConflict, StoreError) as error:
            # Another scheduler writing to the same store got there first.
            self.nodes.log.warning("budgethub: cannot book %s: %s", allocation.id, error)
            asyncio.get_running_loop().call_soon(self._book_failed, allocation.id)
            return
        self.nodes.log.info(
            "budgethub: granted %s on %s, %.1f ms after its submission (%s)",
            allocation.id,
            ",".join(allocation.node_names),
            (time.time() - allocation.request.submit) * 1e3,
            "funded" if allocation.funded else "unallocated",
        )
        self.granted(allocation)

    def _book_failed(self, request_id: str) -> None:
        if request_id in self.nodes.core.running:
            self.nodes.core.launch_failed(request_id)
        self.nodes.changed()

    def release(
        self,
        request_id: str,
        state: RequestState = RequestState.FINISHED,
        reason: str | None = None,
    ) -> None:
        """The session ended: stop charging, free its slices (in the core and the store)
        and its port."""
        self.table.live.discard(request_id)
        self.table.stopping.discard(request_id)
        self.free_ports(request_id)
        if request_id in self.nodes.core.running:
            self.nodes.core.finish(request_id)
            try:
                self.nodes.store.release(request_id, time.time(), state=state, reason=reason)
            except StoreError as error:
                self.nodes.log.warning("budgethub: releasing %s: %s", request_id, error)

    def requeue(self, request_id: str, reason: str) -> None:
        """The session did not start: slices back, the request waits at its old place."""
        self.free_ports(request_id)
        self.table.live.discard(request_id)
        if request_id in self.nodes.core.running:
            self.nodes.store.release(
                request_id, time.time(), state=RequestState.REQUEUED, reason=reason
            )
            self.nodes.core.launch_failed(request_id)
