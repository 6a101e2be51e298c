"""What the scheduler keeps between cycles, and the frozen view of it a cycle reads.

A cycle could rebuild everything it looks at from the running sessions and the
queue. The scheduler keeps it up to date event by event instead, so a cycle
costs what changed rather than what is running. All of that data lives here:

- `Kept`, the scheduler's working data: what is free on each node, the queue
  sorted per pool and team, funded charge rates, the funded sessions still
  protected and the exposed ones (`ExposedIndex`), nodes by free whole GPUs
  (`WholeIndex`), a log of the nodes where room grew, the victim searches that
  failed, and the last usage window read from the ledger;
- `CycleIndex`, the read-only copy of it handed to one cycle in the view
  (`Layout`, `WholeBuckets` and `ExposedSessions` are its parts);
- `KnownFailures`, through which a cycle reads the failed searches and the log;
- the shape table: equal request shapes get one number across cycles.

It is only a faster road to the same answer: `decide` must decide exactly as it
would from the rest of the view, and does so when the index is absent or was
made for another time (tests/unit/test_perf_index.py decides every cycle both
ways). Nothing here decides anything, and nothing here does I/O.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Final

from scheduler_core.ledger import UsageLedger, WindowUsage
from scheduler_core.model import (
    BORROW_PRICE_CAP,
    Allocation,
    Node,
    Pool,
    PoolKind,
    Request,
    RequestClass,
    SliceKind,
)
from scheduler_core.nodefree import NodeFree
from scheduler_core.settings import Settings

# -- request shapes and queue entries -------------------------------------------


@dataclass(frozen=True, slots=True, init=False)
class Shape:
    """What a request needs on each node; a larger shape fits nowhere a smaller one does not.

    ``__init__``, ``__eq__`` and ``__hash__`` are written out, as the dataclass would make
    them: compiled, those it makes run interpreted, and every request queued makes a shape
    and looks it up (`shape_id`)."""

    kind: tuple[object, ...]
    """Pool, labels and MIG profile: shapes of different kinds are not comparable."""
    gpus: int
    nodes: int
    gpu_milli: int
    cpus: float
    memory_gib: float

    def __init__(
        self,
        kind: tuple[object, ...],
        gpus: int,
        nodes: int,
        gpu_milli: int,
        cpus: float,
        memory_gib: float,
    ) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "gpu_milli", gpu_milli)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "memory_gib", memory_gib)

    def _fields(self) -> tuple[tuple[object, ...], int, int, int, float, float]:
        return (self.kind, self.gpus, self.nodes, self.gpu_milli, self.cpus, self.memory_gib)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Shape)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

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
    # Debug requests may stop more sessions (the fast lane), so their failures say
    # nothing of other requests' and are kept apart.
    debug = request.klass is RequestClass.DEBUG
    kind = (request.pool, request.mig, bool(request.gpu_milli), labels, debug)
    return Shape(
        kind, request.gpus, request.nodes, request.gpu_milli, request.cpus, request.memory_gib
    )


class _Numbers:
    """Equal keys get one number, so records kept per key are lookups of a small int.
    The table is cleared when it grows large; numbers are never given out twice, so a
    cleared key only gets a new one (which costs lookups, never a wrong answer)."""

    def __init__(self) -> None:
        self._table: dict[object, int] = {}
        self._next = itertools.count()

    def of(self, key: object) -> int:
        found = self._table.get(key)
        if found is None:
            if len(self._table) >= 100_000:
                self._table.clear()
            found = self._table[key] = next(self._next)
        return found


_SHAPE_NUMBERS: Final = _Numbers()
"""Equal shapes get one number, so per-cycle records of failed shapes are dict lookups."""


def shape_id(shape: Shape) -> int:
    """A number for the shape. Equal numbers mean equal shapes; equal shapes get equal
    numbers unless the table was cleared in between (which only costs lookups)."""
    return _SHAPE_NUMBERS.of(shape)


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
    debug: bool = False
    """A debug request: it takes the fast lane (see scheduler_core/policy)."""
    dear: bool = False
    """R11: its reclaim would throw away more than `BORROW_PRICE_CAP` of its size
    (`Request.reclaim_seconds`; never a debug request, which has the fast lane)."""
    kind: int = -1
    """Equal numbers for requests the policy cannot tell apart but by id, submit time and
    priority (same shape, protected window, rate, class, resumability and whether it is
    dear to reclaim, R11): one cycle's
    answer for one holds for the next of its team while nothing changed (`kind_of`)."""

    @classmethod
    def of(cls, request: Request, settings: Settings, kind: PoolKind) -> Queued:
        min_runtime = settings.capped_min_runtime(request.min_runtime, request.klass)
        rate = request.charge_rate(kind)
        shape = shape_of(request)
        debug = request.klass is RequestClass.DEBUG
        number = shape_id(shape)
        units = rate * min_runtime
        dear = not debug and request.reclaim_seconds > BORROW_PRICE_CAP
        found = kind_of((number, min_runtime, rate, units, request.klass, request.resumable, dear))
        return cls(request, shape, number, min_runtime, rate, units, debug, dear, found)


_KIND_NUMBERS: Final = _Numbers()


def kind_of(figures: tuple[object, ...]) -> int:
    """A number for a request's figures (`Queued.kind`), given out as `shape_id` does."""
    return _KIND_NUMBERS.of(figures)


