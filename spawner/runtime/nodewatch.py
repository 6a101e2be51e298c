"""Node watching: each node's health from its runtime's pings (docs/operations.md,
"Nodes"), the containers stopped while a node was away, and sessions that end by
themselves (the runtime's exit events, or found gone after a node's absence).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from tornado.httpclient import HTTPClientError

from scheduler_core.model import Health
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import RequestState, Store
from spawner.hubapi import HubClient, split_request_id
from spawner.runtime.interface import Answer, ContainerState, Runtime
from spawner.runtime.lifecycle import Timeouts
from spawner.runtime.spec import LABEL_PREFIX


def describe_exit(state: ContainerState | None) -> str:
    """How a container ended, in words for its user."""
    if state is None:
        return "was gone"
    if state.oom_killed:
        return f"ran out of memory and was killed (exit code {state.exit_code})"
    if state.exit_code == 0:
        return "exited (its server was shut down)"
    if state.exit_code == 137:
        return "was killed (exit code 137)"
    return f"exited with code {state.exit_code}"


class NodeWatch:
    """Health, exit events and orphans: a mixin of `SessionActuator`, which gives it what
    is declared below."""

    log: logging.Logger | logging.LoggerAdapter[Any]
    store: Store
    hub: HubClient
    hub_name: str
    timeouts: Timeouts
    backends: dict[str, Runtime]
    configured: dict[str, Health]
    notices: dict[tuple[str, str], str]
    live: set[str]
    _stopping: set[str]
    _unreachable_since: dict[str, float]
    _orphans: dict[str, set[str]]
    _loop: asyncio.AbstractEventLoop | None
    _changed: Callable[[], None]

    if TYPE_CHECKING:

        @property
        def _core(self) -> Scheduler: ...

        def background(self, coroutine: Coroutine[Any, Any, None]) -> None: ...

        def release(
            self,
            request_id: str,
            state: RequestState = RequestState.FINISHED,
            reason: str | None = None,
        ) -> None: ...

    def watch(self) -> None:
        """Follow every node's container events (see `Runtime.watch`)."""
        self._loop = asyncio.get_running_loop()
        for backend in self.backends.values():
            backend.watch(self.hub_name, self._exited_from_thread)

    # -- containers that end by themselves ------------------------------------------------

    def _exited_from_thread(self, state: ContainerState) -> None:
        """An engine's event thread saw one of this Hub's containers end."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._exited, state)

    def _exited(self, state: ContainerState) -> None:
        request_id = state.labels.get(f"{LABEL_PREFIX}.request", "")
        if request_id in self.live and request_id not in self._stopping:
            self.background(self._inspect_exit(request_id, state))

    async def _inspect_exit(self, request_id: str, event: ContainerState) -> None:
        """The event says that it ended; the container says how (out of memory?)."""
        state = event
        allocation = self._core.running.get(request_id)
        if allocation is not None:
            backend = self.backends[allocation.grants[0].node]
            try:
                seen = await asyncio.wait_for(backend.state(event.id), self.timeouts.engine)
                state = seen if seen is not None else event
            except Exception as error:
                self.log.info("budgethub: %s: inspecting its container: %s", request_id, error)
        self.container_ended(request_id, state, through_hub=True)

    def container_ended(
        self, request_id: str, state: ContainerState | None, *, through_hub: bool = False
    ) -> None:
        """A session's container ended by itself (shut down from inside, killed, out of
        memory, gone): its slices are free at once, its user is told, the container is
        removed and, ``through_hub``, the Hub is told its server stopped."""
        if request_id not in self.live or request_id in self._stopping:
            return
        allocation = self._core.running.get(request_id)
        self.live.discard(request_id)
        if allocation is None:
            return
        why = describe_exit(state)
        now = time.time()
        self.log.warning("budgethub: %s ended by itself: %s", request_id, why)
        self.release(request_id, reason=f"its container ended: {why}")
        self._changed()
        message = (
            f"Your session ended at {time.strftime('%H:%M', time.localtime(now))}: "
            f"its container {why}."
        )
        notify = state is None or state.exit_code != 0  # a clean shutdown needs no notice
        self.store.append_event(
            now,
            "exit",
            {"request": request_id, "reason": why, "message": message, "notify": notify},
        )
        if notify:
            self.notices[split_request_id(request_id)] = message
        node = allocation.grants[0].node
        self.background(self._after_exit(request_id, node, state, through_hub))

    async def _after_exit(
        self, request_id: str, node: str, state: ContainerState | None, through_hub: bool
    ) -> None:
        backend = self.backends[node]
        if state is not None and state.id:
            try:
                logs = await asyncio.wait_for(backend.logs(state.id), self.timeouts.engine)
                self.log.info("budgethub: %s: last lines of its container:\n%s", request_id, logs)
                await asyncio.wait_for(backend.remove(state.id), self.timeouts.engine)
            except Exception as error:
                self.log.warning("budgethub: %s: cleaning up its container: %s", request_id, error)
        if through_hub:
            try:
                await self.hub.stop_server(request_id)
            except (HTTPClientError, OSError) as error:
                self.log.info("budgethub: the Hub did not take %s's stop: %s", request_id, error)

    # -- health ------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Ping every engine (docs/operations.md, "Nodes").

        An engine that refuses connections is down: its containers went with it. One
        that does not answer in time is unreachable: nothing new lands there, its
        sessions are kept, and only after ``node_down_grace`` is it down. A node that
        answers again first loses the containers stopped while it was away. A node's
        manager may also say that it drains the node, or that the node is down."""
        core = self._core
        results = await asyncio.gather(*(b.ping() for b in self.backends.values()))
        now = time.time()
        for (name, backend), answer in zip(self.backends.items(), results, strict=True):
            current = core.nodes[name].health
            answers = answer is Answer.OK or answer is Answer.DRAINING
            if answers:
                self._unreachable_since.pop(name, None)
                if not await self._remove_orphans(name, backend):
                    continue  # it answers pings but not yet the rest: ask again next time
                # DRAINING: the node's manager drains it (never Docker's answer).
                wanted = self.configured[name] if answer is Answer.OK else Health.DRAINING
            elif answer is Answer.DOWN:  # the node's manager says so (never Docker's answer)
                self._unreachable_since.pop(name, None)
                wanted = Health.DOWN
            elif answer is Answer.REFUSED:
                wanted = Health.DOWN
            else:
                since = self._unreachable_since.setdefault(name, now)
                late = now - since >= self.timeouts.node_down_grace
                wanted = Health.DOWN if late or current is Health.DOWN else Health.UNREACHABLE
            if current is wanted:
                continue
            self.log.warning("budgethub: node %s is now %s", name, wanted.value)
            core.set_health(name, wanted)
            if wanted is not Health.UNREACHABLE:  # the store keeps ready, draining, down
                self.store.set_node_health(name, wanted)
            self.store.append_event(now, "node", {"node": name, "state": wanted.value})
            if answers and current is not Health.READY:
                self.background(self._sweep(name, backend))
            self._changed()

    def mark_unreachable(self, node: str, since: float) -> None:
        self._unreachable_since[node] = since

    async def _remove_orphans(self, node: str, backend: Runtime) -> bool:
        """Remove the containers stopped while the node was away; True when none is left."""
        for container_id in list(self._orphans.get(node, ())):
            try:
                await asyncio.wait_for(backend.remove(container_id), self.timeouts.engine)
            except Exception as error:
                self.log.warning("budgethub: node %s: removing %s: %s", node, container_id, error)
                return False
            self._orphans[node].discard(container_id)
            self.log.info("budgethub: node %s: removed %s, stopped while away", node, container_id)
        return True

    async def _sweep(self, node: str, backend: Runtime) -> None:
        """After an absence: sessions of the node whose container ended meanwhile end now."""
        try:
            containers = await backend.sessions(self.hub_name)
        except Exception as error:
            self.log.warning("budgethub: node %s: listing sessions: %s", node, error)
            return
        running = {c.labels.get(f"{LABEL_PREFIX}.request", "") for c in containers if c.running}
        for request_id in list(self.live):
            allocation = self._core.running.get(request_id)
            if allocation is not None and node in allocation.node_names:
                if request_id not in running:
                    self.container_ended(request_id, None, through_hub=True)
