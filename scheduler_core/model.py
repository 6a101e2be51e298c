"""The scheduler's vocabulary: pools, nodes, GPUs, teams, requests, allocations.

Everything here is a frozen dataclass, so a view handed to the policy
cannot be changed behind its back. Times are seconds (floats) on whatever
clock the caller uses; memory is GiB; GPU fractions are integer milli-GPUs so
that packing never suffers from float rounding.
"""

from __future__ import annotations

import enum
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

MILLI: Final = 1000
"""Milli-GPUs in one whole GPU."""

MIG_SLICES: Final = 7
"""Compute slices of a full MIG-capable GPU (A100/H100/H200/B200): `1g` is 1/7."""

SNAPSHOT_TAKE_FIXED_S: Final = 1.58
"""Seconds a preemption takes with the snapshot already on disk: decision -> slices free,
settled, 1.58 s (`python -m bench.snapshot`, docs/benchmarks/snapshot.md)."""
SNAPSHOT_TAKE_S_PER_GIB: Final = 3.02
"""Seconds per GiB of state to flush at a preemption: decision -> slices free hot (1.07
GiB of kernel state unflushed) 4.81 s less settled 1.58 s, over 1.07 GiB
(`python -m bench.snapshot`)."""
SNAPSHOT_RESTORE_FIXED_S: Final = 5.33
"""Seconds a restore takes whatever the session's size: its server starting again
(restore, settled: server ready 5.33 s; `python -m bench.snapshot`)."""
SNAPSHOT_RESTORE_S_PER_GIB: Final = 2.22
"""Seconds a restore takes per GiB of state: variables available 7.55 s less the
server's 5.33 s, for 1 GiB (`python -m bench.snapshot`). A session's memory limit
stands for its state in the simulator: an upper bound where the kernel holds less."""


BORROW_PRICE_CAP: Final = 300.0
"""R11: work whose reclaim throws away more than this many seconds of its size
(`Request.reclaim_seconds`) borrows only what the teams' turns leave free, after work
cheaper to give back. 300 s: the longest restart of a run that checkpoints in the
generated workloads (5 min), below the snapshot of any session of a whole GPU (a 1-GPU
notebook with 120 GiB: 636 s); docs/policy.md (R11) has the runs that chose it."""

CHECKPOINT_ROUNDING_S: Final = 1e-3
"""A checkpoint due less than this far ahead of a run's clock counts as taken (R10). The
clock is a difference of two times (now less the run's start), a few ulps short of the
checkpoint where the times are large, as in a history replayed from a store; the cycle
woken at the checkpoint must see it there, on either side of a replay."""


def since_checkpoint(elapsed: float, every: float) -> float:
    """Seconds of a run ``elapsed`` seconds old since its last checkpoint, one every
    ``every`` seconds from its start (`CHECKPOINT_ROUNDING_S`)."""
    part = elapsed % every
    return 0.0 if every - part < CHECKPOINT_ROUNDING_S else part


_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")


class PoolKind(enum.StrEnum):
    GPU = "gpu"
    CPU = "cpu"


class Health(enum.StrEnum):
    READY = "ready"
    DRAINING = "draining"
    DOWN = "down"
    UNREACHABLE = "unreachable"
    """The engine stopped answering in time: nothing new lands there, but its sessions
    are kept (a frozen engine's or a cut-off node's containers still run) until the
    node answers again or is declared down."""


class RequestClass(enum.StrEnum):
    DEBUG = "debug"
    INTERACTIVE = "interactive"
    BATCH = "batch"
    DATAPREP = "dataprep"


class SliceKind(enum.StrEnum):
    WHOLE = "whole"
    MIG = "mig"
    FRACTION = "fraction"


def mig_weight(profile: str) -> float:
    """GPU-equivalents of a MIG profile such as ``1g.10gb`` (compute slices / 7)."""
    match = _MIG_PROFILE.match(profile)
    if match is None:
        raise ValueError(f"MIG profile {profile!r} is not of the form '<n>g.<m>gb'")
    slices = int(match.group(1))
    if not 1 <= slices <= MIG_SLICES:
        raise ValueError(f"MIG profile {profile!r} has {slices} compute slices; 1 to 7 exist")
    return slices / MIG_SLICES


def frozen_labels(labels: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """A read-only copy of a label mapping."""
    return MappingProxyType(dict(labels or {}))


def virtual_uuid(prefix: str, *parts: object) -> str:
    """A stable UUID for a GPU or MIG instance declared in config (no NVML)."""
    name = "/".join(str(p) for p in parts)
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_URL, 'budgethub-virtual:' + name)}"


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    kind: PoolKind


