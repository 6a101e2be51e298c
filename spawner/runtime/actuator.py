"""The actuator: the only holder of the nodes' runtimes (Docker engines, unless
`runtimes` names others). It books and releases slices, starts, polls and stops
session containers, preempts, and follows the nodes' health and container events.

The core calls `launch` and `preempt` inside a cycle (the core's Actuator
protocol); spawners call `start_session`, `poll_session` and `stop_session`
through the facade (embedded.py). The container's life is split in overridable
steps, as in DockerSpawner: `create_container` (build the spec), `start_container`
(create and start it on the engine), `stop_container` (remove it, bounded).
Calls to an engine from a request path are bounded by ``engine_timeout``; an
unreachable node is not called at all.

A preempted session is snapshotted (docs/snapshots.md): its agent checkpoints the
kernels within ``snapshot_grace``, the container goes, the slices are freed, then the
kernel state is copied into the snapshot store and recorded. The preemptor's slices
are booked only once the victim's container is gone (`launch` waits for it), so two
sessions never share a GPU, as a Kubernetes preemptor waits for its victims to end.

One module per concern, each a mixin of `SessionActuator`: booking.py (ports, slices
booked and released), takedown.py (preemption and its messages), snaprecord.py
(snapshot recording), nodewatch.py (health, exits, orphans), lifecycle.py (the
container's steps, idle polls); runtime.py is the interface a node's runtime implements.
Mixins rather than collaborators: the concerns share one state and call each other both
ways, and each step stays an overridable method; each mixin declares what it uses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from scheduler_core.model import Allocation, Health, Node
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import Store
from spawner.hubapi import HubClient
from spawner.runtime.booking import Booking
from spawner.runtime.dockernodes import EngineConfig, NodeBackend
from spawner.runtime.interface import Runtime
from spawner.runtime.lifecycle import (
    AGENT_HEADER,
    Activity,
    Agent,
    IdlePolls,
    LaunchFailed,
    Lifecycle,
    RunningSession,
    SessionLaunch,
    Timeouts,
)
from spawner.runtime.nodewatch import NodeWatch, describe_exit
from spawner.runtime.snaprecord import (  # noqa: F401  (_kernel_entries: its unit tests import it here)
    SnapshotPolicy,
    SnapshotRecording,
    _kernel_entries,
    snapshot_sentence,
)
from spawner.runtime.snapshots import Layout
from spawner.runtime.takedown import Takedown, Teardown

__all__ = [
    "AGENT_HEADER",
    "Activity",
    "Agent",
    "LaunchFailed",
    "RunningSession",
    "SessionActuator",
    "SessionLaunch",
    "SnapshotPolicy",
    "Teardown",
    "Timeouts",
    "describe_exit",
    "snapshot_sentence",
]


class SessionActuator(Booking, Takedown, SnapshotRecording, NodeWatch, Lifecycle, IdlePolls):
    """Sessions as Docker containers on the nodes' engines (or on the given runtimes)."""

    def __init__(
        self,
        engines: Mapping[str, EngineConfig],
        nodes: tuple[Node, ...],
        hub: HubClient,
        *,
        hub_name: str,
        timeouts: Timeouts,
        port_range: tuple[int, int],
        granted: Callable[[Allocation], None],
        preempted: Callable[[str], None],
        changed: Callable[[], None],
        respawn: Callable[[str], None],
        notices: dict[tuple[str, str], str],
        log: logging.Logger | logging.LoggerAdapter[Any],
        layout: Layout | None = None,
        snapshots: SnapshotPolicy | None = None,
        agents: dict[str, Agent] | None = None,
        runtimes: Mapping[str, Runtime] | None = None,
    ) -> None:
        self.log = log
        given = dict(runtimes or {})  # nodes whose sessions a runtime other than Docker runs
        self.backends = {
            name: NodeBackend(engine, ping_timeout=timeouts.ping)
            for name, engine in engines.items()
            if name not in given
        }
        self.backends.update(given)
        self.engines = {name: backend.config for name, backend in self.backends.items()}
        self.configured = {n.name: n.health for n in nodes}
        self.store: Store
        """Given with the core (`attach`): until then only the engines can be asked."""
        self.hub = hub
        self.hub_name = hub_name
        self.timeouts = timeouts
        self.port_range = port_range
        self._granted = granted
        self._preempted = preempted
        self._changed = changed
        self._respawn = respawn
        self.notices = notices
        self.core: Scheduler | None = None
        self.ports: dict[int, str] = {}
        self.live: set[str] = set()
        """Requests whose server runs (its spawner's start returned, or adopted)."""
        self._stopping: set[str] = set()
        """Requests whose container this Hub is removing on purpose."""
        self._unreachable_since: dict[str, float] = {}
        self._orphans: dict[str, set[str]] = {}
        """Per node, containers to remove once the node answers again."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.layout = layout
        """Where homes and snapshots live (None: named volumes, no snapshot store)."""
        self.snapshots = snapshots or SnapshotPolicy(enabled=layout is not None)
        self.agents: dict[str, Agent] = agents if agents is not None else {}
        """Per request, its session's agent (from the start, or the spawner's state)."""
        self.teardowns: dict[str, Teardown] = {}
        self.activity: dict[str, Activity] = {}

    # -- plumbing ------------------------------------------------------------------

    def attach(self, core: Scheduler, store: Store) -> None:
        self.core = core
        self.store = store

    @property
    def _core(self) -> Scheduler:
        assert self.core is not None, "the actuator runs only with a core attached"
        return self.core

    def background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)

    def node_answers(self, node: str) -> bool:
        """False while the node is unreachable or down: calls to its engine would hang."""
        nodes = self.core.nodes if self.core is not None else {}
        health = nodes[node].health if node in nodes else Health.DOWN
        return health not in (Health.UNREACHABLE, Health.DOWN)
