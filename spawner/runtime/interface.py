"""The session lifecycle interface that a runtime implements, one object per node.

Per node, because each node has a manager of its own that answers, fails and drains
on its own (Docker's engine is one: `spawner.runtime.dockernodes.NodeBackend`); the steps mirror
DockerSpawner's overridable ones and kubespawner's split: create = build the spec
(`SessionActuator.create_container`), start = `launch`, poll = `state`, stop/remove =
`remove`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from spawner.runtime.spec import ContainerSpec


@dataclass(frozen=True, slots=True)
class ContainerState:
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
    """Nothing listens (the engine is stopped): its containers are gone with it."""
    DRAINING = "draining"
    """The node's manager drains it: it answers, but takes no new session."""
    DOWN = "down"
    """The node's manager says it is down."""


class OwnedElsewhere(RuntimeError):
    """A container of the session's name belongs to another Hub (or to no Hub)."""


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

    def watch(self, hub: str, on_exit: Callable[[ContainerState], None]) -> None:
        """Call ``on_exit`` (from any thread) each time a session of this Hub's ends."""
        ...

    async def launch(self, spec: ContainerSpec) -> str:
        """Create and start the session; its id (OwnedElsewhere: the name is taken)."""
        ...

    async def state(self, session_id: str) -> ContainerState | None:
        """The session's state, or None when it is gone."""
        ...

    async def remove(self, session_id: str, grace: float = 5.0) -> None:
        """Stop the session (killed after ``grace`` seconds) and remove it."""
        ...

    async def sessions(self, hub: str) -> list[ContainerState]:
        """The sessions this Hub started on the node, running or not."""
        ...

    async def archive(self, session_id: str, path: str) -> bytes | None:
        """A tar of ``path`` in the session, or None when it is not there."""
        ...

    async def logs(self, session_id: str, tail: int = 20) -> str:
        """The session's last ``tail`` lines of output."""
        ...
