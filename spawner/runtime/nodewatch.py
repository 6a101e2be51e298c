"""Node watching: each node's health from its runtime's pings (docs/operations.md,
"Nodes"), the sessions stopped while a node was away, and sessions that end by
themselves (the runtime's exit events, or found gone after a node's absence).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from tornado.httpclient import HTTPClientError

from scheduler_core.model import Health
from spawner.hubapi import split_request_id
from spawner.runtime.booking import Booking
from spawner.runtime.context import Nodes, SessionTable
from spawner.runtime.interface import Answer, Runtime, SessionState
from spawner.runtime.spec import LABEL_PREFIX


def describe_exit(state: SessionState | None) -> str:
    """How a session ended, in words for its user."""
    if state is None:
        return "was gone"
    if state.oom_killed:
        return f"ran out of memory and was killed (exit code {state.exit_code})"
    if state.exit_code == 0:
        return "exited (its server was shut down)"
    if state.exit_code == 137:
        return "was killed (exit code 137)"
    return f"exited with code {state.exit_code}"


@dataclass(eq=False, kw_only=True)
class NodeWatch:
    """Health, exit events and orphans. Owns each node's absence and the sessions left
    to remove there; calls `Booking` to free the slices of a session that ended."""

    nodes: Nodes
    table: SessionTable
    booking: Booking
    _unreachable_since: dict[str, float] = field(default_factory=dict, init=False)
    _orphans: dict[str, set[str]] = field(default_factory=dict, init=False)
    """Per node, sessions to remove once the node answers again."""
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)

    def watch(self) -> None:
        """Follow every node's session ends (see `Runtime.watch`)."""
        self._loop = asyncio.get_running_loop()
        for backend in self.nodes.backends.values():
            backend.watch(self.nodes.hub_name, self._exited_from_thread)

    # -- sessions that end by themselves --------------------------------------------------

    def _exited_from_thread(self, state: SessionState) -> None:
        """A runtime's event thread saw one of this Hub's sessions end."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._exited, state)

    def _exited(self, state: SessionState) -> None:
        request_id = state.labels.get(f"{LABEL_PREFIX}.request", "")
        if request_id in self.table.live and request_id not in self.table.stopping:
            self.nodes.background(self._inspect_exit(request_id, state))

    async def _inspect_exit(self, request_id: str, event: SessionState) -> None:
        """The event says that it ended; its runtime says how (out of memory?)."""
        state = event
        allocation = self.nodes.core.running.get(request_id)
        if allocation is not None:
            backend = self.nodes.backends[allocation.grants[0].node]
            try:
                seen = await asyncio.wait_for(backend.state(event.id), self.nodes.timeouts.engine)
                state = seen if seen is not None else event
            except Exception as error:
                self.nodes.log.info("budgethub: %s: inspecting its session: %s", request_id, error)
        self.session_ended(request_id, state, through_hub=True)

    def session_ended(
        self, request_id: str, state: SessionState | None, *, through_hub: bool = False
    ) -> None:
        """A session ended by itself (shut down from inside, killed, out of memory,
        gone): its slices are free at once, its user is told, the session is
        removed and, ``through_hub``, the Hub is told its server stopped."""
        if request_id not in self.table.live or request_id in self.table.stopping:
            return
        allocation = self.nodes.core.running.get(request_id)
        self.table.live.discard(request_id)
        if allocation is None:
            return
        why = describe_exit(state)
        now = time.time()
        self.nodes.log.warning("budgethub: %s ended by itself: %s", request_id, why)
        self.booking.release(request_id, reason=f"the session {why}")
        self.nodes.changed()
        message = f"Your session ended at {time.strftime('%H:%M', time.localtime(now))}: it {why}."
        notify = state is None or state.exit_code != 0  # a clean shutdown needs no notice
        self.nodes.store.append_event(
            now,
            "exit",
            {"request": request_id, "reason": why, "message": message, "notify": notify},
        )
        if notify:
            self.table.notices[split_request_id(request_id)] = message
        node = allocation.grants[0].node
        self.nodes.background(self._after_exit(request_id, node, state, through_hub))

    async def _after_exit(
        self, request_id: str, node: str, state: SessionState | None, through_hub: bool
    ) -> None:
        backend = self.nodes.backends[node]
        if state is not None and state.id:
            try:
                logs = await asyncio.wait_for(backend.logs(state.id), self.nodes.timeouts.engine)
                self.nodes.log.info(
                    "budgethub: %s: last lines of its session:\n%s", request_id, logs
                )
                await asyncio.wait_for(backend.remove(state.id), self.nodes.timeouts.engine)
            except Exception as error:
                self.nodes.log.warning(
                    "budgethub: %s: cleaning up its session: %s", request_id, error
                )
        if through_hub:
            try:
                await self.nodes.hub.stop_server(request_id)
            except (HTTPClientError, OSError) as error:
                self.nodes.log.info(
                    "budgethub: the Hub did not take %s's stop: %s", request_id, error
                )

    # -- health ------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Ping every node's runtime (docs/operations.md, "Nodes").

        A runtime that refuses connections is down: its sessions went with it. One
        that does not answer in time is unreachable: nothing new lands there, its
        sessions are kept, and only after ``node_down_grace`` is it down. A node that
        answers again first loses the sessions stopped while it was away. A node's
        manager may also say that it drains the node, or that the node is down."""
        core = self.nodes.core
        results = await asyncio.gather(*(b.ping() for b in self.nodes.backends.values()))
        now = time.time()
        for (name, backend), answer in zip(self.nodes.backends.items(), results, strict=True):
            current = core.nodes[name].health
            answers = answer is Answer.OK or answer is Answer.DRAINING
            if answers:
                self._unreachable_since.pop(name, None)
                if not await self._remove_orphans(name, backend):
                    continue  # it answers pings but not yet the rest: ask again next time
                # DRAINING: the node's manager drains it (never Docker's answer).
                wanted = self.nodes.configured[name] if answer is Answer.OK else Health.DRAINING
            elif answer is Answer.DOWN:  # the node's manager says so (never Docker's answer)
                self._unreachable_since.pop(name, None)
                wanted = Health.DOWN
            elif answer is Answer.REFUSED:
                wanted = Health.DOWN
            else:
                since = self._unreachable_since.setdefault(name, now)
                late = now - since >= self.nodes.timeouts.node_down_grace
                wanted = Health.DOWN if late or current is Health.DOWN else Health.UNREACHABLE
            if current is wanted:
                continue
            self.nodes.log.warning("budgethub: node %s is now %s", name, wanted.value)
            core.set_health(name, wanted)
            if wanted is not Health.UNREACHABLE:  # the store keeps ready, draining, down
                self.nodes.store.set_node_health(name, wanted)
            self.nodes.store.append_event(now, "node", {"node": name, "state": wanted.value})
            if answers and current is not Health.READY:
                self.nodes.background(self._sweep(name, backend))
            self.nodes.changed()

    def mark_unreachable(self, node: str, since: float) -> None:
        self._unreachable_since[node] = since

    def leave_orphan(self, node: str, runtime_id: str) -> None:
        """A session that cannot be removed now: removed once its node answers again."""
        self._orphans.setdefault(node, set()).add(runtime_id)

    async def _remove_orphans(self, node: str, backend: Runtime) -> bool:
        """Remove the sessions stopped while the node was away; True when none is left."""
        for runtime_id in list(self._orphans.get(node, ())):
            try:
                await asyncio.wait_for(backend.remove(runtime_id), self.nodes.timeouts.engine)
            except Exception as error:
                self.nodes.log.warning(
                    "budgethub: node %s: removing %s: %s", node, runtime_id, error
                )
                return False
            self._orphans[node].discard(runtime_id)
            self.nodes.log.info(
                "budgethub: node %s: removed %s, stopped while away", node, runtime_id
            )
        return True

    async def _sweep(self, node: str, backend: Runtime) -> None:
        """After an absence: sessions of the node that ended meanwhile end now."""
        try:
            found = await backend.sessions(self.nodes.hub_name)
        except Exception as error:
            self.nodes.log.warning("budgethub: node %s: listing sessions: %s", node, error)
            return
        running = {c.labels.get(f"{LABEL_PREFIX}.request", "") for c in found if c.running}
        for request_id in list(self.table.live):
            allocation = self.nodes.core.running.get(request_id)
            if allocation is not None and node in allocation.node_names:
                if request_id not in running:
                    self.session_ended(request_id, None, through_hub=True)
