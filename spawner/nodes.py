"""Nodes as Docker engines: one door to Docker, health checks, session containers.

Every blocking docker-py call goes through ``DockerDoor.call``, which runs it
on a thread pool shared by all engines. The pool is wide (not one thread, as
DockerSpawner's is), so ten stops at once take as long as one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.tls import TLSConfig

from spawner.containers import LABEL_PREFIX, ContainerSpec

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


@dataclass(frozen=True, slots=True)
class ContainerState:
    id: str
    running: bool
    exit_code: int
    labels: Mapping[str, str]


class NodeBackend:
    """One node's Docker engine."""

    def __init__(self, config: EngineConfig, timeout: float = 30.0) -> None:
        self.config = config
        self._timeout = timeout
        self._client: docker.DockerClient | None = None

    @property
    def node(self) -> str:
        return self.config.node

    def _docker(self) -> docker.DockerClient:
        if self._client is None:
            tls: TLSConfig | bool = False
            if self.config.tls:
                cert = self.config.tls.get("cert"), self.config.tls.get("key")
                tls = TLSConfig(
                    client_cert=cert if all(cert) else None,
                    ca_cert=self.config.tls.get("ca"),
                    verify=bool(self.config.tls.get("ca")),
                )
            if self.config.url:
                self._client = docker.DockerClient(
                    base_url=self.config.url, tls=tls, timeout=int(self._timeout)
                )
            else:
                self._client = docker.from_env(timeout=int(self._timeout))
        return self._client

    async def ping(self) -> bool:
        """Does the engine answer?"""
        try:
            return bool(await call(lambda: self._docker().ping()))
        except (DockerException, OSError) as error:
            log.warning("node %s: engine does not answer: %s", self.node, error)
            self._client = None
            return False

    async def launch(self, spec: ContainerSpec) -> str:
        """Create and start the session's container (replacing a stopped one of its name)."""

        def run() -> str:
            client = self._docker()
            try:
                old = client.containers.get(spec.name)
            except NotFound:
                pass
            else:
                old.remove(force=True)
            container = client.containers.create(**spec.create_kwargs())
            try:
                container.start()
            except APIError:
                container.remove(force=True)
                raise
            return str(container.id)

        return await call(run)

    async def state(self, container_id: str) -> ContainerState | None:
        """The container's state, or None when it is gone."""

        def run() -> ContainerState | None:
            try:
                container = self._docker().containers.get(container_id)
            except NotFound:
                return None
            status = container.attrs.get("State", {})
            return ContainerState(
                str(container.id),
                bool(status.get("Running")),
                int(status.get("ExitCode", 0)),
                dict(container.labels),
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

        await call(run)

    async def sessions(self, hub: str) -> list[ContainerState]:
        """Session containers this Hub started on the node, running or not."""

        def run() -> list[ContainerState]:
            found = self._docker().containers.list(
                all=True, filters={"label": f"{LABEL_PREFIX}.hub={hub}"}
            )
            return [
                ContainerState(
                    str(c.id),
                    c.status == "running",
                    int(c.attrs.get("State", {}).get("ExitCode", 0)),
                    dict(c.labels),
                )
                for c in found
            ]

        return await call(run)

    async def logs(self, container_id: str, tail: int = 20) -> str:
        def run() -> str:
            try:
                raw = self._docker().containers.get(container_id).logs(tail=tail)
            except NotFound:
                return ""
            return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)

        return await call(run)
