"""A session's container and its agent: create (build the spec), start, poll and stop,
the overridable steps of DockerSpawner; and the idle polls of the session's agent.

Calls to a node's runtime from a request path are bounded by ``engine_timeout``; an
unreachable node is not called at all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from scheduler_core.model import Allocation
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import Store
from spawner.runtime.interface import ContainerState, NodeConfig, OwnedElsewhere, Runtime
from spawner.runtime.snapshots import (
    HOME_TARGET,
    Layout,
    SnapshotError,
    ensure_home,
    restored_dir_in_home,
    state_dir_in_home,
)
from spawner.runtime.spec import ContainerSpec, SessionIdentity, build_container

if TYPE_CHECKING:
    from spawner.runtime.takedown import Teardown

AGENT_HEADER = "X-Budgethub-Agent"


def _epoch(value: Any, default: float) -> float:
    """Seconds since the epoch from an ISO 8601 time (``default`` if it is none)."""
    if not isinstance(value, str):
        return default
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


class LaunchFailed(RuntimeError):
    """A granted session's container did not start (or never answered)."""

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
    container_id: str
    address: str
    port: int


@dataclass
class Agent:
    """How the spawner reaches one session's agent (its server's port, directly)."""

    user: str
    server: str
    secret: str
    base_url: str
    address: str = ""
    port: int = 0
    container_id: str = ""
    image: str = ""

    def url(self, route: str) -> str:
        return f"http://{self.address}:{self.port}{self.base_url}budgethub-agent/{route}"

    @classmethod
    def from_state(cls, state: Any) -> Agent | None:
        """From a spawner's saved state; None for anything that does not fit."""
        if not isinstance(state, dict):
            return None
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
    ping: float = 5.0
    launch: float = 120.0
    node_down_grace: float = 120.0