QueueKey = tuple[bool, int, float, str]


def queue_key(request: Request) -> QueueKey:
    """Order inside one team: debug requests first (the fast lane), then declared
    priority (high first), then submit time."""
    return (request.klass is not RequestClass.DEBUG, -request.priority, request.submit, request.id)


SearchKey = tuple[int, frozenset[str], frozenset[str] | None, str, str]
"""A victim search: shape number, permitted teams, for the debug fast lane the teams it
may stop debug sessions of, the limit on its victims (`preemption.Lane`: "" for none,
"lane" for the fast lane's, "resumable" for a team's own time slice's), and the id of
the request if it holds nodes (which only it may use), else ""."""


# -- nodes ---------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Which nodes each pool has, in name order, and which of them have MIG instances.

    Fixed while the set of nodes is: the scheduler keeps one and hands it to
    every cycle, so that a cycle does not sort node names again.
    """

    by_pool: Mapping[str, tuple[str, ...]]
    mig_by_pool: Mapping[str, tuple[str, ...]]

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> Layout:
        by_pool: dict[str, list[str]] = {}
        mig_by_pool: dict[str, list[str]] = {}
        for node in sorted(nodes, key=lambda n: n.name):
            by_pool.setdefault(node.pool, []).append(node.name)
            if any(gpu.mig for gpu in node.gpus):
                mig_by_pool.setdefault(node.pool, []).append(node.name)
        return cls(
            {pool: tuple(names) for pool, names in by_pool.items()},
            {pool: tuple(names) for pool, names in mig_by_pool.items()},
        )


@dataclass(frozen=True, init=False)
class WholeBuckets:
    """Per pool, node names by their count of free whole GPUs (name order within a
    count), and each node's count: the index `Capacity` builds, as of one moment."""

    names: Mapping[str, tuple[tuple[str, ...], ...]]
    counts: Mapping[str, Mapping[str, int]]
    """Per pool, node name → free whole GPUs."""

    def __init__(
        self,
        names: Mapping[str, tuple[tuple[str, ...], ...]],
        counts: Mapping[str, Mapping[str, int]],
    ) -> None:
        # Written out: compiled, a generated __init__ runs interpreted (view.py).
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "counts", counts)