@dataclass(frozen=True, slots=True)
class MigInstance:
    uuid: str
    profile: str

    @property
    def weight(self) -> float:
        return mig_weight(self.profile)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU: whole/fractional when ``mig`` is empty, else MIG instances only."""

    uuid: str
    index: int
    model: str = "GPU"
    memory_mib: int = 0
    mig: tuple[MigInstance, ...] = ()
    virtual: bool = False


def virtual_gpus(
    node: str,
    count: int,
    model: str = "virtual GPU",
    mig: Mapping[int, list[str]] | None = None,
    memory_mib: int = 0,
) -> tuple[Gpu, ...]:
    """GPUs declared in config or a scenario (no NVML): stable UUIDs derived from the
    node's name, MIG instances by GPU index, marked virtual."""
    layout = mig or {}
    return tuple(
        Gpu(
            uuid=virtual_uuid("GPU", node, g),
            index=g,
            model=model,
            memory_mib=memory_mib,
            mig=tuple(
                MigInstance(virtual_uuid("MIG", node, g, j), profile)
                for j, profile in enumerate(layout.get(g, ()))
            ),
            virtual=True,
        )
        for g in range(count)
    )


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    pool: str
    cpus: float
    memory_gib: float
    gpus: tuple[Gpu, ...] = ()
    labels: Mapping[str, str] = field(default_factory=frozen_labels)
    health: Health = Health.READY

    @property
    def whole_gpus(self) -> tuple[Gpu, ...]:
        """GPUs that are not MIG-partitioned (usable whole or by fraction)."""
        return tuple(g for g in self.gpus if not g.mig)

    @property
    def gpu_capacity(self) -> float:
        """GPU-equivalents this node adds to its pool."""
        return float(len(self.gpus))


@dataclass(frozen=True, slots=True)
class Team:
    """A team's allocation.

    ``share`` maps pool name to a fraction. For a top-level team it is a share of
    the pool's capacity; for a team with a ``parent`` it is a fraction of the
    parent's share in that pool. A team absent from a pool's map has no share there.
    """

    name: str
    share: Mapping[str, float]
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """What a user asked for. ``gpus`` is per node; a multi-node request has ``nodes`` > 1."""

    id: str
    user: str
    team: str
    pool: str
    submit: float
    gpus: int = 0
    nodes: int = 1
    gpu_milli: int = 0
    mig: str | None = None
    cpus: float = 1.0
    memory_gib: float = 4.0
    labels: Mapping[str, str] = field(default_factory=frozen_labels)
    min_runtime: float = 0.0
    resumable: bool = False
    priority: int = 0
    klass: RequestClass = RequestClass.INTERACTIVE
    profile: str | None = None
    checkpoint_every: float = 0.0
    """Seconds between the checkpoints a resumable run writes itself (a batch job); 0: it
    is snapshotted at the preemption instead (a notebook), if resumable."""
    restart_cost: float = 0.0
    """Seconds a run spends starting again after a preemption before it does new work
    (loading a checkpoint, warming up)."""

    @property
    def gpu_weight(self) -> float:
        """GPU-equivalents the request holds while it runs (all nodes)."""
        if self.mig is not None:
            return mig_weight(self.mig) * self.nodes
        if self.gpu_milli:
            return self.gpu_milli / MILLI * self.nodes
        return float(self.gpus * self.nodes)

    def charge_rate(self, kind: PoolKind) -> float:
        """Budget units per second: GPU-equivalents in GPU pools, cores in CPU pools."""
        return self.gpu_weight if kind is PoolKind.GPU else self.cpus * self.nodes

    def lost_seconds(self, elapsed: float) -> float:
        """Seconds of its size a preemption throws away after ``elapsed`` seconds of a run
        (the price the policy weighs a victim by): the run since its last checkpoint
        (what `saved_seconds` does not keep), the snapshot's taking, and the next run's start (its
        ``restart_cost``, and a snapshot's restore: `restart_seconds`)."""
        # Inline, not through the properties below: the victim search asks this of
        # every candidate it weighs, many times a cycle.
        elapsed = max(0.0, elapsed)
        if not self.resumable:
            return elapsed + self.restart_cost
        every = self.checkpoint_every
        if every > 0:
            return since_checkpoint(elapsed, every) + self.restart_cost
        return (
            SNAPSHOT_TAKE_FIXED_S
            + SNAPSHOT_RESTORE_FIXED_S
            + (SNAPSHOT_TAKE_S_PER_GIB + SNAPSHOT_RESTORE_S_PER_GIB) * self.memory_gib
            + self.restart_cost
        )

    def saved_seconds(self, elapsed: float) -> float:
        """Of a run's first ``elapsed`` seconds, those a preemption keeps: all of them if
        snapshotted, those up to its last checkpoint if it checkpoints (every
        ``checkpoint_every`` seconds of the run, counted from its start, its restart
        included: the one clock the policy's price reads), else none."""
        if not self.resumable:
            return 0.0
        if self.checkpoint_every > 0:
            return elapsed - since_checkpoint(elapsed, self.checkpoint_every)
        return elapsed

    @property
    def reclaim_seconds(self) -> float:
        """R11: the least a reclaim of it throws away, in seconds of its size: for a run
        that checkpoints, its restart (R10 stops it just after a checkpoint); for a
        snapshotted session, its snapshot's taking and restoring and its restart (what
        `lost_seconds` charges at any time); for work that cannot resume, its whole run,
        which only grows (infinite)."""
        if not self.resumable:
            return math.inf
        if self.checkpoint_every > 0:
            return self.restart_cost
        return self.lost_seconds(0.0)

    @property
    def snapshotted(self) -> bool:
        """Resumable with no checkpoints of its own: its session is snapshotted."""
        return self.resumable and self.checkpoint_every <= 0

    @property
    def take_seconds(self) -> float:
        """Taking its snapshot at a preemption, scaled by its memory per node (a gang's
        nodes take theirs side by side); 0 unless `snapshotted`."""
        if not self.snapshotted:
            return 0.0
        return SNAPSHOT_TAKE_FIXED_S + SNAPSHOT_TAKE_S_PER_GIB * self.memory_gib

    @property
    def restart_seconds(self) -> float:
        """The start of a run after a preemption that does no new work: its
        ``restart_cost``, and restoring its snapshot if `snapshotted`."""
        restore = (
            SNAPSHOT_RESTORE_FIXED_S + SNAPSHOT_RESTORE_S_PER_GIB * self.memory_gib
            if self.snapshotted
            else 0.0
        )
        return self.restart_cost + restore


