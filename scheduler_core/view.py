"""The per-cycle view the policy reads, and the decisions it returns.

The view is frozen: nodes, running allocations, pending requests, each
team's charged usage in the lookback window, and the reservations kept from the
previous cycle. The policy does its what-if work on a `Capacity` built from it
(capacity.py) and never changes the view itself.

A scheduler may also hand over a `CycleIndex` (kept.py): the queue already
sorted per team, the funded sessions still protected and the exposed ones, all
kept up to date event by event, so a cycle costs what changed rather than what
is running. It is only a faster road to the same answer; `decide` must decide
exactly as it would from the rest of the view, and falls back to that when
it is absent.

The frozen dataclasses made once a cycle or more (here, and model.Slice, NodeGrant,
Allocation, preemption.Target) write out their ``__init__`` with ``object.__setattr__``:
compiled, the one dataclasses generates runs interpreted, about ten times as slow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from scheduler_core.kept import CycleIndex, SearchKey
from scheduler_core.model import Allocation, Node, NodeGrant, Pool, Request
from scheduler_core.nodefree import NodeFree
from scheduler_core.settings import Settings
from scheduler_core.teams import TeamTree
from scheduler_core.verdict import Verdict

_EMPTY: Mapping[str, tuple[str, ...]] = MappingProxyType({})
_NO_STOPS: Mapping[str, int] = MappingProxyType({})
_NO_PAIRS: Mapping[str, str] = MappingProxyType({})
_NO_FUNDED: Mapping[str, bool] = MappingProxyType({})
_NO_SEARCHES: Mapping[SearchKey, int] = MappingProxyType({})
_NO_VERDICTS: Mapping[str, Verdict] = MappingProxyType({})
"""The shared empty defaults of the read-only mappings below (never changed)."""


@dataclass(frozen=True, init=False)
class ClusterView:
    """Everything the policy may look at in one cycle.

    Its ``__init__`` is written out, not generated: compiled (scheduler_core/native.py),
    a generated one runs interpreted, and a cycle makes one view (Decisions, Admission,
    Preemption and model.Slice likewise). ``object.__setattr__`` keeps it frozen."""

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
    idle: tuple[tuple[Allocation, float], ...] = ()
    """Running allocations whose sessions are idle, each with the time it went idle
    (the actuator reads it from the session's agent; the simulator from the scenario)."""
    stops: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Per waiting debug request, the times it was preempted before it ran its course
    (the policy protects its next start longer: `policy.cycle.Cycle.protection`)."""
    stopped_by: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Per waiting request that a preemption put back in the queue, the request whose
    admission stopped it, where that one runs past its protection: it is not stopped
    in return (S10)."""

    def __init__(
        self,
        settings: Settings,
        pools: Mapping[str, Pool],
        nodes: tuple[Node, ...],
        allocations: tuple[Allocation, ...],
        pending: tuple[Request, ...],
        teams: TeamTree,
        usage: Mapping[tuple[str, str], float],
        window: float,
        capacity: Mapping[str, float],
        reservations: Mapping[str, tuple[str, ...]] = _EMPTY,
        queued: frozenset[str] | None = None,
        free: Mapping[str, NodeFree] | None = None,
        index: CycleIndex | None = None,
        funded_rates: Mapping[tuple[str, str], float] | None = None,
        idle: tuple[tuple[Allocation, float], ...] = (),
        stops: Mapping[str, int] = _NO_STOPS,
        stopped_by: Mapping[str, str] = _NO_PAIRS,
    ) -> None:
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "pools", pools)
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "allocations", allocations)
        object.__setattr__(self, "pending", pending)
        object.__setattr__(self, "teams", teams)
        object.__setattr__(self, "usage", usage)
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "reservations", reservations)
        object.__setattr__(self, "queued", queued)
        object.__setattr__(self, "free", free)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "funded_rates", funded_rates)
        object.__setattr__(self, "idle", idle)
        object.__setattr__(self, "stops", stops)
        object.__setattr__(self, "stopped_by", stopped_by)


@dataclass(frozen=True, slots=True, init=False)
class Admission:
    """Start ``request`` on ``grants``, after stopping the allocations in ``preempts``."""

    request: Request
    grants: tuple[NodeGrant, ...]
    funded: bool
    protected_until: float
    charge_rate: float
    preempts: tuple[str, ...] = ()

    def __init__(
        self,
        request: Request,
        grants: tuple[NodeGrant, ...],
        funded: bool,
        protected_until: float,
        charge_rate: float,
        preempts: tuple[str, ...] = (),
    ) -> None:
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "grants", grants)
        object.__setattr__(self, "funded", funded)
        object.__setattr__(self, "protected_until", protected_until)
        object.__setattr__(self, "charge_rate", charge_rate)
        object.__setattr__(self, "preempts", preempts)


@dataclass(frozen=True, slots=True, init=False)
class Preemption:
    """Stop a running allocation; ``reason`` is ``funded``, ``debug`` (the fast lane, for an
    unfunded debug request), ``time-slice`` (a day slice spent), ``drain`` or
    ``node-down``."""

    allocation_id: str
    reason: str
    for_request: str | None = None
    code: str = ""
    """Why this session was the one stopped for ``for_request`` (a verdict.VICTIM_*
    code; empty for stops no request asked for)."""
    cost: float = 0.0
    """The work its stopping throws away, GPU- or core-seconds (`preemption.lost_work`)."""

    def __init__(
        self,
        allocation_id: str,
        reason: str,
        for_request: str | None = None,
        code: str = "",
        cost: float = 0.0,
    ) -> None:
        object.__setattr__(self, "allocation_id", allocation_id)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "for_request", for_request)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "cost", cost)


@dataclass(frozen=True, init=False)
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
    verdicts: Mapping[str, Verdict] = field(default_factory=lambda: MappingProxyType({}))
    """Per pending request considered, in ``order``: the policy's `Verdict` (funded and on
    what ground, protection, placed or why not, position). ``order`` is its keys in
    order and ``funded`` its funded flags. Empty from policies that give none (the
    baselines)."""

    def __init__(
        self,
        admissions: tuple[Admission, ...] = (),
        preemptions: tuple[Preemption, ...] = (),
        reservations: Mapping[str, tuple[str, ...]] = _EMPTY,
        order: tuple[str, ...] = (),
        funded: Mapping[str, bool] = _NO_FUNDED,
        released: tuple[str, ...] = (),
        searches: Mapping[SearchKey, int] = _NO_SEARCHES,
        verdicts: Mapping[str, Verdict] = _NO_VERDICTS,
    ) -> None:
        object.__setattr__(self, "admissions", admissions)
        object.__setattr__(self, "preemptions", preemptions)
        object.__setattr__(self, "reservations", reservations)
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "funded", funded)
        object.__setattr__(self, "released", released)
        object.__setattr__(self, "searches", searches)
        object.__setattr__(self, "verdicts", verdicts)

    @property
    def follow_up(self) -> bool:
        """Did this cycle free room that requests it already passed over could use?

        Slices freed by preemption beyond the need, and nodes no longer held,
        are only seen by the next cycle, which should then run at once
        (`Scheduler.settle` runs it)."""
        return bool(self.preemptions or self.released)
