"""The session lifecycle interface that a runtime implements, one object per node.

Per node, because each node has a manager of its own that answers, fails and drains
on its own (Docker's engine is one: `spawner.runtime.dockernodes.NodeBackend`); the steps mirror
DockerSpawner's overridable ones and kubespawner's split: create = build the spec
(`Lifecycle.build_spec`), start = `launch`, poll = `state`, stop/remove = `remove`.

A session's ``runtime_id`` is what its runtime calls it: a Docker container id, a Slurm
job id (a pod's name, on Kubernetes).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from spawner.runtime.spec import LaunchSpec


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session as its runtime sees it; ``id`` is its ``runtime_id``."""

    id: str
    running: bool
    exit_code: int
    labels: Mapping[str, str]
    oom_killed: bool = False


class Answer(enum.Enum):
    """How an engine answered a health ping."""

    OK = "ok"
    TIMEOUT = "timeout"
    """Connected, or tried to, and heard nothing in time: a frozen engine, a cut link."""
    REFUSED = "refused"
    """Nothing listens (the engine is stopped): its sessions are gone with it."""
    DRAINING = "draining"
    """The node's manager drains it: it answers, but takes no new session."""
    DOWN = "down"
    """The node's manager says it is down."""


class OwnedElsewhere(RuntimeError):
    """A session of the same name belongs to another Hub (or to no Hub)."""


class NodeConfig(Protocol):
    """What the actuator reads of a node's configuration (`spawner.runtime.dockernodes.EngineConfig`
    is one)."""

    @property
    def url(self) -> str | None:
        """Where the node's manager is reached (recorded in the store); None: the local one."""
        ...

    @property
    def address(self) -> str:
        """Where the Hub reaches sessions on this node."""
        ...

    @property
    def network(self) -> str: ...

    @property
    def storage(self) -> Mapping[str, str]:
        """Storage name → path on the node, bind-mounted into data-prep sessions."""
        ...

    @property
    def nvidia(self) -> bool:
        """Real GPUs: hand the NVIDIA runtime the granted device ids."""
        ...


class Runtime(Protocol):
    """One node's sessions: what the actuator asks of a node, whatever runs them."""

    @property
    def node(self) -> str: ...

    @property
    def config(self) -> NodeConfig: ...

    async def ping(self) -> Answer:
        """How the node answers now (bounded: never longer than its ping timeout)."""
        ...

    def watch(self, hub: str, on_exit: Callable[[SessionState], None]) -> None:
        """Call ``on_exit`` (from any thread) each time a session of this Hub's ends."""
        ...

    async def launch(self, spec: LaunchSpec) -> str:
        """Create and start the session; its id (OwnedElsewhere: the name is taken)."""
        ...

    async def state(self, runtime_id: str) -> SessionState | None:
        """The session's state, or None when it is gone."""
        ...

    async def remove(self, runtime_id: str, grace: float = 5.0) -> None:
        """Stop the session (killed after ``grace`` seconds) and remove it."""
        ...

    async def sessions(self, hub: str) -> list[SessionState]:
        """The sessions this Hub started on the node, running or not."""
        ...

    async def archive(self, runtime_id: str, path: str) -> bytes | None:
        """A tar of ``path`` in the session, or None when it is not there."""
        ...

    async def logs(self, runtime_id: str, tail: int = 20) -> str:
        """The session's last ``tail`` lines of output."""
        ...