@dataclass(frozen=True, slots=True, init=False)
class Slice:
    """A piece of one GPU given to a session."""

    gpu_uuid: str
    kind: SliceKind
    milli: int = MILLI
    mig_uuid: str | None = None
    mig_profile: str | None = None

    def __init__(
        self,
        gpu_uuid: str,
        kind: SliceKind,
        milli: int = MILLI,
        mig_uuid: str | None = None,
        mig_profile: str | None = None,
    ) -> None:
        object.__setattr__(self, "gpu_uuid", gpu_uuid)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "milli", milli)
        object.__setattr__(self, "mig_uuid", mig_uuid)
        object.__setattr__(self, "mig_profile", mig_profile)

    @property
    def device_id(self) -> str:
        """The UUID a container is given (``NVIDIA_VISIBLE_DEVICES``)."""
        return self.mig_uuid if self.mig_uuid is not None else self.gpu_uuid

    @property
    def weight(self) -> float:
        if self.kind is SliceKind.MIG:
            assert self.mig_profile is not None
            return mig_weight(self.mig_profile)
        return self.milli / MILLI


@dataclass(frozen=True, slots=True, init=False)
class NodeGrant:
    """The part of an allocation on one node."""

    node: str
    slices: tuple[Slice, ...]
    cpus: float
    memory_gib: float

    def __init__(
        self, node: str, slices: tuple[Slice, ...], cpus: float, memory_gib: float
    ) -> None:
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "slices", slices)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "memory_gib", memory_gib)


@dataclass(frozen=True, slots=True, init=False)
class Allocation:
    """A request placed on nodes with concrete slices.

    ``protected_until`` is ``start + min_runtime`` for funded sessions and
    ``start + unallocated_grace`` for unallocated ones: before it, nothing may
    preempt the session.
    """

    request: Request
    grants: tuple[NodeGrant, ...]
    start: float
    funded: bool
    protected_until: float
    charge_rate: float

    def __init__(
        self,
        request: Request,
        grants: tuple[NodeGrant, ...],
        start: float,
        funded: bool,
        protected_until: float,
        charge_rate: float,
    ) -> None:
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "grants", grants)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "funded", funded)
        object.__setattr__(self, "protected_until", protected_until)
        object.__setattr__(self, "charge_rate", charge_rate)

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def team(self) -> str:
        return self.request.team

    @property
    def pool(self) -> str:
        return self.request.pool

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(g.node for g in self.grants)
