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
from dataclasses import dataclass, field
from typing import Any

from scheduler_core.model import Health
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import Store
from spawner.hubapi import HubClient
from spawner.runtime.interface import NodeConfig, Runtime
from spawner.runtime.values import Activity, Agent, Teardown, Timeouts

Log = logging.Logger | logging.LoggerAdapter[Any]


@dataclass(eq=False, kw_only=True)
class Nodes:
    """The nodes' runtimes and what calls to them need."""

    backends: dict[str, Runtime]
    configured: dict[str, Health]
    """Per node, the health its configuration gives it (draining set by an admin)."""
    hub: HubClient
    hub_name: str
    timeouts: Timeouts
    changed: Callable[[], None]
    """Tell the facade that the queue or the cluster changed (another cycle is due)."""
    log: Log
    attached: Scheduler | None = field(default=None, init=False)
    _store: Store | None = field(default=None, init=False)
    _background: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    @property
    def configs(self) -> dict[str, NodeConfig]:
        """Per node, its runtime's configuration."""
        return {name: backend.config for name, backend in self.backends.items()}

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


@dataclass(eq=False, kw_only=True)
class SessionTable:
    """Per request, what the collaborators know of its session."""

    agents: dict[str, Agent]
    """Per request, its session's agent (from the start, or the spawner's state)."""
    notices: dict[tuple[str, str], str]
    """Per (user, server), what its user is told of its last end."""
    live: set[str] = field(default_factory=set, init=False)
    """Requests whose server runs (its spawner's start returned, or adopted)."""
    stopping: set[str] = field(default_factory=set, init=False)
    """Requests whose session this Hub is removing on purpose."""
    activity: dict[str, Activity] = field(default_factory=dict, init=False)
    """Per request, what its agent last said."""
    teardowns: dict[str, Teardown] = field(default_factory=dict, init=False)
    """Preempted sessions on their way out (launches on their nodes wait for them)."""
