"""Nodes as Docker engines: one door to Docker, health checks, session containers.

Every blocking docker-py call goes through ``call``, which runs it on a thread
pool shared by all engines. The pool is wide (not one thread, as
DockerSpawner's is), so ten stops at once take as long as one. A frozen engine
would hold a thread per call for the client's whole timeout, so health pings
use a client of their own with a short timeout and never overlap, and each
engine's container events are read by one thread of its own (``watch``).

A session is pinned to as many of its engine's CPUs as it was granted (Docker's cpuset,
`CpuPins`), so ``nproc`` and ``os.sched_getaffinity`` inside say its CPUs, not the
node's: thread pools sized from them (BLAS, joblib, data loaders) no longer oversubscribe.
The CFS quota (``nano_cpus``) still bounds its CPU time; the set only says where it runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.tls import TLSConfig

from spawner.runtime.interface import Answer, OwnedElsewhere, SessionState
from spawner.runtime.spec import LABEL_PREFIX, LaunchSpec

# Answer, SessionState and OwnedElsewhere are every runtime's (spawner.runtime.interface); they
# stay importable from here.
__all__ = [
    "Answer",
    "SessionState",
    "CpuPins",
    "EngineConfig",
    "NodeBackend",
    "OwnedElsewhere",
    "call",
    "docker_client",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="budgethub-docker")


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run one blocking Docker call off the event loop: the one door to Docker."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))


@dataclass(frozen=True)
class EngineConfig:
    """How to reach a node's Docker engine and what it offers sessions."""

    node: str
    url: str | None = None
    """``unix:///…`` or ``tcp://host:2376``; None is the local engine (DOCKER_HOST)."""
    tls: Mapping[str, str] = field(default_factory=dict)
    """``ca``, ``cert``, ``key`` file paths for a ``tcp://`` engine."""
    address: str = "127.0.0.1"
    """Where the Hub reaches sessions on this node (host networking)."""
    network: str = "host"
    storage: Mapping[str, str] = field(default_factory=dict)
    """Storage name → path on the node, bind-mounted into data-prep sessions."""
    nvidia: bool = False
    """Real GPUs: hand the NVIDIA runtime the granted device ids."""


def cpus_wanted(nano_cpus: int) -> int:
    """Whole CPUs a session of ``nano_cpus`` is pinned to: 1.0 CPU -> 1, 0.5 -> 1, 2.5 -> 3."""
    return max(1, math.ceil(nano_cpus / 1e9 - 1e-9))