def _bucket_sizes(nodes: Iterable[Node]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for node in nodes:
        sizes[node.pool] = max(sizes.get(node.pool, 0), len(node.gpus) + 1)
    return sizes


class WholeIndex:
    """`WholeBuckets` kept up to date by the scheduler as sessions start and end."""

    def __init__(self, free: Mapping[str, NodeFree]) -> None:
        self._pool_of = {name: nf.node.pool for name, nf in free.items()}
        self._counts: dict[str, dict[str, int]] = {}
        self._buckets: dict[str, list[list[str]]] = {
            pool: [[] for _ in range(size)]
            for pool, size in _bucket_sizes(nf.node for nf in free.values()).items()
        }
        for name in sorted(free):
            pool, count = self._pool_of[name], len(free[name].whole)
            self._counts.setdefault(pool, {})[name] = count
            self._buckets[pool][count].append(name)
        self._frozen: WholeBuckets | None = None

    def update(self, node_free: NodeFree) -> None:
        """The node's free whole GPUs may have changed."""
        name = node_free.node.name
        pool = self._pool_of[name]
        count = len(node_free.whole)
        counts = self._counts[pool]
        old = counts[name]
        if old == count:
            return
        buckets = self._buckets[pool]
        buckets[old].remove(name)
        insort(buckets[count], name)
        counts[name] = count
        self._frozen = None

    def count(self, name: str) -> int:
        return self._counts[self._pool_of[name]][name]

    def frozen(self) -> WholeBuckets:
        if self._frozen is None:
            self._frozen = WholeBuckets(
                {
                    pool: tuple(tuple(bucket) for bucket in buckets)
                    for pool, buckets in self._buckets.items()
                },
                {pool: dict(counts) for pool, counts in self._counts.items()},
            )
        return self._frozen


# -- exposed sessions ----------------------------------------------------------


Tally = Mapping[str | None, int]
"""GPUs held by preemptible sessions, per funding team (None: unallocated)."""


def held_gpus(allocation: Allocation) -> list[tuple[str, int]]:
    """Per node of the allocation, the GPUs (whole or shared, not MIG) it holds there."""
    return [
        (grant.node, sum(1 for piece in grant.slices if piece.kind is not SliceKind.MIG))
        for grant in allocation.grants
    ]


class ExposedIndex:
    """Running sessions past their protected window, kept by the scheduler between cycles.

    Every change replaces the containers it touches instead of changing them,
    so `frozen` can hand a cycle a consistent copy cheaply (and only when
    something changed since the last one).
    """

    def __init__(self) -> None:
        self._by_node: dict[str, tuple[Allocation, ...]] = {}
        self._gpus: dict[str, dict[str | None, int]] = {}
        self._node_gpus: dict[str, dict[str | None, int]] = {}
        self._totals: dict[str, tuple[int, int]] = {}
        self._ids: set[str] = set()
        self._frozen: ExposedSessions | None = None

    def __contains__(self, allocation_id: object) -> bool:
        return allocation_id in self._ids

    def held(self, node: str) -> int:
        """GPUs the exposed sessions on the node hold."""
        found = self._totals.get(node)
        return found[0] if found is not None else 0

    def add(self, allocation: Allocation) -> None:
        self._ids.add(allocation.id)
        for node in allocation.node_names:
            self._by_node[node] = self._by_node.get(node, ()) + (allocation,)
        self._tally(allocation, 1)

    def remove(self, allocation: Allocation) -> None:
        """Forget the allocation (whatever object stands for its id)."""
        if allocation.id not in self._ids:
            return
        self._ids.discard(allocation.id)
        for node in allocation.node_names:
            kept = tuple(a for a in self._by_node.get(node, ()) if a.id != allocation.id)
            if kept:
                self._by_node[node] = kept
            else:
                self._by_node.pop(node, None)
        self._tally(allocation, -1)

    def _tally(self, allocation: Allocation, sign: int) -> None:
        key = allocation.team if allocation.funded else None
        pool = dict(self._gpus.get(allocation.pool, {}))
        for node, held in held_gpus(allocation):
            _count(pool, key, sign * held)
            on_node = dict(self._node_gpus.get(node, {}))
            _count(on_node, key, sign * held)
            self._node_gpus[node] = on_node
            self._totals[node] = gpu_totals(on_node)
        self._gpus[allocation.pool] = pool
        self._frozen = None

    def frozen(self) -> ExposedSessions:
        """The exposed sessions as they are now; later changes do not show in it."""
        if self._frozen is None:
            self._frozen = ExposedSessions(
                dict(self._by_node), dict(self._gpus), dict(self._node_gpus), dict(self._totals)
            )
        return self._frozen


def gpu_totals(held: Tally) -> tuple[int, int]:
    return (sum(held.values()), held.get(None, 0))


def _count(tally: dict[str | None, int], key: str | None, change: int) -> None:
    """Add ``change`` to a tally, dropping teams that come to hold nothing."""
    count = tally.get(key, 0) + change
    if count:
        tally[key] = count
    else:
        tally.pop(key, None)


@dataclass(frozen=True, init=False)
class ExposedSessions:
    """Sessions past their protected window: per node (any order), and GPU tallies."""

    by_node: Mapping[str, tuple[Allocation, ...]]
    gpus: Mapping[str, Tally]
    """Per pool."""
    node_gpus: Mapping[str, Tally]
    """Per node."""
    totals: Mapping[str, tuple[int, int]]
    """Per node: GPUs held by every exposed session, and by the unallocated ones."""

    def __init__(
        self,
        by_node: Mapping[str, tuple[Allocation, ...]],
        gpus: Mapping[str, Tally],
        node_gpus: Mapping[str, Tally],
        totals: Mapping[str, tuple[int, int]],
    ) -> None:
        # Written out: compiled, a generated __init__ runs interpreted (view.py).
        object.__setattr__(self, "by_node", by_node)
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "node_gpus", node_gpus)
        object.__setattr__(self, "totals", totals)


