"""Idle polls: each running session's agent asked whether it is busy, and the core told
which sessions are idle and since when (idle sessions are the first victims).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from spawner.runtime.context import Nodes, SessionTable
from spawner.runtime.values import AGENT_HEADER, Activity, Agent


def _epoch(value: Any, default: float) -> float:
    """Seconds since the epoch from an ISO 8601 time (``default`` if it is none)."""
    if not isinstance(value, str):
        return default
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


@dataclass(eq=False, kw_only=True)
class IdlePolls:
    """What each session's agent says (busy, or idle since when); writes the table's
    activity and calls no other collaborator."""

    nodes: Nodes
    table: SessionTable

    # -- idle sessions ---------------------------------------------------------------

    async def poll_activity(self) -> None:
        """Ask each running session's agent whether it is busy; tell the core which are
        idle and since when (idle sessions are the first victims)."""
        core = self.nodes.core
        asks = [
            (request_id, agent)
            for request_id, agent in list(self.table.agents.items())
            if request_id in self.table.live
            and agent.port
            and request_id not in self.table.teardowns
        ]
        answers = await asyncio.gather(*(self._status(agent) for _, agent in asks))
        now = time.time()
        for (request_id, _agent), status in zip(asks, answers, strict=True):
            if status is None or request_id not in core.running:
                continue
            busy = bool(status.get("busy"))
            idle_since = None if busy else _epoch(status.get("last_activity"), now)
            before = self.table.activity.get(request_id)
            kernels = list(status.get("kernels") or [])
            self.table.activity[request_id] = Activity(now, busy, idle_since, kernels)
            if before is None or before.busy != busy:
                self.nodes.store.append_event(
                    now,
                    "activity",
                    {"request": request_id, "busy": busy, "idle_since": idle_since},
                )
            mark = getattr(core, "mark_activity", None)
            if mark is not None:
                mark(request_id, idle_since)

    async def _status(self, agent: Agent) -> dict[str, Any] | None:
        request = HTTPRequest(
            agent.url("status"),
            headers={AGENT_HEADER: agent.secret},
            connect_timeout=2.0,
            request_timeout=5.0,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
            answer = json.loads(response.body)
        except (HTTPClientError, OSError, ValueError) as error:
            self.nodes.log.debug("budgethub: agent at %s: %s", agent.url("status"), error)
            return None
        return answer if isinstance(answer, dict) else None
