"""The actuator: the only holder of the nodes' engines. It books and releases slices,
starts, polls and stops session containers, preempts, and follows the engines' health
and container events.

The core calls `launch` and `preempt` inside a cycle (the core's Actuator
protocol); spawners call `start_session`, `poll_session` and `stop_session`
through the facade (embedded.py). The container's life is split in overridable
steps, as in DockerSpawner: `create_container` (build the spec), `start_container`
(create and start it on the engine), `stop_container` (remove it, bounded).
Calls to an engine from a request path are bounded by ``engine_timeout``; an
unreachable node is not called at all.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from scheduler_core.model import Allocation, Health, Node
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import RequestState, SliceConflict, Store, StoreError
from spawner.containers import LABEL_PREFIX, ContainerSpec, SessionIdentity, build_container
from spawner.hubapi import HubClient, split_request_id
from spawner.nodes import Answer, ContainerState, EngineConfig, NodeBackend, OwnedElsewhere


def describe_exit(state: ContainerState | None) -> str:
    """How a container ended, in words for its user."""
    if state is None:
        return "was gone"
    if state.oom_killed:
        return f"ran out of memory and was killed (exit code {state.exit_code})"
    if state.exit_code == 0:
        return "exited (its server was shut down)"
    if state.exit_code == 137:
        return "was killed (exit code 137)"
    return f"exited with code {state.exit_code}"


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


@dataclass(frozen=True)
class RunningSession:
    container_id: str
    address: str
    port: int


@dataclass(frozen=True)
class Timeouts:
    engine: float = 10.0
    ping: float = 5.0
    launch: float = 120.0
    node_down_grace: float = 120.0


class SessionActuator:
    """Sessions as Docker containers on the nodes' engines."""

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
    ) -> None:
        self.log = log
        self.engines = dict(engines)
        self.backends = {
            name: NodeBackend(engine, ping_timeout=timeouts.ping)
            for name, engine in engines.items()
        }
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

    def watch(self) -> None:
        """Follow every engine's container events (see `NodeBackend.watch`)."""
        self._loop = asyncio.get_running_loop()
        for backend in self.backends.values():
            backend.watch(self.hub_name, self._exited_from_thread)

    def node_answers(self, node: str) -> bool:
        """False while the node is unreachable or down: calls to its engine would hang."""
        nodes = self.core.nodes if self.core is not None else {}
        health = nodes[node].health if node in nodes else Health.DOWN
        return health not in (Health.UNREACHABLE, Health.DOWN)

    # -- ports ---------------------------------------------------------------------

    def allocate_port(self, request_id: str) -> int:
        """A free port for a session, never one another session holds."""
        low, high = self.port_range
        for _ in range(high - low + 1):
            port = secrets.randbelow(high - low + 1) + low
            if port in self.ports:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            self.ports[port] = request_id
            return int(port)
        raise RuntimeError(f"no free port in {low}-{high}")

    def hold_port(self, port: int, request_id: str) -> None:
        self.ports[port] = request_id

    def _free_ports(self, request_id: str) -> None:
        for port in [p for p, holder in self.ports.items() if holder == request_id]:
            del self.ports[port]

    # -- booking and release (the core's Actuator protocol, and the ends of sessions) ----

    def launch(self, allocation: Allocation) -> None:
        """Book the admission's slices in the store, then hand the grant on."""
        try:
            self.store.book(allocation)
        except (SliceConflict, StoreError) as error:
            # Another scheduler writing to the same store got there first.
            self.log.warning("budgethub: cannot book %s: %s", allocation.id, error)
            asyncio.get_running_loop().call_soon(self._book_failed, allocation.id)
            return
        self.log.info(
            "budgethub: granted %s on %s, %.1f ms after its submission (%s)",
            allocation.id,
            ",".join(allocation.node_names),
            (time.time() - allocation.request.submit) * 1e3,
            "funded" if allocation.funded else "unallocated",
        )
        self._granted(allocation)

    def _book_failed(self, request_id: str) -> None:
        if request_id in self._core.running:
            self._core.launch_failed(request_id)
        self._changed()

    def release(
        self,
        request_id: str,
        state: RequestState = RequestState.FINISHED,
        reason: str | None = None,
    ) -> None:
        """The session ended: stop charging, free its slices (in the core and the store)
        and its port."""
        self.live.discard(request_id)
        self._stopping.discard(request_id)
        self._free_ports(request_id)
        if request_id in self._core.running:
            self._core.finish(request_id)
            try:
                self.store.release(request_id, time.time(), state=state, reason=reason)
            except StoreError as error:
                self.log.warning("budgethub: releasing %s: %s", request_id, error)

    def requeue(self, request_id: str, reason: str) -> None:
        """The container did not start: slices back, the request waits at its old place."""
        self._free_ports(request_id)
        self.live.discard(request_id)
        if request_id in self._core.running:
            self.store.release(request_id, time.time(), state=RequestState.REQUEUED, reason=reason)
            self._core.launch_failed(request_id)

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        """Stop a victim through the Hub and tell its user; resumable work waits again
        at its old place (True), and is spawned again through the Hub."""
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
        self.store.release(allocation.id, now, state=state, reason=message)
        self.store.append_event(
            now, "preempt", {"request": allocation.id, "reason": reason, "message": message}
        )
        self.notices[split_request_id(allocation.id)] = message
        self.live.discard(allocation.id)
        self._free_ports(allocation.id)
        self._preempted(allocation.id)
        self.background(self._stop_through_hub(allocation, requeue))
        return requeue

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

    # -- a session's container: create, start, poll, stop -----------------------------

    def create_container(
        self, allocation: Allocation, ask: SessionLaunch, port: int
    ) -> ContainerSpec:
        """The container spec of a granted session (override to change what runs)."""
        grant = allocation.grants[0]
        engine = self.engines[grant.node]
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
            },
            pids_limit=ask.pids_limit,
        )

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

    # -- containers that end by themselves ------------------------------------------------

    def _exited_from_thread(self, state: ContainerState) -> None:
        """An engine's event thread saw one of this Hub's containers end."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._exited, state)

    def _exited(self, state: ContainerState) -> None:
        request_id = state.labels.get(f"{LABEL_PREFIX}.request", "")
        if request_id in self.live and request_id not in self._stopping:
            self.background(self._inspect_exit(request_id, state))

    async def _inspect_exit(self, request_id: str, event: ContainerState) -> None:
        """The event says that it ended; the container says how (out of memory?)."""
        state = event
        allocation = self._core.running.get(request_id)
        if allocation is not None:
            backend = self.backends[allocation.grants[0].node]
            try:
                seen = await asyncio.wait_for(backend.state(event.id), self.timeouts.engine)
                state = seen if seen is not None else event
            except Exception as error:
                self.log.info("budgethub: %s: inspecting its container: %s", request_id, error)
        self.container_ended(request_id, state, through_hub=True)

    def container_ended(
        self, request_id: str, state: ContainerState | None, *, through_hub: bool = False
    ) -> None:
        """A session's container ended by itself (shut down from inside, killed, out of
        memory, gone): its slices are free at once, its user is told, the container is
        removed and, ``through_hub``, the Hub is told its server stopped."""
        if request_id not in self.live or request_id in self._stopping:
            return
        allocation = self._core.running.get(request_id)
        self.live.discard(request_id)
        if allocation is None:
            return
        why = describe_exit(state)
        now = time.time()
        self.log.warning("budgethub: %s ended by itself: %s", request_id, why)
        self.release(request_id, reason=f"its container ended: {why}")
        self._changed()
        message = (
            f"Your session ended at {time.strftime('%H:%M', time.localtime(now))}: "
            f"its container {why}."
        )
        notify = state is None or state.exit_code != 0  # a clean shutdown needs no notice
        self.store.append_event(
            now,
            "exit",
            {"request": request_id, "reason": why, "message": message, "notify": notify},
        )
        if notify:
            self.notices[split_request_id(request_id)] = message
        node = allocation.grants[0].node
        self.background(self._after_exit(request_id, node, state, through_hub))

    async def _after_exit(
        self, request_id: str, node: str, state: ContainerState | None, through_hub: bool
    ) -> None:
        backend = self.backends[node]
        if state is not None and state.id:
            try:
                logs = await asyncio.wait_for(backend.logs(state.id), self.timeouts.engine)
                self.log.info("budgethub: %s: last lines of its container:\n%s", request_id, logs)
                await asyncio.wait_for(backend.remove(state.id), self.timeouts.engine)
            except Exception as error:
                self.log.warning("budgethub: %s: cleaning up its container: %s", request_id, error)
        if through_hub:
            try:
                await self.hub.stop_server(request_id)
            except (HTTPClientError, OSError) as error:
                self.log.info("budgethub: the Hub did not take %s's stop: %s", request_id, error)

    # -- health ------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Ping every engine (docs/architecture.md, "Nodes and health").

        An engine that refuses connections is down: its containers went with it. One
        that does not answer in time is unreachable: nothing new lands there, its
        sessions are kept, and only after ``node_down_grace`` is it down. A node that
        answers again first loses the containers stopped while it was away."""
        core = self._core
        results = await asyncio.gather(*(b.ping() for b in self.backends.values()))
        now = time.time()
        for (name, backend), answer in zip(self.backends.items(), results, strict=True):
            current = core.nodes[name].health
            if answer is Answer.OK:
                self._unreachable_since.pop(name, None)
                if not await self._remove_orphans(name, backend):
                    continue  # it answers pings but not yet the rest: ask again next time
                wanted = self.configured[name]
            elif answer is Answer.REFUSED:
                wanted = Health.DOWN
            else:
                since = self._unreachable_since.setdefault(name, now)
                late = now - since >= self.timeouts.node_down_grace
                wanted = Health.DOWN if late or current is Health.DOWN else Health.UNREACHABLE
            if current is wanted:
                continue
            self.log.warning("budgethub: node %s is now %s", name, wanted.value)
            core.set_health(name, wanted)
            if wanted is not Health.UNREACHABLE:  # the store keeps ready, draining, down
                self.store.set_node_health(name, wanted)
            self.store.append_event(now, "node", {"node": name, "state": wanted.value})
            if answer is Answer.OK and current is not Health.READY:
                self.background(self._sweep(name, backend))
            self._changed()

    def mark_unreachable(self, node: str, since: float) -> None:
        self._unreachable_since[node] = since

    async def _remove_orphans(self, node: str, backend: NodeBackend) -> bool:
        """Remove the containers stopped while the node was away; True when none is left."""
        for container_id in list(self._orphans.get(node, ())):
            try:
                await asyncio.wait_for(backend.remove(container_id), self.timeouts.engine)
            except Exception as error:
                self.log.warning("budgethub: node %s: removing %s: %s", node, container_id, error)
                return False
            self._orphans[node].discard(container_id)
            self.log.info("budgethub: node %s: removed %s, stopped while away", node, container_id)
        return True

    async def _sweep(self, node: str, backend: NodeBackend) -> None:
        """After an absence: sessions of the node whose container ended meanwhile end now."""
        try:
            containers = await backend.sessions(self.hub_name)
        except Exception as error:
            self.log.warning("budgethub: node %s: listing sessions: %s", node, error)
            return
        running = {c.labels.get(f"{LABEL_PREFIX}.request", "") for c in containers if c.running}
        for request_id in list(self.live):
            allocation = self._core.running.get(request_id)
            if allocation is not None and node in allocation.node_names:
                if request_id not in running:
                    self.container_ended(request_id, None, through_hub=True)