def least_used(want: int, total: int, pinned: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    """The ``want`` CPUs of ``0..total-1`` that fewest sessions are pinned to (lower
    numbers first among equals); all of them when ``want`` is ``total`` or more."""
    if want >= total:
        return tuple(range(total))
    load = [0] * total
    for cpus in pinned:
        for cpu in cpus:
            if 0 <= cpu < total:
                load[cpu] += 1
    return tuple(sorted(sorted(range(total), key=lambda cpu: (load[cpu], cpu))[:want]))


def parse_cpuset(text: str) -> tuple[int, ...]:
    """Docker's ``CpusetCpus`` (``0,2`` or ``0-3,6``) as CPU numbers; () for none."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return ()
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


class CpuPins:
    """Which of an engine's CPUs each session (by container name) is pinned to.

    Each new session gets the CPUs fewest sessions hold, so sessions spread over the
    node; a session granted all the node's CPUs (or more) is not pinned. Kept in memory
    and refilled from the containers' own cpusets when the Hub lists them again
    (`adopt`); called from the Docker threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pins: dict[str, tuple[int, ...]] = {}
        self.total: int | None = None
        """The engine's CPUs (``docker info``'s NCPU), once asked."""

    def claim(self, name: str, nano_cpus: int) -> str:
        """The cpuset for a new session ``name`` ("" when it is not pinned)."""
        assert self.total is not None, "ask the engine's CPUs first"
        want = cpus_wanted(nano_cpus)
        with self._lock:
            self._pins.pop(name, None)
            if want >= self.total:
                return ""
            cpus = least_used(want, self.total, self._pins.values())
            self._pins[name] = cpus
        return ",".join(str(cpu) for cpu in cpus)

    def adopt(self, name: str, cpuset: str) -> None:
        cpus = parse_cpuset(cpuset)
        with self._lock:
            if cpus:
                self._pins[name] = cpus
            else:
                self._pins.pop(name, None)

    def release(self, name: str) -> None:
        with self._lock:
            self._pins.pop(name, None)


class NodeBackend:
    """One node's Docker engine: a `spawner.runtime.interface.Runtime`."""

    def __init__(
        self, config: EngineConfig, timeout: float = 30.0, ping_timeout: float = 5.0
    ) -> None:
        self.config = config
        self._timeout = timeout
        self._ping_timeout = ping_timeout
        self._client: docker.DockerClient | None = None
        self._ping_client: docker.DockerClient | None = None
        self._pinging: asyncio.Future[Any] | None = None
        self._watcher: threading.Thread | None = None
        self.pins = CpuPins()
        self._booting: asyncio.Semaphore | None = None

    @property
    def node(self) -> str:
        return self.config.node

    def _new_client(self, timeout: float) -> docker.DockerClient:
        return docker_client(self.config.url, self.config.tls, timeout)

    def _docker(self) -> docker.DockerClient:
        if self._client is None:
            self._client = self._new_client(int(self._timeout))
        return self._client

    async def ping(self) -> Answer:
        """How the engine answers now: within ``ping_timeout``, or not at all.

        A ping still unanswered from before counts as a timeout (pings never pile up
        threads on a frozen engine)."""
        if self._pinging is not None and not self._pinging.done():
            return Answer.TIMEOUT

        def run() -> Any:
            if self._ping_client is None:
                self._ping_client = self._new_client(self._ping_timeout)
            return self._ping_client.ping()

        self._pinging = asyncio.ensure_future(call(run))
        try:
            await asyncio.wait_for(asyncio.shield(self._pinging), self._ping_timeout + 1)
            return Answer.OK
        except TimeoutError:
            log.warning("node %s: engine did not answer in %g s", self.node, self._ping_timeout)
            return Answer.TIMEOUT
        except (DockerException, OSError) as error:
            self._ping_client = None
            self._client = None
            if _timed_out(error):
                log.warning("node %s: engine did not answer in time: %s", self.node, error)
                return Answer.TIMEOUT
            log.warning("node %s: engine does not answer: %s", self.node, error)
            return Answer.REFUSED

    def watch(self, hub: str, on_exit: Callable[[SessionState], None]) -> None:
        """Call ``on_exit`` (from a thread of this engine's own) each time a container of
        this Hub's ends: exited, killed, out of memory. Reconnects while the engine is
        away, for as long as the Hub runs."""
        if self._watcher is not None:
            return
        self._watcher = threading.Thread(
            target=self._watch,
            args=(hub, on_exit),
            name=f"budgethub-events-{self.node}",
            daemon=True,
        )
        self._watcher.start()

    def _watch(self, hub: str, on_exit: Callable[[SessionState], None]) -> None:
        filters = {"type": "container", "event": "die", "label": f"{LABEL_PREFIX}.hub={hub}"}
        backoff = 0.5
        while True:
            client = None
            try:
                client = self._new_client(self._timeout)
                # docker-py reads the stream with no timeout: it is quiet while nothing ends.
                events = client.events(decode=True, filters=filters)
                backoff = 0.5
                for event in events:
                    attributes = event.get("Actor", {}).get("Attributes", {})
                    labels = {k: v for k, v in attributes.items() if k.startswith(LABEL_PREFIX)}
                    code = str(attributes.get("exitCode", "0"))
                    exit_code = int(code) if code.lstrip("-").isdigit() else -1
                    on_exit(SessionState(str(event.get("id", "")), False, exit_code, labels))
            except Exception as error:  # the engine went away: try again shortly
                log.debug("node %s: event stream ended: %s", self.node, error)
            finally:
                if client is not None:
                    client.close()
            time.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    def _cpu_count(self) -> int:
        """The engine's CPUs (``docker info``'s NCPU), asked once."""
        if self.pins.total is None:
            self.pins.total = max(1, int(self._docker().info().get("NCPU") or 1))
        return self.pins.total

    async def boot_slots(self) -> asyncio.Semaphore:
        """How many of this node's sessions boot at once (create, start, until the server
        answers): one per CPU of the engine; the others wait their turn, first come first.

        A session's server spends its start on the CPU (imports): ten started at once on
        two CPUs share them and all answer near the end (issue 50: median 12.8 s, against
        DockerSpawner's 8.3 s, whose one Docker thread staggers its starts); in turn, each
        answers as soon as its own start is done and the median halves. A node's own
        CPUs, not its declared ones: what its sessions' starts actually share."""
        if self._booting is None:
            total = await call(self._cpu_count)
            if self._booting is None:
                self._booting = asyncio.Semaphore(total)
        return self._booting

    async def launch(self, spec: LaunchSpec) -> str:
        """Create and start the session's container, replacing one of its name that this
        Hub left behind; OwnedElsewhere if another Hub's container has the name."""
        hub_label = f"{LABEL_PREFIX}.hub"
        ours = spec.labels.get(hub_label)

        def run() -> str:
            client = self._docker()
            try:
                old = client.containers.get(spec.name)
            except NotFound:
                pass
            else:
                owner = old.labels.get(hub_label)
                if owner != ours:
                    raise OwnedElsewhere(
                        f"container {spec.name} on node {self.node} belongs to "
                        f"{'Hub ' + repr(owner) if owner else 'no budgethub Hub'}"
                    )
                old.remove(force=True)
            kwargs = spec.create_kwargs()
            self._cpu_count()
            cpuset = self.pins.claim(spec.name, spec.nano_cpus)
            if cpuset:
                kwargs["cpuset_cpus"] = cpuset
            try:
                container = client.containers.create(**kwargs)
            except BaseException:
                self.pins.release(spec.name)
                raise
            try:
                container.start()
            except APIError:
                container.remove(force=True)
                self.pins.release(spec.name)
                raise
            return str(container.id)

        return await call(run)

    async def state(self, container_id: str) -> SessionState | None:
        """The container's state, or None when it is gone."""

        def run() -> SessionState | None:
            try:
                container = self._docker().containers.get(container_id)
            except NotFound:
                return None
            status = container.attrs.get("State", {})
            return SessionState(
                str(container.id),
                bool(status.get("Running")),
                int(status.get("ExitCode", 0)),
                dict(container.labels),
                bool(status.get("OOMKilled")),
            )

        return await call(run)

    async def remove(self, container_id: str, grace: float = 5.0) -> None:
        """Stop (SIGTERM, then SIGKILL after ``grace``) and remove the container."""

        def run() -> None:
            try:
                container = self._docker().containers.get(container_id)
            except NotFound:
                return
            try:
                container.stop(timeout=int(grace))
            except APIError as error:
                log.debug("node %s: stop %s: %s", self.node, container_id[:12], error)
            try:
                container.remove(force=True)
            except NotFound:
                pass
            self.pins.release(container.name)

        await call(run)

    async def sessions(self, hub: str) -> list[SessionState]:
        """Session containers this Hub started on the node, running or not."""

        def run() -> list[SessionState]:
            found = self._docker().containers.list(
                all=True, filters={"label": f"{LABEL_PREFIX}.hub={hub}"}
            )
            for c in found:  # the CPUs a session of a Hub before this one was pinned to
                if c.status == "running":
                    self.pins.adopt(c.name, c.attrs.get("HostConfig", {}).get("CpusetCpus", ""))
            return [
                SessionState(
                    str(c.id),
                    c.status == "running",
                    int(c.attrs.get("State", {}).get("ExitCode", 0)),
                    dict(c.labels),
                )
                for c in found
            ]

        return await call(run)

    async def archive(self, container_id: str, path: str) -> bytes | None:
        """A tar of ``path`` in the container (Docker's archive API), or None when the
        path (or the container) is not there."""

        def run() -> bytes | None:
            try:
                stream, _stat = self._docker().containers.get(container_id).get_archive(path)
            except NotFound:
                return None
            return b"".join(stream)

        return await call(run)

    async def logs(self, container_id: str, tail: int = 20) -> str:
        def run() -> str:
            try:
                raw = self._docker().containers.get(container_id).logs(tail=tail)
            except NotFound:
                return ""
            return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)

        return await call(run)


