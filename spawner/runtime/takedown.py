"""Take-down: a preempted session stopped, its user told why, its slices freed.

`preempt` decides and tells (the core calls it inside a cycle); `_take_down` runs in the
background: a checkpoint through the session's agent, the session removed from its node,
its slices freed (`Teardown.freed`: the preemptor's booking waits for it), its kernel
state recorded as a snapshot (`spawner.runtime.snaprecord`), its server stopped through
the Hub.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import HTTPClientError

from scheduler_core.model import Allocation
from scheduler_core.store import RequestState, StoreError
from spawner.hubapi import split_request_id
from spawner.runtime.booking import Booking
from spawner.runtime.context import Nodes, SessionTable
from spawner.runtime.lifecycle import Lifecycle
from spawner.runtime.snaprecord import SnapshotRecording
from spawner.runtime.spec import LABEL_PREFIX
from spawner.runtime.values import Agent, Checkpointed, Teardown


@dataclass(eq=False, kw_only=True)
class Takedown:
    """Preemption, its messages and the victim's way out. Calls `Booking` to free its
    port, `Lifecycle` to remove the session, `SnapshotRecording` for its snapshot."""

    nodes: Nodes
    table: SessionTable
    booking: Booking
    lifecycle: Lifecycle
    recording: SnapshotRecording
    preempted: Callable[[str], None]
    """Tell the facade that a request was preempted (its spawner stops waiting)."""
    respawn: Callable[[str], None]
    """Spawn a resumable request again through the Hub once it is down."""

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        """Stop a victim and tell its user; resumable work waits again at its old place
        (True), and is spawned again through the Hub.

        In the background (`_take_down`): a checkpoint through its agent, the session
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
        self.nodes.store.append_event(
            now,
            "preempt",
            {"request": allocation.id, "reason": reason, "message": message, "requeued": requeue},
        )
        self.table.notices[split_request_id(allocation.id)] = message
        self.table.live.discard(allocation.id)
        self.table.stopping.add(allocation.id)
        self.table.activity.pop(allocation.id, None)
        self.preempted(allocation.id)
        loop = asyncio.get_running_loop()
        teardown = Teardown(allocation.grants[0].node, loop.create_future(), loop.create_future())
        self.table.teardowns[allocation.id] = teardown
        self.nodes.background(
            self._take_down(allocation, reason, message, state, requeue, now, teardown)
        )
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
        agent = self.table.agents.get(request_id)
        got = await self._remove(request_id, node, agent, reason)
        try:
            self.nodes.store.release(request_id, now, state=state, reason=message)
        except StoreError as error:
            self.nodes.log.warning("budgethub: releasing %s: %s", request_id, error)
        self.booking.free_ports(request_id)
        self.table.stopping.discard(request_id)
        teardown.freed.set_result(None)
        self.nodes.log.info(
            "budgethub: %s preempted (%s): slices free %.2f s after the decision",
            request_id,
            reason,
            time.time() - now,
        )
        self.nodes.changed()
        try:
            if self.recording.enabled and agent is not None:
                # The spawn form shows what it keeps (`BudgetScheduler.snapshot_notice`).
                teardown.snapshot = await self.recording.record(
                    allocation, agent, node, now, reason, got
                )
        except Exception as error:
            self.nodes.log.exception("budgethub: %s: recording its snapshot: %s", request_id, error)
        self.table.agents.pop(request_id, None)
        try:
            await self._stop_through_hub(allocation, requeue)
        finally:
            teardown.done.set_result(None)
            self.table.teardowns.pop(request_id, None)

    async def _remove(
        self, request_id: str, node: str, agent: Agent | None, reason: str
    ) -> Checkpointed:
        """Checkpoint the session's kernels (fetch their state, where the home is a volume
        on the node), then remove the session; what it got of the kernels."""
        answer: dict[str, Any] | None = None
        why_not: str | None = None
        archive: bytes | None = None
        snapshot = self.recording.enabled
        try:
            if snapshot and agent is None:
                why_not = "the Hub does not know this session's agent"
            elif snapshot and agent is not None and not self.nodes.node_answers(node):
                why_not = f"its node {node} does not answer"
            elif snapshot and agent is not None:
                answer, why_not = await self.recording.checkpoint(agent, reason)
            runtime_id = agent.runtime_id if agent is not None else ""
            if not runtime_id:
                runtime_id = await self._find_session(node, request_id)
            if self.recording.needs_archive and runtime_id:
                archive = await self.recording.fetch_state(node, runtime_id, agent)
            await self.lifecycle.stop_session(node, runtime_id, request_id)
        except Exception as error:  # never keep the slices because a snapshot step broke
            self.nodes.log.exception(
                "budgethub: %s: taking the session down: %s", request_id, error
            )
            why_not = why_not or f"the snapshot failed ({type(error).__name__}: {error})"
        return Checkpointed(answer, why_not, archive)

    async def _find_session(self, node: str, request_id: str) -> str:
        """The ``runtime_id`` of the request's session on the node ("" if none, or if the
        node cannot be asked)."""
        if not self.nodes.node_answers(node):
            return ""
        try:
            found = await asyncio.wait_for(
                self.nodes.backends[node].sessions(self.nodes.hub_name),
                self.nodes.timeouts.engine,
            )
        except Exception as error:
            self.nodes.log.warning("budgethub: node %s: listing sessions: %s", node, error)
            return ""
        for session in found:
            if session.labels.get(f"{LABEL_PREFIX}.request") == request_id:
                return session.id
        return ""

    async def _stop_through_hub(self, allocation: Allocation, respawn: bool) -> None:
        try:
            await self.nodes.hub.stop_server(allocation.id)
        except (HTTPClientError, OSError) as error:
            node = allocation.grants[0].node
            self.nodes.log.warning(
                "budgethub: the Hub did not stop %s (%s); stopping its session",
                allocation.id,
                error,
            )
            runtime_id = await self._find_session(node, allocation.id)
            await self.lifecycle.stop_session(node, runtime_id)
        if respawn:
            self.respawn(allocation.id)
