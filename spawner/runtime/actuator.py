"""The actuator: the only holder of the nodes' runtimes (Docker engines, unless
`runtimes` names others). It books and releases slices, starts, polls and stops
sessions, preempts, and follows the nodes' health and their sessions' ends.

The core calls `launch` and `preempt` inside a cycle (the core's Actuator protocol);
spawners call `start_session`, `poll_session` and `stop_session` through the facade
(embedded.py). A session's life is split in overridable steps of `Lifecycle`, as in
DockerSpawner: `build_spec`, `create_session` (create and start it on the node's
runtime), `stop_session` (remove it, bounded). Calls to a runtime from a request path
are bounded by ``engine_timeout``; an unreachable node is not called at all.

A preempted session is snapshotted (docs/snapshots.md): its agent checkpoints the
kernels within ``snapshot_grace``, the session goes, the slices are freed, then the
kernel state is copied into the snapshot store and recorded. The preemptor's slices
are booked only once the victim is gone (`launch` waits for it), so two sessions never
share a GPU, as a Kubernetes preemptor waits for its victims to end.

`SessionActuator` is a facade over collaborators, each with its own state, made here and
handed the ones it calls (calls run one way, down this list):

* `Takedown` (takedown.py): preemption, its messages, the victim's way out;
* `SnapshotRecording` (snaprecord.py): checkpoints, snapshots recorded and pruned;
* `Lifecycle` (lifecycle.py): a session's steps on its node's runtime;
* `IdlePolls` (idlepolls.py): what each session's agent says, for the core;
* `NodeWatch` (nodewatch.py): node health, sessions that end by themselves, orphans;
* `Booking` (booking.py): ports, slices booked and released (`release`, `requeue`: the
  facade's callers reach them as ``actuator.booking``);
* below them all `Nodes` and `SessionTable` (context.py), and the values (values.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from scheduler_core.model import Allocation, Health, Node
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import Store
from spawner.hubapi import HubClient
from spawner.runtime.booking import Booking
from spawner.runtime.context import Log, Nodes, SessionTable
from spawner.runtime.dockernodes import EngineConfig, NodeBackend
from spawner.runtime.foreign import ForeignHolds, is_foreign
from spawner.runtime.idlepolls import IdlePolls
from spawner.runtime.interface import NodeConfig, Runtime
from spawner.runtime.lifecycle import Lifecycle
from spawner.runtime.nodewatch import NodeWatch, describe_exit
from spawner.runtime.snaprecord import SnapshotRecording, snapshot_sentence
from spawner.runtime.snapshots import SnapshotLayout
from spawner.runtime.takedown import Takedown
from spawner.runtime.values import (
    AGENT_HEADER,
    Activity,
    Agent,
    LaunchFailed,
    RunningSession,
    SessionLaunch,
    SnapshotPolicy,
    Teardown,
    Timeouts,
)

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


class SessionActuator:
    """Sessions on the nodes' Docker engines (or on the given runtimes): the core's
    actuator and the spawners' way to their sessions, through its collaborators."""

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
        log: Log,
        layout: SnapshotLayout | None = None,
        snapshots: SnapshotPolicy | None = None,
        agents: dict[str, Agent] | None = None,
        runtimes: Mapping[str, Runtime] | None = None,
    ) -> None:
        given = dict(runtimes or {})  # nodes whose sessions a runtime other than Docker runs
        backends: dict[str, Runtime] = {
            name: NodeBackend(engine, ping_timeout=timeouts.ping)
            for name, engine in engines.items()
            if name not in given
        }
        backends.update(given)
        self.nodes = Nodes(
            backends=backends,
            configured={n.name: n.health for n in nodes},
            hub=hub,
            hub_name=hub_name,
            timeouts=timeouts,
            changed=changed,
            log=log,
        )
        self.table = SessionTable(agents=agents if agents is not None else {}, notices=notices)
        ctx, table = self.nodes, self.table
        self.booking = Booking(nodes=ctx, table=table, port_range=port_range, granted=granted)
        self.nodewatch = NodeWatch(nodes=ctx, table=table, booking=self.booking)
        self.lifecycle = Lifecycle(
            nodes=ctx, table=table, booking=self.booking, watch=self.nodewatch, layout=layout
        )
        self.idle = IdlePolls(nodes=ctx, table=table)
        self.recording = SnapshotRecording(
            nodes=ctx,
            layout=layout,
            policy=snapshots or SnapshotPolicy(enabled=layout is not None),
        )
        self.takedown = Takedown(
            nodes=ctx,
            table=table,
            booking=self.booking,
            lifecycle=self.lifecycle,
            recording=self.recording,
            preempted=preempted,
            respawn=respawn,
        )
        self.foreign: ForeignHolds | None = None
        """What other jobs hold on the nodes, as stand-ins in the core (once attached)."""

    # -- what the Hub side reads -----------------------------------------------------

    @property
    def log(self) -> Log:
        return self.nodes.log

    @property
    def hub_name(self) -> str:
        return self.nodes.hub_name

    @property
    def backends(self) -> dict[str, Runtime]:
        return self.nodes.backends

    @property
    def engines(self) -> dict[str, NodeConfig]:
        """Per node, its runtime's configuration."""
        return self.nodes.configs

    @property
    def configured(self) -> dict[str, Health]:
        return self.nodes.configured

    @property
    def live(self) -> set[str]:
        """Requests whose server runs (its spawner's start returned, or adopted)."""
        return self.table.live

    def attach(self, core: Scheduler, store: Store) -> None:
        self.nodes.attach(core, store)
        self.foreign = ForeignHolds(
            core, self.nodes.backends, self.nodes.changed, self.log, store=store
        )

    # -- the core's Actuator protocol ------------------------------------------------

    def launch(self, allocation: Allocation) -> None:
        self.booking.launch(allocation)

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        if is_foreign(allocation.id):  # other jobs' stand-in: nothing of ours to stop
            return False
        return self.takedown.preempt(allocation, reason)

    # -- the facade's calls (embedded.py, recovery.py) -------------------------------

    async def start_session(self, allocation: Allocation, ask: SessionLaunch) -> RunningSession:
        return await self.lifecycle.start_session(allocation, ask)

    async def poll_session(
        self, request_id: str, node: str, runtime_id: str, *, release: bool = True
    ) -> int | None:
        return await self.lifecycle.poll_session(request_id, node, runtime_id, release=release)

    async def stop_session(self, node: str, runtime_id: str, request_id: str = "") -> None:
        await self.lifecycle.stop_session(node, runtime_id, request_id)

    def hold_port(self, port: int, request_id: str) -> None:
        self.booking.hold_port(port, request_id)

    def watch(self) -> None:
        """Follow the sessions' ends, and what other jobs hold (Slurm: `ForeignHolds`)."""
        self.nodewatch.watch()
        if self.foreign is not None and self.foreign.readers:
            self.foreign.prime()  # before the first cycle: it must see other jobs' GPUs
            self.nodes.background(self.foreign.follow())

    async def check_health(self) -> None:
        await self.nodewatch.check_health()

    def mark_unreachable(self, node: str, since: float) -> None:
        self.nodewatch.mark_unreachable(node, since)

    async def poll_activity(self) -> None:
        await self.idle.poll_activity()

    def delete_snapshots(self, user: str, server: str | None) -> int:
        return self.recording.delete_snapshots(user, server)