# -- the frozen view and the failed searches -----------------------------------


class CycleIndex:
    """What the scheduler keeps up to date between cycles, valid for a decision at ``at``.

    Read-only by contract, as the view that carries it: its containers are replaced by
    the scheduler, never changed. A plain class, not a frozen dataclass: one is made
    per cycle, and a frozen dataclass's generated ``__init__`` runs interpreted."""

    __slots__ = (
        "at",
        "layout",
        "whole",
        "protected",
        "exposed",
        "reach",
        "by_pool",
        "sliceable",
        "waiting",
        "queues",
        "growth",
        "growth_start",
        "growth_end",
        "searches",
    )

    def __init__(
        self,
        *,
        at: float,
        layout: Layout,
        whole: WholeBuckets,
        protected: Mapping[str, tuple[Allocation, ...]],
        exposed: ExposedSessions,
        reach: Mapping[str, int],
        by_pool: Mapping[str, tuple[Allocation, ...]],
        sliceable: tuple[Allocation, ...],
        waiting: frozenset[str] | None = None,
        queues: Mapping[str, Mapping[str, tuple[Queued, ...]]] | None = None,
        growth: Sequence[str] = (),
        growth_start: int = 0,
        growth_end: int = 0,
        searches: Mapping[SearchKey, int] | None = None,
    ) -> None:
        self.at = at
        self.layout = layout
        """The nodes of every pool (those of the view)."""
        self.whole = whole
        """Nodes by free whole GPUs, as in the view's ``free``."""
        self.protected = protected
        """Per pool, the funded allocations whose protected window ends after ``at``,
        in the order of the view's ``allocations``."""
        self.exposed = exposed
        """The allocations whose protected window (or grace) ended at or before ``at``."""
        self.reach = reach
        """Per node, free whole GPUs plus the GPUs the exposed sessions there hold."""
        self.by_pool = by_pool
        """Per pool, the view's ``allocations`` there, in the view's order."""
        self.sliceable = sliceable
        """The view's funded allocations that can be resumed (only they may be
        day-sliced, `DayUsage.slices_over`), in the view's order."""
        self.waiting = waiting
        """Every waiting request's id, if given (the view's ``queued``, or its
        ``pending`` ids where that is None)."""
        self.queues = queues
        """Per pool and team, the view's ``pending`` in queue order (`queue_key`);
        None: the policy sorts ``pending`` itself."""
        self.growth = growth
        """Nodes where room, eligibility or preemptible sessions may have grown, in the
        order it happened (the latest part of the scheduler's growth log)."""
        self.growth_start = growth_start
        """The log position of ``growth[0]``."""
        self.growth_end = growth_end
        """The log position at ``at``: entries from here on came later."""
        self.searches: Mapping[SearchKey, int] = (
            searches if searches is not None else MappingProxyType({})
        )
        """Victim searches known to have failed: (shape number, permitted teams) → the
        log position at which fewer nodes than the request needs could take it. Entries
        past ``growth_end`` are ignored."""

    def __repr__(self) -> str:
        return f"CycleIndex(at={self.at!r})"


_TOO_MANY: Final[list[str]] = []
"""`KnownFailures._of_pool`'s answer where the whole search is cheaper (never changed)."""


