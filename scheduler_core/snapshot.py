"""The per-cycle snapshot the policy reads, and the decisions it returns.

The snapshot is frozen: nodes, running allocations, pending requests, each
team's charged usage in the lookback window, and the reservations kept from the
previous cycle. The policy does its what-if work on a `Capacity` built from it
(capacity.py) and never changes the snapshot itself.

A scheduler may also hand over a `CycleIndex`: the queue already sorted per
team, the funded sessions still protected and the exposed ones, all kept up to
date event by event, so a cycle costs what changed rather than what is running.
It is only a faster road to the same answer; `decide` must decide exactly as
it would from the rest of the snapshot, and falls back to that when it is absent.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from scheduler_core.capacity import Layout, NodeFree, WholeBuckets
from scheduler_core.model import Allocation, Node, NodeGrant, Pool, PoolKind, Request
from scheduler_core.preemption import ExposedSessions
from scheduler_core.settings import Settings
from scheduler_core.teams import TeamTree

_EMPTY: Mapping[str, tuple[str, ...]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Shape:
    """What a request needs on each node; a larger shape fits nowhere a smaller one does not."""

    kind: tuple[object, ...]
    """Pool, labels and MIG profile: shapes of different kinds are not comparable."""
    gpus: int
    nodes: int
    gpu_milli: int
    cpus: float
    memory_gib: float

    def covers(self, other: Shape) -> bool:
        """Is ``other`` at least as large in every dimension (so fails where self fails)?"""
        return (
            self.kind == other.kind
            and other.gpus >= self.gpus
            and other.nodes >= self.nodes
            and other.gpu_milli >= self.gpu_milli
            and other.cpus >= self.cpus
            and other.memory_gib >= self.memory_gib
        )


def shape_of(request: Request) -> Shape:
    labels = tuple(sorted(request.labels.items())) if request.labels else ()
    kind = (request.pool, request.mig, bool(request.gpu_milli), labels)
    return Shape(
        kind, request.gpus, request.nodes, request.gpu_milli, request.cpus, request.memory_gib
    )


_SHAPE_IDS: dict[Shape, int] = {}
"""Equal shapes get one number, so per-cycle records of failed shapes are dict lookups."""
_NEXT_SHAPE_ID = itertools.count()


def shape_id(shape: Shape) -> int:
    """A number for the shape. Equal numbers mean equal shapes; equal shapes get equal
    numbers unless the table was cleared in between (which only costs lookups)."""
    found = _SHAPE_IDS.get(shape)
    if found is None:
        if len(_SHAPE_IDS) >= 100_000:
            _SHAPE_IDS.clear()  # numbers are never given out twice
        found = _SHAPE_IDS[shape] = next(_NEXT_SHAPE_ID)
    return found


@dataclass(frozen=True, slots=True)
class Queued:
    """A waiting request with the figures the policy derives from it, worked out once."""

    request: Request
    shape: Shape
    shape_id: int
    min_runtime: float
    """The protected window it would get (capped by the settings)."""
    rate: float
    """Budget units per second while it runs."""
    units: float
    """``rate × min_runtime``: what funding it commits its team to."""

    @classmethod
    def of(cls, request: Request, settings: Settings, kind: PoolKind) -> Queued:
        min_runtime = settings.capped_min_runtime(request.min_runtime, request.klass)
        rate = request.charge_rate(kind)
        shape = shape_of(request)
        return cls(request, shape, shape_id(shape), min_runtime, rate, rate * min_runtime)


def queue_key(request: Request) -> tuple[int, float, str]:
    """Order inside one team: declared priority (high first), then submit time."""
    return (-request.priority, request.submit, request.id)


SearchKey = tuple[int, frozenset[str]]


@dataclass(frozen=True)
class CycleIndex:
    """What the scheduler keeps up to date between cycles, valid for a decision at ``at``."""

    at: float
    layout: Layout
    """The nodes of every pool (those of the snapshot)."""
    whole: WholeBuckets
    """Nodes by free whole GPUs, as in the snapshot's ``free``."""
    protected: Mapping[str, tuple[Allocation, ...]]
    """Per pool, the funded allocations whose protected window ends after ``at``,
    in the order of the snapshot's ``allocations``."""
    exposed: ExposedSessions
    """The allocations whose protected window (or grace) ended at or before ``at``."""
    reach: Mapping[str, int]
    """Per node, free whole GPUs plus the GPUs the exposed sessions there hold."""
    queues: Mapping[str, Mapping[str, tuple[Queued, ...]]] | None = None
    """Per pool and team, the snapshot's ``pending`` in queue order (`queue_key`);
    None: the policy sorts ``pending`` itself."""
    growth: Sequence[str] = ()
    """Nodes where room, eligibility or preemptible sessions may have grown, in the
    order it happened (the latest part of the scheduler's growth log)."""
    growth_start: int = 0
    """The log position of ``growth[0]``."""
    growth_end: int = 0
    """The log position at ``at``: entries from here on came later."""
    searches: Mapping[SearchKey, int] = field(default_factory=lambda: MappingProxyType({}))
    """Victim searches known to have failed: (shape number, permitted teams) → the log
    position at which fewer nodes than the request needs could take it. Entries past
    ``growth_end`` are ignored."""


