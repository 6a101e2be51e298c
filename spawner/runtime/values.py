"""The values the actuator's collaborators hand each other and the Hub side: what a
spawner asks for and gets back, how a session's agent is reached and what it last said,
a preempted session on its way out, and the settings (timeouts, snapshots).

Plain data, no behaviour beyond reading and writing itself; nothing here imports another
module of ``spawner.runtime`` but the spec's `SessionIdentity`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spawner.runtime.spec import SessionIdentity

AGENT_HEADER = "X-Budgethub-Agent"
"""The header that carries a session's agent secret."""


class LaunchFailed(RuntimeError):
    """A granted session did not start (or never answered)."""

    def __init__(self, node: str, reason: str, *, final: bool = False) -> None:
        super().__init__(f"on node {node}: {reason}")
        self.node = node
        self.reason = reason
        self.final = final
        """Trying again cannot help (a misconfigured node or a name another Hub holds)."""


@dataclass(frozen=True)
class SessionLaunch:
    """What a spawner asks for when its request is granted."""

    identity: SessionIdentity
    image: str
    hub_env: Mapping[str, str]
    base_url: str
    storage: str | None
    """The storage name a data-prep profile mounts, if any."""
    pids_limit: int
    agent_secret: str = ""
    """The session's agent secret (``BUDGETHUB_AGENT_SECRET``), kept in the spawner state."""
    restore: str | None = None
    """The key of the snapshot this start restores (checked by the facade), or None."""


@dataclass(frozen=True)
class RunningSession:
    """A started session: its runtime's id for it, and where its server answers."""

    runtime_id: str
    address: str
    port: int
    turn_s: float = 0.0
    """Seconds it waited for its turn to boot on the node (`Lifecycle._boot_slot`)."""
    boot_s: float = 0.0
    """Seconds from its creation on the node until its server answered."""


@dataclass
class Agent:
    """How the spawner reaches one session's agent (its server's port, directly)."""

    user: str
    server: str
    secret: str
    base_url: str
    address: str = ""
    port: int = 0
    runtime_id: str = ""
    image: str = ""

    def url(self, route: str) -> str:
        return f"http://{self.address}:{self.port}{self.base_url}budgethub-agent/{route}"

    @classmethod
    def from_state(cls, state: Any) -> Agent | None:
        """From a spawner's saved state; None for anything that does not fit. A Hub of an
        earlier version saved ``runtime_id`` as ``container_id``: read either."""
        if not isinstance(state, dict):
            return None
        if "runtime_id" not in state and "container_id" in state:
            state = {**state, "runtime_id": state["container_id"]}
        known = {k: state[k] for k in cls.__dataclass_fields__ if k in state}
        try:
            return cls(**known)
        except TypeError:
            return None


@dataclass
class Activity:
    """What a session's agent last said: busy, or idle since when."""

    asked: float
    busy: bool
    idle_since: float | None
    kernels: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Timeouts:
    engine: float = 10.0
    """Longest wait for a node's runtime on a request path (``engine_timeout``)."""
    ping: float = 5.0
    launch: float = 120.0
    node_down_grace: float = 120.0


@dataclass(frozen=True)
class SnapshotPolicy:
    enabled: bool = True
    keep: int = 3
    grace: float = 20.0


@dataclass
class Teardown:
    """A preempted session on its way out: ``freed`` once it is gone from its node and its
    slices are free, ``done`` once it is recorded and its server stopped."""

    node: str
    freed: asyncio.Future[None]
    done: asyncio.Future[None]
    snapshot: str | None = None


@dataclass(frozen=True)
class Checkpointed:
    """What a take-down got of a session's kernels before the session went: the agent's
    answer to the final checkpoint (or why there is none), and the kernel state as a tar
    when the home is a volume on the node."""

    answer: dict[str, Any] | None = None
    why_not: str | None = None
    archive: bytes | None = None