def docker_client(
    url: str | None, tls: Mapping[str, str] | None = None, timeout: float = 30.0
) -> docker.DockerClient:
    """A docker-py client for an engine: ``url`` None is the local one (DOCKER_HOST);
    ``tls`` names the ``ca``, ``cert`` and ``key`` files of a ``tcp://`` engine.

    A TLS client ignores the environment's CA bundle and proxies: requests lets
    REQUESTS_CA_BUNDLE (or CURL_CA_BUNDLE) replace a session's own CA (psf/requests#3829),
    so the node's CA would not verify it, and an engine is not reached through an HTTP
    proxy."""
    if not url:
        return docker.from_env(timeout=timeout)
    config: TLSConfig | bool = False
    if tls:
        cert = tls.get("cert"), tls.get("key")
        config = TLSConfig(
            client_cert=cert if all(cert) else None,
            ca_cert=tls.get("ca"),
            verify=bool(tls.get("ca")),
        )
    if tls:
        return _TlsDockerClient(base_url=url, tls=config, timeout=timeout)
    return docker.DockerClient(base_url=url, tls=config, timeout=timeout)


class _EnvFreeAPIClient(docker.APIClient):  # type: ignore[misc]
    """An API client that never reads CA bundles or proxies from the environment (it
    asks the engine's version in its constructor, so this cannot be set afterwards)."""

    @property
    def trust_env(self) -> bool:
        return False

    @trust_env.setter
    def trust_env(self, value: bool) -> None:
        pass  # requests.Session.__init__ sets it


class _TlsDockerClient(docker.DockerClient):  # type: ignore[misc]
    def __init__(self, **kwargs: Any) -> None:
        self.api = _EnvFreeAPIClient(**kwargs)


def _timed_out(error: BaseException) -> bool:
    """Did this failure come from a read or connect timeout (somewhere in its chain)?"""
    seen: BaseException | None = error
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, TimeoutError) or "timed out" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False