class KnownFailures:
    """Victim searches known to fail, carried from cycle to cycle (`CycleIndex.searches`).

    A search fails for want of nodes where the request could go once the
    permitted victims stop. A node gains that only if room, eligibility or
    victims grew there, so a search that failed keeps failing, for the same
    permitted teams, until some node that grew since then could take the
    request: checking those few nodes stands in for the whole search.
    """

    FOCUS_LIMIT = 64
    """More grown nodes than this and the whole search is cheaper. Each node is asked
    first what the search asks of it (`preemption.offers`, before it looks at the
    victims), a few look-ups for most: at 8, nine in ten checks on a saturated month
    (16 to 56 grown nodes) gave up and searched again, and nearly all of those searches
    failed."""
    REACH: ClassVar[int] = 32
    """A failure recorded more than this many log entries ago is not looked at."""

    def __init__(
        self, index: CycleIndex | None, free: dict[str, NodeFree], grown: Sequence[str]
    ) -> None:
        """``free`` and ``grown``: the cycle's `Capacity.free` and `Capacity.grown`, read
        as the cycle changes them (a dict: compiled, a dict's get is a direct call and a
        Mapping's a method call through Python, once per node a check looks at)."""
        self._free = free
        self._capacity_grown = grown
        self._earlier: Mapping[SearchKey, int] = index.searches if index is not None else {}
        self._log = index.growth if index is not None else ()
        self._start = index.growth_start if index is not None else 0
        self._end = index.growth_end if index is not None else 0
        self.grown: list[str] = []
        """Nodes this cycle made eligible again (holds dropped or released)."""
        self._here: dict[SearchKey, tuple[int, int]] = {}
        self._focus: dict[tuple[int, int, int, str], list[str]] = {}
        """Per failure stamp, log lengths and pool, the grown nodes a check looks at."""
        self.found: dict[SearchKey, int] = {}
        """Failures this cycle, as of the log position the cycle started at."""

    def fails(
        self, request: Request, key: SearchKey, could_take: Callable[[NodeFree], bool]
    ) -> bool:
        """Is the search for ``request`` (shape and permitted teams ``key``) known to fail?

        ``could_take``: could the node be one of the search's answers (`offers`)."""
        grown = self._capacity_grown
        here = self._here.get(key)
        if here is not None:
            if here[0] == len(self.grown) and here[1] == len(grown):
                return True  # failed this cycle, and nothing has grown since
            focus = set(self.grown[here[0] :])
            focus.update(grown[here[1] :])
            names = self._of_pool(focus, request.pool)
        else:
            stamp = self._earlier.get(key)
            if stamp is None or not self._start <= stamp <= self._end:
                return False
            if self._end - stamp > self.REACH:
                return False
            # Searches of many kinds failed at the same stamp: their grown nodes are the
            # same, found once per pool while nothing grows in this cycle.
            slot = (stamp, len(self.grown), len(grown), request.pool)
            found = self._focus.get(slot)
            if found is None:
                focus = set(self._log[stamp - self._start : self._end - self._start])
                focus.update(self.grown)
                focus.update(grown)
                found = self._focus[slot] = self._of_pool(focus, request.pool)
            names = found
        if names is _TOO_MANY:
            return False
        free = self._free
        for name in names:
            if could_take(free[name]):
                return False
        return True

    def _of_pool(self, focus: set[str], pool: str) -> list[str]:
        """The nodes of ``focus`` in the pool, in the order a check looks at them;
        `_TOO_MANY` if ``focus`` holds more than `FOCUS_LIMIT` nodes."""
        if len(focus) > self.FOCUS_LIMIT:
            return _TOO_MANY
        free = self._free
        out: list[str] = []
        for name in focus:
            node_free = free.get(name)
            if node_free is not None and node_free.node.pool == pool:
                out.append(name)
        return out

    def failed(self, key: SearchKey) -> None:
        """The search for ``key`` fails now (for want of nodes)."""
        self._here[key] = (len(self.grown), len(self._capacity_grown))
        self.found[key] = self._end


# -- the scheduler's part --------------------------------------------------------