class Lifecycle:
    """A session's container: a mixin of `SessionActuator`, which gives it what is
    declared below."""

    log: logging.Logger | logging.LoggerAdapter[Any]
    engines: dict[str, NodeConfig]
    backends: dict[str, Runtime]
    layout: Layout | None
    timeouts: Timeouts
    core: Scheduler | None
    agents: dict[str, Agent]
    live: set[str]
    _stopping: set[str]
    _orphans: dict[str, set[str]]

    if TYPE_CHECKING:

        @property
        def _core(self) -> Scheduler: ...

        def node_answers(self, node: str) -> bool: ...

        def allocate_port(self, request_id: str) -> int: ...

        def _free_ports(self, request_id: str) -> None: ...

        def container_ended(
            self, request_id: str, state: ContainerState | None, *, through_hub: bool = False
        ) -> None: ...

    # -- a session's container: create, start, poll, stop -----------------------------

    def create_container(
        self, allocation: Allocation, ask: SessionLaunch, port: int
    ) -> ContainerSpec:
        """The container spec of a granted session (override to change what runs)."""
        grant = allocation.grants[0]
        engine = self.engines[grant.node]
        server = ask.identity.server
        storage = None
        if ask.storage is not None:
            path = engine.storage.get(ask.storage)
            if path is None:
                raise LaunchFailed(
                    grant.node,
                    f"it has no path for storage {ask.storage!r}; tell an administrator",
                    final=True,
                )
            storage = (ask.storage, path)
        return build_container(
            ask.identity,
            ask.image,
            grant,
            hub_env=ask.hub_env,
            port=port,
            ip=engine.address if engine.network == "host" else "0.0.0.0",
            nvidia=engine.nvidia,
            storage=storage,
            extra_env={
                "BUDGETHUB_FUNDED": "1" if allocation.funded else "0",
                "BUDGETHUB_PROTECTED_UNTIL": str(allocation.protected_until),
                "BUDGETHUB_AGENT_SECRET": ask.agent_secret,
                "BUDGETHUB_STATE_DIR": f"{HOME_TARGET}/{state_dir_in_home(server)}",
                "BUDGETHUB_RESTORED_DIR": f"{HOME_TARGET}/{restored_dir_in_home(server)}",
            },
            pids_limit=ask.pids_limit,
            home=self._home(ask.identity.user, grant.node),
            restore_dir=self._restore_dir(ask),
        )

    def _home(self, user: str, node: str) -> str | None:
        """The user's home on shared storage, made if new (None: the named volume)."""
        home = self.layout.home(user) if self.layout is not None else None
        if home is None:
            return None
        try:
            ensure_home(home)
        except (OSError, SnapshotError) as error:
            raise LaunchFailed(node, f"its home {home} cannot be made ({error})") from None
        return str(home)

    def _restore_dir(self, ask: SessionLaunch) -> str | None:
        if ask.restore is None or self.layout is None:
            return None
        path = self.layout.kernels_dir(ask.identity.user, ask.identity.server, ask.restore)
        return str(path) if path is not None else None

    async def start_container(self, node: str, spec: ContainerSpec) -> str:
        """Create and start the container on the node's engine; its id."""
        return await self.backends[node].launch(spec)

    async def start_session(self, allocation: Allocation, ask: SessionLaunch) -> RunningSession:
        """Start a granted session and return once its server answers; LaunchFailed
        (the container removed, the port free) if it does not."""
        request_id = allocation.id
        node = allocation.grants[0].node
        engine = self.engines[node]
        port = self.allocate_port(request_id)
        container_id = ""
        try:
            spec = self.create_container(allocation, ask, port)
            container_id = await self.start_container(node, spec)
            await self._wait_until_answers(node, container_id, engine.address, port, ask.base_url)
        except asyncio.CancelledError:
            await self.stop_container(node, container_id, request_id)
            self._free_ports(request_id)
            raise
        except Exception as error:
            logs = ""
            if container_id:
                try:
                    logs = await asyncio.wait_for(
                        self.backends[node].logs(container_id), self.timeouts.engine
                    )
                except Exception:
                    logs = ""
                await self.stop_container(node, container_id, request_id)
            self._free_ports(request_id)
            self.log.error(
                "budgethub: %s: launch on %s failed: %s\n%s", request_id, node, error, logs
            )
            if isinstance(error, LaunchFailed):
                raise
            reason = str(error) or type(error).__name__
            raise LaunchFailed(node, reason, final=isinstance(error, OwnedElsewhere)) from None
        self._stopping.discard(request_id)
        if request_id in self._core.running:
            self.live.add(request_id)
        if ask.agent_secret:
            self.agents[request_id] = Agent(
                user=ask.identity.user,
                server=ask.identity.server,
                secret=ask.agent_secret,
                base_url=ask.base_url,
                address=engine.address,
                port=port,
                container_id=container_id,
                image=ask.image,
            )
        return RunningSession(container_id, engine.address, port)

    async def _wait_until_answers(
        self, node: str, container_id: str, address: str, port: int, base_url: str
    ) -> None:
        """Return as soon as the server answers HTTP; fail if the container exits.

        A bare TCP connect is the cheap probe while the server boots (many spawns
        at once share the Hub's event loop); HTTP is asked only once the port is open.
        """
        url = f"http://{address}:{port}{base_url}api"
        client = AsyncHTTPClient()
        deadline = time.monotonic() + self.timeouts.launch
        checked = time.monotonic()
        interval = 0.02
        backend = self.backends[node]
        while time.monotonic() < deadline:
            try:
                _reader, writer = await asyncio.open_connection(address, port)
            except OSError:
                pass
            else:
                writer.close()
                try:
                    await client.fetch(HTTPRequest(url, connect_timeout=2, request_timeout=5))
                    return
                except HTTPClientError:
                    return  # it answered, with an error status: it is up
                except OSError:
                    pass
            if time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                state = await backend.state(container_id)
                if state is None or not state.running:
                    code = state.exit_code if state else "gone"
                    raise RuntimeError(f"the container exited ({code}) before its server answered")
            await asyncio.sleep(interval)
            interval = min(interval * 1.2, 0.1)
        raise TimeoutError(f"its server did not answer within {self.timeouts.launch:g} s")

    async def poll_session(
        self, request_id: str, node: str, container_id: str, *, release: bool = True
    ) -> int | None:
        """None while the container runs (or its node cannot be asked now); its exit
        status once it ended, its slices then freed (``release``: not in safe mode, where
        no core holds them)."""
        backend = self.backends.get(node)
        if backend is None:
            return 0 if release else None
        if release and not self.node_answers(node):
            return None  # its sessions are kept while the node is away
        try:
            state = await asyncio.wait_for(backend.state(container_id), self.timeouts.engine)
        except Exception as error:  # an engine that does not answer: the node may be down
            self.log.warning("budgethub: %s: cannot reach node %s: %s", request_id, node, error)
            return None
        if state is not None and state.running:
            return None
        if release:
            self.container_ended(request_id, state)
        return 0 if state is None else state.exit_code

    async def stop_container(self, node: str, container_id: str, request_id: str = "") -> None:
        """Remove the container, waiting at most ``engine_timeout`` for its engine; one
        that cannot be removed now is removed when its node answers again."""
        backend = self.backends.get(node)
        if backend is None or not container_id:
            return
        if request_id:
            self._stopping.add(request_id)
        try:
            if self.core is not None and not self.node_answers(node):
                raise TimeoutError("the node does not answer")
            await asyncio.wait_for(backend.remove(container_id), self.timeouts.engine)
        except Exception as error:  # an engine that is down: the node's problem now
            self.log.warning(
                "budgethub: could not remove %s on %s (%s); it goes when the node answers",
                container_id[:12],
                node,
                error or type(error).__name__,
            )
            self._orphans.setdefault(node, set()).add(container_id)


class IdlePolls:
    """What each session's agent says (busy, or idle since when): a mixin of
    `SessionActuator`, which gives it what is declared below."""

    log: logging.Logger | logging.LoggerAdapter[Any]
    store: Store
    agents: dict[str, Agent]
    activity: dict[str, Activity]
    teardowns: dict[str, Teardown]
    live: set[str]

    if TYPE_CHECKING:

        @property
        def _core(self) -> Scheduler: ...

    # -- idle sessions ---------------------------------------------------------------

    async def poll_activity(self) -> None:
        """Ask each running session's agent whether it is busy; tell the core which are
        idle and since when (idle sessions are the first victims)."""
        core = self._core
        asks = [
            (request_id, agent)
            for request_id, agent in list(self.agents.items())
            if request_id in self.live and agent.port and request_id not in self.teardowns
        ]
        answers = await asyncio.gather(*(self._status(agent) for _, agent in asks))
        now = time.time()
        for (request_id, _agent), status in zip(asks, answers, strict=True):
            if status is None or request_id not in core.running:
                continue
            busy = bool(status.get("busy"))
            idle_since = None if busy else _epoch(status.get("last_activity"), now)
            before = self.activity.get(request_id)
            kernels = list(status.get("kernels") or [])
            self.activity[request_id] = Activity(now, busy, idle_since, kernels)
            if before is None or before.busy != busy:
                self.store.append_event(
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
            self.log.debug("budgethub: agent at %s: %s", agent.url("status"), error)
            return None
        return answer if isinstance(answer, dict) else None
