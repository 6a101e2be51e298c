"""What every collaborator of the actuator reads, made once by `SessionActuator`.

`Nodes`: the nodes' runtimes and configuration, the Hub's API, the core and the store
(once attached), the log and the background tasks. `SessionTable`: what is known per
session (running, being removed, its agent, its last activity, its take-down) and the
notices its user is shown. Each collaborator is handed these two and the collaborators
it calls; none reaches another through them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from scheduler_core.model import Health
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import Store
from spawner.hubapi import HubClient
from spawner.runtime.interface import NodeConfig, Runtime
from spawner.runtime.values import Activity, Agent, Teardown, Timeouts

Log = logging.Logger | logging.LoggerAdapter[Any]


class Nodes:
    """The nodes' runtimes and what calls to them need."""

    def __init__(
        self,
        backends: dict[str, Runtime],
        configured: dict[str, Health],
        hub: HubClient,
        *,
        hub_name: str,
        timeouts: Timeouts,
        changed: Callable[[], None],
        log: Log,
    ) -> None:
        self.backends = backends
        self.configs: dict[str, NodeConfig] = {n: b.config for n, b in backends.items()}
        self.configured = configured
        """Per node, the health its configuration gives it (draining set by an admin)."""
        self.hub = hub
        self.hub_name = hub_name
        self.timeouts = timeouts
        self.changed = changed
        """Tell the facade that the queue or the cluster changed (another cycle is due)."""
        self.log = log
        self.attached: Scheduler | None = None
        self._store: Store | None = None
        self._background: set[asyncio.Task[None]] = set()

    def attach(self, core: Scheduler, store: Store) -> None:
        self.attached = core
        self._store = store

    @property
    def core(self) -> Scheduler:
        assert self.attached is not None, "the actuator runs only with a core attached"
        return self.attached

    @property
    def store(self) -> Store:
        """Given with the core (`attach`): until then only the runtimes can be asked."""
        assert self._store is not None, "the actuator runs only with a store attached"
        return self._store

    def background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)

    def node_answers(self, node: str) -> bool:
        """False while the node is unreachable or down: calls to its runtime would hang."""
        nodes = self.attached.nodes if self.attached is not None else {}
        health = nodes[node].health if node in nodes else Health.DOWN
        return health not in (Health.UNREACHABLE, Health.DOWN)


class SessionTable:
    """Per request, what the collaborators know of its session."""

    def __init__(self, agents: dict[str, Agent], notices: dict[tuple[str, str], str]) -> None:
        self.live: set[str] = set()
        """Requests whose server runs (its spawner's start returned, or adopted)."""
        self.stopping: set[str] = set()
        """Requests whose session this Hub is removing on purpose."""
        self.agents = agents
        """Per request, its session's agent (from the start, or the spawner's state)."""
        self.activity: dict[str, Activity] = {}
        self.teardowns: dict[str, Teardown] = {}
        """Preempted sessions on their way out (launches on their nodes wait for them)."""
        self.notices = notices
        """Per (user, server), what its user is told of its last end."""