@dataclass(frozen=True)
class Snapshot:
    """Everything the policy may look at in one cycle."""

    settings: Settings
    pools: Mapping[str, Pool]
    nodes: tuple[Node, ...]
    allocations: tuple[Allocation, ...]
    pending: tuple[Request, ...]
    teams: TeamTree
    usage: Mapping[tuple[str, str], float]
    """Charged units per (team, pool) in the current window (the team's own work only)."""
    window: float
    """Length of the lookback window in force, in seconds."""
    capacity: Mapping[str, float]
    """Budget units per second each pool can deliver (GPU-equivalents or cores)."""
    reservations: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    """Request id → nodes held for it, as the previous cycle left them."""
    queued: frozenset[str] | None = None
    """Every waiting request's id when ``pending`` holds only some of them (a cycle
    over new arrivals): their reservations still hold. None: ``pending`` is all."""
    free: Mapping[str, NodeFree] | None = None
    """What is free on each node with ``allocations`` taken, if the caller keeps it
    up to date; None makes the policy work it out from the allocations."""
    index: CycleIndex | None = None
    """Indexes the caller keeps between cycles; used only by a decision at ``index.at``."""
    funded_rates: Mapping[tuple[str, str], float] | None = None
    """Per (team, pool), the charge rate of the team's funded ``allocations`` there, if
    the caller keeps it up to date; None makes the policy add them up."""


@dataclass(frozen=True, slots=True)
class Admission:
    """Start ``request`` on ``grants``, after stopping the allocations in ``preempts``."""

    request: Request
    grants: tuple[NodeGrant, ...]
    funded: bool
    protected_until: float
    charge_rate: float
    preempts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop a running allocation; ``reason`` is ``funded``, ``drain`` or ``node-down``."""

    allocation_id: str
    reason: str
    for_request: str | None = None


@dataclass(frozen=True)
class Decisions:
    """What one cycle decided, in the order it must be carried out."""

    admissions: tuple[Admission, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    reservations: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    order: tuple[str, ...] = ()
    """Pending request ids in the order the policy considered them (queue positions)."""
    funded: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))
    """For each pending request considered: would it be funded if it started now."""
    released: tuple[str, ...] = ()
    """Requests whose holds ended this cycle: admitted onto the nodes held for them,
    or no longer funded (only funded requests hold nodes)."""
    searches: Mapping[SearchKey, int] = field(default_factory=lambda: MappingProxyType({}))
    """Victim searches that failed this cycle, for the scheduler's `CycleIndex.searches`."""

    @property
    def follow_up(self) -> bool:
        """Did this cycle free room that requests it already passed over could use?

        Slices freed by preemption beyond the need, and nodes no longer held,
        are only seen by the next cycle, which should then run at once."""
        return bool(self.preemptions or self.released)
