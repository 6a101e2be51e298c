"""A session's life on its node's runtime: build the spec, start, poll and stop, the
overridable steps of DockerSpawner.

Calls to a node's runtime from a request path are bounded by ``engine_timeout``; an
unreachable node is not called at all. Sessions boot on a node in turns where its runtime
says how many may boot at once (`_boot_slot`): the wait for a turn is not part of the
``launch_timeout`` a server has to answer in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from scheduler_core.model import Allocation
from spawner.runtime.booking import Booking
from spawner.runtime.context import Nodes, SessionTable
from spawner.runtime.interface import OwnedElsewhere
from spawner.runtime.nodewatch import NodeWatch
from spawner.runtime.snapshots import (
    HOME_TARGET,
    SnapshotError,
    SnapshotLayout,
    ensure_home,
    restored_dir_in_home,
    session_home,
    session_owner,
    state_dir_in_home,
)
from spawner.runtime.spec import LaunchSpec, build_launch_spec
from spawner.runtime.values import Agent, LaunchFailed, RunningSession, SessionLaunch


@dataclass(eq=False, kw_only=True)
class Lifecycle:
    """A session's steps on its node's runtime. Calls `Booking` for its port and
    `NodeWatch` for a session that ended (or that cannot be removed now); subclass it to
    change a step (`build_spec`, `create_session`, `stop_session`)."""

    nodes: Nodes
    table: SessionTable
    booking: Booking
    watch: NodeWatch
    layout: SnapshotLayout | None
    """Where homes and snapshots live (None: named volumes, no snapshot store)."""

    # -- a session: build its spec, start, poll, stop ---------------------------------

    def build_spec(self, allocation: Allocation, ask: SessionLaunch, port: int) -> LaunchSpec:
        """The launch spec of a granted session (override to change what runs)."""
        grant = allocation.grants[0]
        config = self.nodes.configs[grant.node]
        server = ask.identity.server
        storage = None
        if ask.storage is not None:
            path = config.storage.get(ask.storage)
            if path is None:
                raise LaunchFailed(
                    grant.node,
                    f"it has no path for storage {ask.storage!r}; tell an administrator",
                    final=True,
                )
            storage = (ask.storage, path)
        return build_launch_spec(
            ask.identity,
            ask.image,
            grant,
            hub_env=ask.hub_env,
            port=port,
            ip=config.address if config.network == "host" else "0.0.0.0",
            nvidia=config.nvidia,
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
        if self.layout is None:
            return None
        runtime = self.nodes.backends.get(node)
        home = session_home(runtime, self.layout, user)  # the account's home on Slurm
        if home is None:
            return None
        try:
            ensure_home(home, session_owner(runtime, user))
        except (OSError, SnapshotError) as error:
            raise LaunchFailed(node, f"its home {home} cannot be made ({error})") from None
        return str(home)

    def _restore_dir(self, ask: SessionLaunch) -> str | None:
        if ask.restore is None or self.layout is None:
            return None
        path = self.layout.kernels_dir(ask.identity.user, ask.identity.server, ask.restore)
        return str(path) if path is not None else None

    async def create_session(self, node: str, spec: LaunchSpec) -> str:
        """Create and start the session on the node's runtime; its ``runtime_id``."""
        return await self.nodes.backends[node].launch(spec)

    async def start_session(self, allocation: Allocation, ask: SessionLaunch) -> RunningSession:
        """Start a granted session and return once its server answers; LaunchFailed
        (the session removed, the port free) if it does not."""
        request_id = allocation.id
        node = allocation.grants[0].node
        config = self.nodes.configs[node]
        port = self.booking.allocate_port(request_id)
        runtime_id = ""
        asked = time.monotonic()
        try:
            spec = self.build_spec(allocation, ask, port)
            async with await self._boot_slot(node):
                turn = time.monotonic()
                runtime_id = await self.create_session(node, spec)
                await self._wait_until_answers(node, runtime_id, config.address, port, ask.base_url)
                answered = time.monotonic()
        except asyncio.CancelledError:
            await self.stop_session(node, runtime_id, request_id)
            self.booking.free_ports(request_id)
            raise
        except Exception as error:
            logs = ""
            if runtime_id:
                try:
                    logs = await asyncio.wait_for(
                        self.nodes.backends[node].logs(runtime_id), self.nodes.timeouts.engine
                    )
                except Exception:
                    logs = ""
                await self.stop_session(node, runtime_id, request_id)
            self.booking.free_ports(request_id)
            self.nodes.log.error(
                "budgethub: %s: launch on %s failed: %s\n%s", request_id, node, error, logs
            )
            if isinstance(error, LaunchFailed):
                raise
            reason = str(error) or type(error).__name__
            raise LaunchFailed(node, reason, final=isinstance(error, OwnedElsewhere)) from None
        self.table.stopping.discard(request_id)
        if request_id in self.nodes.core.running:
            self.table.live.add(request_id)
        if ask.agent_secret:
            self.table.agents[request_id] = Agent(
                user=ask.identity.user,
                server=ask.identity.server,
                secret=ask.agent_secret,
                base_url=ask.base_url,
                address=config.address,
                port=port,
                runtime_id=runtime_id,
                image=ask.image,
            )
        return RunningSession(
            runtime_id, config.address, port, turn_s=turn - asked, boot_s=answered - turn
        )

    async def _boot_slot(self, node: str) -> AbstractAsyncContextManager[Any]:
        """A turn to boot on the node, where its runtime limits how many boot at once
        (Docker: one per CPU, `NodeBackend.boot_slots`); no limit otherwise (Slurm)."""
        slots = getattr(self.nodes.backends[node], "boot_slots", None)
        if slots is None:
            return contextlib.nullcontext()
        gate: AbstractAsyncContextManager[Any] = await slots()
        return gate

    async def _wait_until_answers(
        self, node: str, runtime_id: str, address: str, port: int, base_url: str
    ) -> None:
        """Return as soon as the server answers HTTP; fail if the session ends.

        A bare TCP connect is the cheap probe while the server boots (many spawns
        at once share the Hub's event loop); HTTP is asked only once the port is open.
        """
        url = f"http://{address}:{port}{base_url}api"
        client = AsyncHTTPClient()
        deadline = time.monotonic() + self.nodes.timeouts.launch
        checked = time.monotonic()
        interval = 0.02
        backend = self.nodes.backends[node]
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
                state = await backend.state(runtime_id)
                if state is None or not state.running:
                    code = state.exit_code if state else "gone"
                    raise RuntimeError(f"the session ended ({code}) before its server answered")
            await asyncio.sleep(interval)
            interval = min(interval * 1.2, 0.1)
        raise TimeoutError(f"its server did not answer within {self.nodes.timeouts.launch:g} s")

    async def poll_session(
        self, request_id: str, node: str, runtime_id: str, *, release: bool = True
    ) -> int | None:
        """None while the session runs (or its node cannot be asked now); its exit
        status once it ended, its slices then freed (``release``: not in safe mode, where
        no core holds them)."""
        backend = self.nodes.backends.get(node)
        if backend is None:
            return 0 if release else None
        if release and not self.nodes.node_answers(node):
            return None  # its sessions are kept while the node is away
        try:
            state = await asyncio.wait_for(backend.state(runtime_id), self.nodes.timeouts.engine)
        except Exception as error:  # a runtime that does not answer: the node may be down
            self.nodes.log.warning(
                "budgethub: %s: cannot reach node %s: %s", request_id, node, error
            )
            return None
        if state is not None and state.running:
            return None
        if release:
            self.watch.session_ended(request_id, state)
        return 0 if state is None else state.exit_code

    async def stop_session(self, node: str, runtime_id: str, request_id: str = "") -> None:
        """Remove the session, waiting at most ``engine_timeout`` for its runtime; one
        that cannot be removed now is removed when its node answers again."""
        backend = self.nodes.backends.get(node)
        if backend is None or not runtime_id:
            return
        if request_id:
            self.table.stopping.add(request_id)
        try:
            if self.nodes.attached is not None and not self.nodes.node_answers(node):
                raise TimeoutError("the node does not answer")
            await asyncio.wait_for(backend.remove(runtime_id), self.nodes.timeouts.engine)
        except Exception as error:  # a runtime that is down: the node's problem now
            self.nodes.log.warning(
                "budgethub: could not remove %s on %s (%s); it goes when the node answers",
                runtime_id[:12],
                node,
                error or type(error).__name__,
            )
            self.watch.leave_orphan(node, runtime_id)
