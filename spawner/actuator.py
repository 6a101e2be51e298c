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

A preempted session is snapshotted (docs/snapshots.md): its agent checkpoints the
kernels within ``snapshot_grace``, the container goes, the slices are freed, then the
kernel state is copied into the snapshot store and recorded. The preemptor's slices
are booked only once the victim's container is gone (`launch` waits for it), so two
sessions never share a GPU, as a Kubernetes preemptor waits for its victims to end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from scheduler_core.model import Allocation, Health, Node
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import RequestState, SliceConflict, Store, StoreError
from spawner.containers import LABEL_PREFIX, ContainerSpec, SessionIdentity, build_container
from spawner.hubapi import HubClient, split_request_id
from spawner.nodes import Answer, ContainerState, EngineConfig, NodeBackend, OwnedElsewhere
from spawner.snapshots import (
    HOME_TARGET,
    Layout,
    SnapshotError,
    capture,
    ensure_home,
    new_key,
    remove,
    restored_dir_in_home,
    state_dir_in_home,
    tree_bytes,
    write_report,
)

AGENT_HEADER = "X-Budgethub-Agent"


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


def _epoch(value: Any, default: float) -> float:
    """Seconds since the epoch from an ISO 8601 time (``default`` if it is none)."""
    if not isinstance(value, str):
        return default
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def _kernel_entries(
    checkpoint: Mapping[str, Any] | None, manifests: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per notebook: the variables the snapshot holds (its manifest), what could not be
    saved and why, and how its kernel answered the final checkpoint."""
    by_notebook: dict[str, dict[str, Any]] = {}
    for manifest in manifests:
        notebook = str(manifest.get("notebook") or manifest.get("key"))
        variables = manifest.get("variables") or {}
        unsaved = manifest.get("unsaved") or {}
        by_notebook[notebook] = {
            "notebook": notebook,
            "key": manifest.get("key"),
            "variables": sorted(str(v) for v in variables),
            "unsaved": {str(k): str(v) for k, v in dict(unsaved).items()},
            "state": "not running" if checkpoint is not None else "not asked",
            "error": None,
            "bytes": sum(
                int(v.get("bytes", 0)) for v in dict(variables).values() if isinstance(v, dict)
            ),
        }
    for kernel in (checkpoint or {}).get("kernels") or []:
        if not isinstance(kernel, dict):
            continue
        notebook = str(kernel.get("notebook") or kernel.get("kernel_id"))
        entry = by_notebook.setdefault(
            notebook,
            {
                "notebook": notebook,
                "key": None,
                "variables": sorted(str(v) for v in kernel.get("saved") or []),
                "unsaved": {},
                "bytes": int(kernel.get("bytes") or 0),
            },
        )
        entry["state"] = str(kernel.get("state") or "failed")
        entry["error"] = kernel.get("error")
        entry["kernel_id"] = kernel.get("kernel_id")
        for name, why in dict(kernel.get("unsaved") or {}).items():
            entry["unsaved"].setdefault(str(name), str(why))
    return [by_notebook[n] for n in sorted(by_notebook)]


def snapshot_sentence(report: Mapping[str, Any], most: int = 8) -> str:
    """What a snapshot keeps and what it does not, in words for the user (plain text)."""
    kernels = list(report.get("kernels") or [])
    variables = sum(len(k.get("variables") or []) for k in kernels)
    notebooks = sum(1 for k in kernels if k.get("variables"))
    where = (
        "your files and installed packages stay in your home"
        if report.get("files") == "kept in the home"
        else f"your files and installed packages stay in your home ({report.get('files')})"
    )
    state = report.get("kernel_state")
    parts = [f"A snapshot was taken ({report.get('key')}): {where}"]
    if variables:
        parts[0] += (
            f", and {variables} variable{'s' if variables != 1 else ''} of {notebooks} "
            f"notebook{'s' if notebooks != 1 else ''} come back when you start it again "
            '(tick "Start fresh" to ignore the snapshot)'
        )
    parts[0] += "."
    if state == "not saved":
        parts.append(f"The kernel state was not saved at the preemption: {report.get('why')}.")
    elif state == "partial":
        parts.append(
            f"Some kernels were busy ({report.get('why')}); they keep the state of their "
            "last finished cell."
        )
    unsaved = {k: v for k, v in dict(report.get("unsaved") or {}).items() if k != "kernel state"}
    if unsaved:
        shown = [f"{name} ({why})" for name, why in list(unsaved.items())[:most]]
        more = f", and {len(unsaved) - most} more" if len(unsaved) > most else ""
        parts.append("Not kept: " + ", ".join(shown) + more + ".")
    return " ".join(parts)


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


@dataclass(frozen=True)
class SnapshotPolicy:
    enabled: bool = True
    keep: int = 3
    grace: float = 20.0


@dataclass
class Teardown:
    """A preempted session on its way out: ``freed`` once its container is gone and its
    slices free, ``done`` once it is recorded and its server stopped."""

    node: str
    freed: asyncio.Future[None]
    done: asyncio.Future[None]
    snapshot: str | None = None


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
        layout: Layout | None = None,
        snapshots: SnapshotPolicy | None = None,
        agents: dict[str, Agent] | None = None,
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
        """Book the admission's slices in the store, then hand the grant on; after the
        containers of victims on its nodes are gone (and, for preempted work that waits
        again, after its own snapshot)."""
        waits = [
            t.done if request_id == allocation.id else t.freed
            for request_id, t in self.teardowns.items()
            if request_id == allocation.id or t.node in allocation.node_names
        ]
        if waits:
            self.background(self._launch_after(allocation, waits))
            return
        self._book(allocation)

    async def _launch_after(
        self, allocation: Allocation, waits: list[asyncio.Future[None]]
    ) -> None:
        await asyncio.gather(*(asyncio.shield(w) for w in waits), return_exceptions=True)
        if self._core.running.get(allocation.id) is allocation:
            self._book(allocation)

    def _book(self, allocation: Allocation) -> None:
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
        """Stop a victim and tell its user; resumable work waits again at its old place
        (True), and is spawned again through the Hub.

        In the background (`_take_down`): a checkpoint through its agent, its container
        removed, its slices freed, its kernel state copied and recorded as a snapshot,
        its server stopped through the Hub."""
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
            "idle": "it was idle and a session funded by a team's budget needed its GPUs",
            "debug": f"a debug session needed its GPUs ({how})",
            "time-slice": (
                "your team has had its day's share of GPU time and others are waiting;"
                " it is larger than your team's share, so it runs in daily slices"
            ),
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
        self.store.append_event(
            now, "preempt", {"request": allocation.id, "reason": reason, "message": message}
        )
        self.notices[split_request_id(allocation.id)] = message
        self.live.discard(allocation.id)
        self._stopping.add(allocation.id)
        self.activity.pop(allocation.id, None)
        self._preempted(allocation.id)
        loop = asyncio.get_running_loop()
        teardown = Teardown(allocation.grants[0].node, loop.create_future(), loop.create_future())
        self.teardowns[allocation.id] = teardown
        self.background(self._take_down(allocation, reason, message, state, requeue, now, teardown))
        return requeue

    async def _take_down(
        self,
        allocation: Allocation,
        reason: str,
        message: str,
        state: RequestState,
        requeue: bool,
        now: float,
        teardown: Teardown,
    ) -> None:
        request_id = allocation.id
        node = allocation.grants[0].node
        agent = self.agents.get(request_id)
        checkpoint: dict[str, Any] | None = None
        why_not: str | None = None
        archive: bytes | None = None
        snapshot = self.snapshots.enabled and self.layout is not None
        try:
            if snapshot and agent is None:
                why_not = "the Hub does not know this session's agent"
            elif snapshot and agent is not None and not self.node_answers(node):
                why_not = f"its node {node} does not answer"
            elif snapshot and agent is not None:
                checkpoint, why_not = await self._checkpoint(agent)
            container_id = agent.container_id if agent is not None else ""
            if not container_id:
                container_id = await self._find_container(node, request_id)
            layout = self.layout
            if snapshot and layout is not None and layout.home_root is None and container_id:
                archive = await self._fetch_state(node, container_id, agent)
            await self.stop_container(node, container_id, request_id)
        except Exception as error:  # never keep the slices because a snapshot step broke
            self.log.exception("budgethub: %s: taking the session down: %s", request_id, error)
            why_not = why_not or f"the snapshot failed ({type(error).__name__}: {error})"
        try:
            self.store.release(request_id, now, state=state, reason=message)
        except StoreError as error:
            self.log.warning("budgethub: releasing %s: %s", request_id, error)
        self._free_ports(request_id)
        self._stopping.discard(request_id)
        teardown.freed.set_result(None)
        self.log.info(
            "budgethub: %s preempted (%s): slices free %.2f s after the decision",
            request_id,
            reason,
            time.time() - now,
        )
        self._changed()
        try:
            if snapshot and agent is not None:
                # The spawn form shows what it keeps (`BudgetScheduler.snapshot_notice`).
                teardown.snapshot = await self._record_snapshot(
                    allocation, agent, node, now, reason, checkpoint, why_not, archive
                )
        except Exception as error:
            self.log.exception("budgethub: %s: recording its snapshot: %s", request_id, error)
        self.agents.pop(request_id, None)
        try:
            await self._stop_through_hub(allocation, requeue)
        finally:
            teardown.done.set_result(None)
            self.teardowns.pop(request_id, None)

    async def _find_container(self, node: str, request_id: str) -> str:
        if not self.node_answers(node):
            return ""
        try:
            found = await asyncio.wait_for(
                self.backends[node].sessions(self.hub_name), self.timeouts.engine
            )
        except Exception as error:
            self.log.warning("budgethub: node %s: listing sessions: %s", node, error)
            return ""
        for container in found:
            if container.labels.get(f"{LABEL_PREFIX}.request") == request_id:
                return container.id
        return ""

    async def _checkpoint(self, agent: Agent) -> tuple[dict[str, Any] | None, str | None]:
        """Ask the agent to checkpoint every kernel within the grace: its answer, or why
        there is none."""
        grace = self.snapshots.grace
        request = HTTPRequest(
            agent.url("checkpoint"),
            method="POST",
            headers={AGENT_HEADER: agent.secret, "Content-Type": "application/json"},
            body=json.dumps({"within": grace}),
            connect_timeout=min(5.0, grace),
            request_timeout=grace + 5.0,
        )
        try:
            response = await asyncio.wait_for(AsyncHTTPClient().fetch(request), grace + 6.0)
            answer = json.loads(response.body)
        except HTTPClientError as error:
            if error.code == 599:
                return None, f"its agent did not answer within {grace:g} s"
            return None, f"its agent answered {error.code} {error.message}"
        except TimeoutError:
            return None, f"its agent did not answer within {grace:g} s"
        except (OSError, ValueError) as error:
            return None, f"its agent could not be asked ({error})"
        if not isinstance(answer, dict):
            return None, "its agent's answer was not understood"
        return answer, None

    async def _fetch_state(self, node: str, container_id: str, agent: Agent | None) -> bytes | None:
        """The kernel state out of a container whose home is a volume on its node."""
        server = agent.server if agent is not None else ""
        path = f"{HOME_TARGET}/{state_dir_in_home(server)}"
        try:
            return await asyncio.wait_for(
                self.backends[node].archive(container_id, path), self.timeouts.engine
            )
        except Exception as error:
            self.log.warning("budgethub: %s: fetching the kernel state: %s", container_id, error)
            return None

    async def _record_snapshot(
        self,
        allocation: Allocation,
        agent: Agent,
        node: str,
        now: float,
        reason: str,
        checkpoint: dict[str, Any] | None,
        why_not: str | None,
        archive: bytes | None,
    ) -> str:
        """Copy the kernel state into the snapshot store, record it, keep the newest
        ``snapshot_keep``; its key."""
        layout = self.layout
        assert layout is not None
        user, server = agent.user, agent.server
        key = new_key(now)
        home = layout.home(user)
        store_error: str | None = None
        try:
            captured = await asyncio.to_thread(
                capture,
                layout,
                user,
                server,
                key,
                home=home,
                state_relative=state_dir_in_home(server),
                archive=archive,
            )
        except SnapshotError as error:
            captured = None
            store_error = str(error)
        kernels = _kernel_entries(checkpoint, captured.manifests if captured else [])
        saved = [f"{k['notebook']}:{name}" for k in kernels for name in k["variables"]]
        unsaved: dict[str, str] = {}
        for k in kernels:
            for name, why in k["unsaved"].items():
                unsaved[f"{k['notebook']}:{name}"] = str(why)
        notebooks = (checkpoint or {}).get("notebooks") or {}
        for path, why in dict(notebooks.get("not_flushed") or {}).items():
            unsaved[f"{path} (unsaved changes)"] = str(why)
        if store_error is not None:
            kernel_state = "not saved"
            why = store_error
        elif why_not is not None:
            kernel_state = "not saved"
            why = why_not
        elif any(k["state"] not in ("saved", "not running") for k in kernels):
            kernel_state = "partial"
            why = "; ".join(
                f"{k['notebook']}: {k['state']}" + (f" ({k['error']})" if k.get("error") else "")
                for k in kernels
                if k["state"] not in ("saved", "not running")
            )
        else:
            kernel_state, why = "saved", None
        if kernel_state == "not saved":
            unsaved["kernel state"] = str(why)
        home_bytes = await asyncio.to_thread(tree_bytes, home) if home is not None else None
        sizes = {
            "kernels": captured.kernel_bytes if captured else 0,
            "home": home_bytes,
        }
        report: dict[str, Any] = {
            "key": key,
            "user": user,
            "server": server,
            "node": node,
            "time": now,
            "reason": reason,
            "image": agent.image,
            "kernel_state": kernel_state,
            "why": why,
            "kernels": kernels,
            "notebooks": {
                "saved": list(notebooks.get("saved") or []),
                "not_flushed": dict(notebooks.get("not_flushed") or {}),
            },
            "unsaved": unsaved,
            "files": "kept in the home" if home is not None else f"kept in its volume on {node}",
            "skipped": captured.skipped if captured else [],
            "sizes": sizes,
            "checkpoint_elapsed": (checkpoint or {}).get("elapsed"),
        }
        if captured is not None:
            try:
                await asyncio.to_thread(write_report, captured.path, report)
            except OSError as error:
                self.log.warning("budgethub: %s: writing its report: %s", key, error)
        self.store.save_snapshot(
            allocation.id,
            now,
            agent.image,
            saved=saved,
            unsaved=unsaved,
            key=key,
            server=server,
            node=node,
            sizes=sizes,
            kernels=kernels,
            report=report,
        )
        self.store.append_event(
            time.time(),
            "snapshot",
            {"request": allocation.id, "key": key, "kernel_state": kernel_state, "why": why},
        )
        self.log.info(
            "budgethub: %s: snapshot %s (%s, %d variables, %d bytes of kernel state)",
            allocation.id,
            key,
            kernel_state,
            len(saved),
            sizes["kernels"],
        )
        if captured is not None:
            await asyncio.to_thread(self.prune, user, server)
        return key

    def prune(self, user: str, server: str) -> None:
        """Keep the newest ``snapshot_keep`` snapshots of a server; delete the others."""
        layout = self.layout
        if layout is None:
            return
        kept = self.store.list_snapshots(user=user, server=server)
        old = kept[: max(0, len(kept) - self.snapshots.keep)]
        if not old:
            return
        for record in old:
            try:
                remove([layout.snapshot_dir(user, server, record.key)])
            except SnapshotError:
                pass
        self.store.delete_snapshots(r.key for r in old)

    def delete_snapshots(self, user: str, server: str | None) -> int:
        """Delete a server's snapshots (``server`` None: all of the user's), rows and
        files; how many."""
        records = self.store.list_snapshots(user=user, server=server)
        layout = self.layout
        if layout is not None:
            if server is None:
                remove([layout.user_dir(user)])
            else:
                remove([layout.server_dir(user, server)])
        return self.store.delete_snapshots(r.key for r in records)

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
        """Ping every engine (docs/operations.md, "Nodes").

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