class _Grouped:
    """Allocations per group (a pool), each group in the order they were added; `frozen`
    hands out tuples, made again only for the groups that changed since."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, Allocation]] = {}
        self._dirty: set[str] = set()
        self._tuples: dict[str, tuple[Allocation, ...]] = {}
        """The groups as handed out last (replaced, never changed once handed out)."""
        self._frozen: Mapping[str, tuple[Allocation, ...]] = MappingProxyType(self._tuples)

    def add(self, group: str, allocation: Allocation) -> None:
        self._groups.setdefault(group, {})[allocation.id] = allocation
        self._dirty.add(group)

    def remove(self, group: str, allocation: Allocation) -> None:
        found = self._groups.get(group)
        if found is not None and found.pop(allocation.id, None) is not None:
            self._dirty.add(group)

    def frozen(self) -> Mapping[str, tuple[Allocation, ...]]:
        if self._dirty:
            groups = self._tuples.copy()  # a dict's copy: a proxy's would go key by key
            for group in self._dirty:
                groups[group] = tuple(self._groups.get(group, {}).values())
            self._dirty.clear()
            self._tuples = groups
            self._frozen = MappingProxyType(groups)
        return self._frozen


class Kept:
    """The scheduler's working data between cycles, brought up to date event by event.

    Only the scheduler changes it, through these methods, as requests are
    queued and sessions are booked and released; `index` hands a cycle the
    read-only `CycleIndex` of it. ``free`` and ``funded_rates`` are for reading.
    """

    GROWTH_KEPT: ClassVar[int] = KnownFailures.REACH
    """Entries of the growth log a cycle may need (see `KnownFailures`)."""

    def __init__(
        self, settings: Settings, pools: Mapping[str, Pool], nodes: Iterable[Node]
    ) -> None:
        self._settings = settings
        self._pools = pools
        nodes = tuple(nodes)
        self.free: dict[str, NodeFree] = {node.name: NodeFree(node) for node in nodes}
        """What is free on each node with every booked session taken. An entry is
        replaced, never changed, so a view's copy of the dict stays as it was."""
        self.funded_rates: dict[tuple[str, str], float] = {}
        """Per (team, pool), the charge rate of its running funded sessions."""
        self._layout = Layout.of(nodes)
        self._queues: dict[tuple[str, str], tuple[list[QueueKey], list[Queued]]] = {}
        """(pool, team) → sort keys and entries of its waiting requests, in queue order."""
        self._queue_view: dict[str, dict[str, tuple[Queued, ...]]] = {}
        self._queue_frozen: Mapping[str, Mapping[str, tuple[Queued, ...]]] | None = None
        """The last read-only copy `_queue_all` handed out, good while nothing is dirty."""
        self._queue_dirty: set[tuple[str, str]] = set()
        self._queued: dict[str, tuple[QueueKey, Queued]] = {}
        """Request id → its sort key and entry in ``_queues``."""
        self._waiting: frozenset[str] | None = None
        """The ids of ``_queued``, made again only after the queue changed."""
        self._protected: dict[str, dict[str, Allocation]] = {}
        """Per pool, funded sessions whose protected window ends after ``_indexed_at``,
        in start order."""
        self._booked = _Grouped()
        """Per pool, every booked session, in booking order (the running dict's)."""
        self._sliceable = _Grouped()
        """The booked funded sessions that can be resumed, in booking order (one group)."""
        self._protected_view: dict[str, tuple[Allocation, ...]] = {}
        self._protected_dirty: set[str] = set()
        self._searches_view: Mapping[SearchKey, int] = MappingProxyType({})
        self._free_view: Mapping[str, NodeFree] | None = None
        self._rates_view: Mapping[tuple[str, str], float] | None = None
        self._whole = WholeIndex(self.free)
        self._reach = {name: self._whole.count(name) for name in self.free}
        self._reach_view = dict(self._reach)
        self._reach_dirty: set[str] = set()
        self._exposed = ExposedIndex()
        """Sessions whose protected window (or grace) ended at or before ``_indexed_at``."""
        self._unexposed: list[tuple[float, int, Allocation]] = []
        self._sequence = itertools.count()
        self._indexed_at = -float("inf")
        self._growth: list[str] = []
        """Nodes where room, eligibility or exposed sessions grew, in order (see
        `CycleIndex.growth`); position ``_growth_start`` is its first entry."""
        self._growth_start = 0
        self._searches: dict[SearchKey, int] = {}
        """Victim searches known to have failed (see `CycleIndex.searches`)."""
        self._window: WindowUsage | None = None

    # -- the queue ---------------------------------------------------------------

    def enqueue(self, request: Request) -> None:
        """``request`` waits: it takes its place in its team's queue."""
        slot = (request.pool, request.team)
        keys, entries = self._queues.setdefault(slot, ([], []))
        key = queue_key(request)
        at = bisect_left(keys, key)
        entry = Queued.of(request, self._settings, self._pools[request.pool].kind)
        keys.insert(at, key)
        entries.insert(at, entry)
        self._queued[request.id] = (key, entry)
        self._waiting = None
        self._queue_dirty.add(slot)

    def dequeue(self, request: Request) -> None:
        """``request`` waits no more (it was admitted or cancelled)."""
        slot = (request.pool, request.team)
        keys, entries = self._queues[slot]
        at = bisect_left(keys, queue_key(request))
        assert entries[at].request.id == request.id
        del keys[at]
        del entries[at]
        del self._queued[request.id]
        self._waiting = None
        if not keys:
            del self._queues[slot]
        self._queue_dirty.add(slot)

    # -- sessions and nodes ------------------------------------------------------

    def book(self, allocation: Allocation) -> None:
        """``allocation`` runs: its slices are taken, its funded rate counted."""
        self._booked.add(allocation.pool, allocation)
        self._free_view = None
        if allocation.funded:
            self._rates_view = None
            key = (allocation.team, allocation.pool)
            self.funded_rates[key] = self.funded_rates.get(key, 0.0) + allocation.charge_rate
            if allocation.request.resumable:
                self._sliceable.add("", allocation)
        for grant in allocation.grants:
            free = self.free[grant.node].copy()
            free.take(grant)
            self.free[grant.node] = free
            self._whole.update(free)
            self._reach_dirty.add(grant.node)
        if allocation.protected_until <= self._indexed_at and allocation.start < self._indexed_at:
            self._exposed.add(allocation)
            self._growth.extend(allocation.node_names)
        else:
            if allocation.protected_until > self._indexed_at and allocation.funded:
                self._protected.setdefault(allocation.pool, {})[allocation.id] = allocation
                self._protected_dirty.add(allocation.pool)
            # Nothing is a victim in the instant it started (`Victims.permits`): a session
            # with no protection is exposed, and its nodes logged as grown, only once
            # the clock has moved past its start, so searches that failed without it
            # are looked at again.
            exposed_at = max(allocation.protected_until, math.nextafter(allocation.start, math.inf))
            entry = (exposed_at, next(self._sequence), allocation)
            heapq.heappush(self._unexposed, entry)

    def release(self, allocation: Allocation) -> None:
        """``allocation`` runs no more: its slices are free again."""
        self._booked.remove(allocation.pool, allocation)
        self._sliceable.remove("", allocation)
        self._free_view = None
        if allocation.funded:
            self._rates_view = None
        if self._protected.get(allocation.pool, {}).pop(allocation.id, None) is not None:
            self._protected_dirty.add(allocation.pool)
        self._exposed.remove(allocation)
        self._growth.extend(allocation.node_names)
        for grant in allocation.grants:
            free = self.free[grant.node].copy()
            free.give(grant)
            self.free[grant.node] = free
            self._whole.update(free)
            self._reach_dirty.add(grant.node)
        if allocation.funded:
            key = (allocation.team, allocation.pool)
            left = self.funded_rates.get(key, 0.0) - allocation.charge_rate
            if left > 1e-9:
                self.funded_rates[key] = left
            else:
                self.funded_rates.pop(key, None)

    def node_changed(self, node: Node) -> None:
        """The node (same name, same GPUs) changed, e.g. its health."""
        free = self.free[node.name].copy()
        free.node = node
        self.free[node.name] = free
        self._free_view = None
        self._growth.append(node.name)

    def holds_ended(
        self, before: Mapping[str, tuple[str, ...]], after: Mapping[str, tuple[str, ...]]
    ) -> None:
        """A cycle replaced the holds ``before`` with ``after``: nodes no longer held grew."""
        kept = {node for nodes in after.values() for node in nodes}
        for nodes in before.values():
            self._growth.extend(node for node in nodes if node not in kept)

    def searches_failed(self, searches: Mapping[SearchKey, int]) -> None:
        """Record a cycle's failed victim searches; forget what no cycle can use any more."""
        known = self._searches
        # The copy a cycle reads is made again only where the failures change: most
        # cycles find again the ones already recorded, at the same log positions.
        if searches and any(known.get(key) != at for key, at in searches.items()):
            known.update(searches)
            self._searches_view = MappingProxyType(dict(known))
        if len(self._growth) > 4 * self.GROWTH_KEPT:
            drop = len(self._growth) - self.GROWTH_KEPT
            del self._growth[:drop]
            self._growth_start += drop
        if len(known) > 64:
            # Failures recorded before the log entries a cycle looks at are no use.
            oldest = self._growth_start + len(self._growth) - self.GROWTH_KEPT
            if any(at < oldest for at in known.values()):
                self._searches = {k: at for k, at in known.items() if at >= oldest}
                self._searches_view = MappingProxyType(dict(self._searches))

    # -- what a cycle reads ----------------------------------------------------------

    def waiting(self) -> frozenset[str]:
        """The ids of every waiting request, as they are now."""
        found = self._waiting
        if found is None:
            found = self._waiting = frozenset(self._queued)
        return found

    def free_view(self) -> Mapping[str, NodeFree]:
        """A read-only copy of ``free`` as it is now, made again only after a change."""
        found = self._free_view
        if found is None:
            found = self._free_view = MappingProxyType(self.free.copy())
        return found

    def rates_view(self) -> Mapping[tuple[str, str], float]:
        """A read-only copy of ``funded_rates`` as they are now (see `free_view`)."""
        found = self._rates_view
        if found is None:
            found = self._rates_view = MappingProxyType(self.funded_rates.copy())
        return found

    def usage(self, ledger: UsageLedger, start: float, now: float) -> WindowUsage:
        """The ledger's usage from ``start`` to ``now``, read again only if it can differ."""
        usage = self._window
        if (
            usage is None
            or usage.end != now
            or usage.start != start
            or usage.revision != ledger.revision
        ):
            # Charges change only from now on, so a window ending now stays as it is.
            usage = self._window = ledger.window(start, now)
        return usage

    def index(
        self,
        now: float,
        running: Mapping[str, Allocation],
        scope: Iterable[Request] | None = None,
    ) -> CycleIndex | None:
        """The frozen view for a decision at ``now`` (``running``: the sessions booked,
        by id), with the queues of ``scope`` only, if given; None if the data is
        already past ``now``."""
        if now < self._indexed_at:
            return None
        unexposed = self._unexposed
        while unexposed and unexposed[0][0] <= now:
            _, _, allocation = heapq.heappop(unexposed)
            if running.get(allocation.id) is allocation:
                if self._protected.get(allocation.pool, {}).pop(allocation.id, None) is not None:
                    self._protected_dirty.add(allocation.pool)
                self._exposed.add(allocation)
                self._reach_dirty.update(allocation.node_names)
                self._growth.extend(allocation.node_names)
        self._indexed_at = now
        # What a cycle gets is replaced, never changed, when it changes: the views handed
        # to earlier cycles stay as they were, and an unchanged one costs nothing.
        if self._reach_dirty:
            for name in self._reach_dirty:
                self._reach[name] = self._whole.count(name) + self._exposed.held(name)
            self._reach_dirty.clear()
            self._reach_view = dict(self._reach)
        if self._protected_dirty:
            protected = dict(self._protected_view)
            for pool in self._protected_dirty:
                protected[pool] = tuple(self._protected.get(pool, {}).values())
            self._protected_dirty.clear()
            self._protected_view = protected
        return CycleIndex(
            at=now,
            layout=self._layout,
            whole=self._whole.frozen(),
            protected=self._protected_view,
            exposed=self._exposed.frozen(),
            reach=self._reach_view,
            growth=tuple(self._growth[-self.GROWTH_KEPT :]),
            growth_start=self._growth_start + max(0, len(self._growth) - self.GROWTH_KEPT),
            growth_end=self._growth_start + len(self._growth),
            searches=self._searches_view,
            by_pool=self._booked.frozen(),
            sliceable=self._sliceable.frozen().get("", ()),
            waiting=self.waiting(),
            queues=self._queue_all() if scope is None else self._queue_subset(scope),
        )

    def _queue_all(self) -> Mapping[str, Mapping[str, tuple[Queued, ...]]]:
        frozen = self._queue_frozen
        if frozen is not None and not self._queue_dirty:
            return frozen
        view = self._queue_view
        for pool, team in self._queue_dirty:
            entries = self._queues.get((pool, team))
            teams = dict(view.get(pool, {}))
            if entries is None or not entries[1]:
                teams.pop(team, None)
            else:
                teams[team] = tuple(entries[1])
            if teams:
                view[pool] = teams
            else:
                view.pop(pool, None)
        self._queue_dirty.clear()
        frozen = MappingProxyType({pool: MappingProxyType(teams) for pool, teams in view.items()})
        self._queue_frozen = frozen
        return frozen

    def _queue_subset(
        self, requests: Iterable[Request]
    ) -> Mapping[str, Mapping[str, tuple[Queued, ...]]]:
        """The queues of ``requests`` (waiting ones) alone, in queue order."""
        found: dict[tuple[str, str], list[tuple[QueueKey, Queued]]] = {}
        queued = self._queued
        for request in requests:
            pair = queued[request.id]
            slot = (request.pool, request.team)
            group = found.get(slot)
            if group is None:
                found[slot] = [pair]
            else:
                group.append(pair)
        out: dict[str, dict[str, tuple[Queued, ...]]] = {}
        for (pool, team), pairs in found.items():
            if len(pairs) > 1:
                # The keys end with the request id, so no two are equal and the entries
                # are never compared: sorted as by the key alone, with no key function.
                pairs.sort()
            out.setdefault(pool, {})[team] = tuple(entry for _, entry in pairs)
        return out
