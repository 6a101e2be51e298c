"""Take-down: a preempted session stopped, its user told why, its slices freed.

`preempt` decides and tells (the core calls it inside a cycle); `_take_down` runs in the
background: a checkpoint through the session's agent, its container removed, its slices
freed (`Teardown.freed`: the preemptor's booking waits for it), its kernel state recorded
as a snapshot (`spawner.runtime.snaprecord`), its server stopped through the Hub.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tornado.httpclient import HTTPClientError

from scheduler_core.model import Allocation
from scheduler_core.store import RequestState, Store, StoreError
from spawner.hubapi import HubClient, split_request_id
from spawner.runtime.interface import Runtime
from spawner.runtime.lifecycle import Activity, Agent, Timeouts
from spawner.runtime.snaprecord import SnapshotPolicy
from spawner.runtime.snapshots import Layout
from spawner.runtime.spec import LABEL_PREFIX


@dataclass
class Teardown:
    """A preempted session on its way out: ``freed`` once its container is gone and its
    slices free, ``done`` once it is recorded and its server stopped."""

    node: str
    freed: asyncio.Future[None]
    done: asyncio.Future[None]
    snapshot: str | None = None


class Takedown:
    """Preemption, its messages and the victim's way out: a mixin of
    `SessionActuator`, which gives it what is declared below."""

    log: logging.Logger | logging.LoggerAdapter[Any]
    store: Store
    hub: HubClient
    hub_name: str
    timeouts: Timeouts
    backends: dict[str, Runtime]
    layout: Layout | None
    snapshots: SnapshotPolicy
    agents: dict[str, Agent]
    teardowns: dict[str, Teardown]
    activity: dict[str, Activity]
    notices: dict[tuple[str, str], str]
    live: set[str]
    _stopping: set[str]
    _preempted: Callable[[str], None]
    _respawn: Callable[[str], None]
    _changed: Callable[[], None]

    if TYPE_CHECKING:

        def background(self, coroutine: Coroutine[Any, Any, None]) -> None: ...

        def node_answers(self, node: str) -> bool: ...

        def _free_ports(self, request_id: str) -> None: ...

        async def stop_container(
            self, node: str, container_id: str, request_id: str = ""
        ) -> None: ...

        async def _checkpoint(
            self, agent: Agent, reason: str = "funded"
        ) -> tuple[dict[str, Any] | None, str | None]: ...

        async def _fetch_state(
            self, node: str, container_id: str, agent: Agent | None
        ) -> bytes | None: ...

        async def _record_snapshot(
            self,
            allocation: Allocation,
            agent: Agent,
            node: str,
            now: float,
            reason: str,
            checkpoint: dict[str, Any] | None,
            why_not: str | None,
            archive: bytes | None,
        ) -> str: ...

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        """Stop a victim and tell its user; resumable work waits again at its old place
        (True), and is spawned again through the Hub.

        In the background (`_take_down`): a checkpoint through its agent, its container
        removed, its slices freed, its kernel state copied and recorded as a snapshot,
        its server stopped through the Hub."""
        now = time.time()
        how = (
            "its protected time was over"
            if allocation.funded
            else "your session ran unallocated, on idle capacity"
        )
        why = {
            "funded": f"a session funded by a team's budget needed its GPUs ({how})",
            "drain": "its node is being drained",
            "node-down": "its node stopped answering",
            "idle": "it was idle and a session funded by a team's budget needed its GPUs",
            "debug": f"a debug session needed its GPUs ({how})",
            "time-slice": (
                "your team has had its day's share of GPU time and others are waiting;"
                " it is larger than your team's share, so it runs in daily slices"
            ),
        }.get(reason, reason)
        requeue = allocation.request.resumable
        then = (
            "; it waits in the queue again at its old place and starts again by itself"
            if requeue
            else ""
        )
        message = (
            f"Your session was stopped at {time.strftime('%H:%M', time.localtime(now))}: "
            f"{why}{then}."
        )
        state = RequestState.REQUEUED if requeue else RequestState.FINISHED
        self.store.append_event(
            now, "preempt", {"request": allocation.id, "reason": reason, "message": message}
        )
        self.notices[split_request_id(allocation.id)] = message
        self.live.discard(allocation.id)
        self._stopping.add(allocation.id)
        self.activity.pop(allocation.id, None)
        self._preempted(allocation.id)
        loop = asyncio.get_running_loop()
        teardown = Teardown(allocation.grants[0].node, loop.create_future(), loop.create_future())
        self.teardowns[allocation.id] = teardown
        self.background(self._take_down(allocation, reason, message, state, requeue, now, teardown))
        return requeue

    async def _take_down(
        self,
        allocation: Allocation,
        reason: str,
        message: str,
        state: RequestState,
        requeue: bool,
        now: float,
        teardown: Teardown,
    ) -> None:
        request_id = allocation.id
        node = allocation.grants[0].node
        agent = self.agents.get(request_id)
        checkpoint: dict[str, Any] | None = None
        why_not: str | None = None
        archive: bytes | None = None
        snapshot = self.snapshots.enabled and self.layout is not None
        try:
            if snapshot and agent is None:
                why_not = "the Hub does not know this session's agent"
            elif snapshot and agent is not None and not self.node_answers(node):
                why_not = f"its node {node} does not answer"
            elif snapshot and agent is not None:
                checkpoint, why_not = await self._checkpoint(agent, reason)
            container_id = agent.container_id if agent is not None else ""
            if not container_id:
                container_id = await self._find_container(node, request_id)
            layout = self.layout
            if snapshot and layout is not None and layout.home_root is None and container_id:
                archive = await self._fetch_state(node, container_id, agent)
            await self.stop_container(node, container_id, request_id)
        except Exception as error:  # never keep the slices because a snapshot step broke
            self.log.exception("budgethub: %s: taking the session down: %s", request_id, error)
            why_not = why_not or f"the snapshot failed ({type(error).__name__}: {error})"
        try:
            self.store.release(request_id, now, state=state, reason=message)
        except StoreError as error:
            self.log.warning("budgethub: releasing %s: %s", request_id, error)
        self._free_ports(request_id)
        self._stopping.discard(request_id)
        teardown.freed.set_result(None)
        self.log.info(
            "budgethub: %s preempted (%s): slices free %.2f s after the decision",
            request_id,
            reason,
            time.time() - now,
        )
        self._changed()
        try:
            if snapshot and agent is not None:
                # The spawn form shows what it keeps (`BudgetScheduler.snapshot_notice`).
                teardown.snapshot = await self._record_snapshot(
                    allocation, agent, node, now, reason, checkpoint, why_not, archive
                )
        except Exception as error:
            self.log.exception("budgethub: %s: recording its snapshot: %s", request_id, error)
        self.agents.pop(request_id, None)
        try:
            await self._stop_through_hub(allocation, requeue)
        finally:
            teardown.done.set_result(None)
            self.teardowns.pop(request_id, None)

    async def _find_container(self, node: str, request_id: str) -> str:
        if not self.node_answers(node):
            return ""
        try:
            found = await asyncio.wait_for(
                self.backends[node].sessions(self.hub_name), self.timeouts.engine
            )
        except Exception as error:
            self.log.warning("budgethub: node %s: listing sessions: %s", node, error)
            return ""
        for container in found:
            if container.labels.get(f"{LABEL_PREFIX}.request") == request_id:
                return container.id
        return ""

    async def _stop_through_hub(self, allocation: Allocation, respawn: bool) -> None:
        try:
            await self.hub.stop_server(allocation.id)
        except (HTTPClientError, OSError) as error:
            node = allocation.grants[0].node
            self.log.warning(
                "budgethub: the Hub did not stop %s (%s); stopping its container",
                allocation.id,
                error,
            )
            backend = self.backends[node]
            try:
                found = await asyncio.wait_for(
                    backend.sessions(self.hub_name), self.timeouts.engine
                )
                for container in found:
                    if container.labels.get(f"{LABEL_PREFIX}.request") == allocation.id:
                        await self.stop_container(node, container.id)
            except Exception as error:
                self.log.warning("budgethub: node %s: stopping %s: %s", node, allocation.id, error)
        if respawn:
            self._respawn(allocation.id)
