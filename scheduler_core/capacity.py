"""Free capacity during one cycle, with what-if operations that can be undone.

`Capacity` is built from a view's nodes and allocations (or from the
`NodeFree` records the scheduler keeps, copied node by node on first change);
the policy takes and gives back grants on it as it decides. Placement follows
R3 of the scheduling contract (docs/architecture.md): free slices first,
best fit by default, whole nodes kept free for whole-node requests (nodes are
indexed by their count of free whole GPUs, so best fit is a walk up that index
rather than a scan of every node), fractional GPUs packed onto GPUs already
shared before a fresh GPU is broken.

A search scores each candidate node without building its slices; only the
winner's slices are made, since most nodes a search looks at lose. Of equally
tight nodes the first tried wins, so the order within an index bucket matters:
it starts as name order (the scheduler's kept `WholeIndex` is name-ordered, as a
fresh build would be) and a node that moves goes to the back, also when a
multi-node placement fails (`_as_if_taken_and_given` leaves exactly what taking
and giving back each part would, without doing it). Nothing here outlives the
cycle: what is kept between cycles is in kept.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from scheduler_core.kept import Layout, WholeBuckets
from scheduler_core.model import MILLI, Allocation, Health, Node, NodeGrant, Request, Slice
from scheduler_core.nodefree import NodeFree, Tightness
from scheduler_core.settings import PlacementStrategy

Bucket = dict[str, None] | tuple[str, ...]
"""Node names with one count of free whole GPUs, in order."""

_K = TypeVar("_K")
_V = TypeVar("_V")

_EPS: Final = 1e-9
_READY: Final = Health.READY


def copied(mapping: Mapping[_K, _V]) -> dict[_K, _V]:
    """A dict copy of ``mapping``: a read-only proxy's dict is copied whole, where
    ``dict(proxy)`` would go key by key (a cycle copies every node's entry)."""
    if isinstance(mapping, dict):
        return mapping.copy()
    if isinstance(mapping, MappingProxyType):
        return mapping.copy()
    return dict(mapping)


_MATCHED: Final[dict[tuple[int, int], tuple[Mapping[str, str], Mapping[str, str], bool]]] = {}
"""`labels_match`'s answers for read-only labels (a request's and a node's, which
`model.frozen_labels` makes and nothing changes), by the two objects' identities: each
search asks it again of every node for every request that names labels. The objects
are kept with the answer, so an identity is never taken for another object's."""


def labels_match(wanted: Mapping[str, str], have: Mapping[str, str]) -> bool:
    if not wanted:
        return True  # most requests name no label: no generator, no method calls
    if not (isinstance(wanted, MappingProxyType) and isinstance(have, MappingProxyType)):
        return all(have.get(k) == v for k, v in wanted.items())
    key = (id(wanted), id(have))
    found = _MATCHED.get(key)
    if found is not None and found[0] is wanted and found[1] is have:
        return found[2]
    matched = all(have.get(k) == v for k, v in wanted.items())
    if len(_MATCHED) >= 65_536:
        _MATCHED.clear()
    _MATCHED[key] = (wanted, have, matched)
    return matched


def could_hold(node: Node, request: Request) -> bool:
    """Could the node hold the request's per-node part when empty (health aside)?"""
    if node.pool != request.pool or not labels_match(request.labels, node.labels):
        return False
    if node.cpus < request.cpus or node.memory_gib < request.memory_gib:
        return False
    if request.mig is not None:
        return any(inst.profile == request.mig for gpu in node.gpus for inst in gpu.mig)
    if request.gpu_milli:
        return bool(node.whole_gpus)
    return len(node.whole_gpus) >= request.gpus


def open_to(node: Node, request: Request, reserved: Mapping[str, str]) -> bool:
    """May new work for ``request`` land on the node at all: ready, not held for another
    request (``reserved``: node name → the request id holding it), with the labels
    asked for? The one node-eligibility test of every search here."""
    if node.health is not _READY:
        return False
    if reserved:
        holder = reserved.get(node.name)
        if holder is not None and holder != request.id:
            return False
    labels = request.labels
    return not labels or labels_match(labels, node.labels)


class Capacity:
    """Free capacity of every node, indexed for placement, for one cycle.

    Nodes of each pool sit in buckets by their count of free whole GPUs, so a
    best fit for k GPUs looks at the smallest bucket >= k that has a node where
    the request fits, instead of at every node.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        allocations: Iterable[Allocation],
        base: Mapping[str, NodeFree] | None = None,
        layout: Layout | None = None,
        whole: WholeBuckets | None = None,
    ) -> None:
        """Free capacity of ``nodes`` with ``allocations`` running.

        ``base``, when given, is what is free with those allocations already
        taken (kept up to date by the scheduler between cycles); it is copied
        node by node on first change, never changed itself. ``layout``, when
        given, must describe the same nodes, and ``whole`` (used only with
        ``base``) the same free whole GPUs as ``base``.
        """
        self.touched: list[str] = []
        """Nodes changed by take and give, in order (so searches may keep answers up to date)."""
        self.grown: list[str] = []
        """Nodes where something may have been given back, in order (room can only
        have grown there)."""
        self._owned: set[str] = set()
        self._buckets: dict[str, list[Bucket]] = {}
        """Per pool, node names by free whole GPUs (a tuple until changed: `_bucket`);
        built on first use."""
        self._bucket_of: dict[str, int] = {}
        """Node name → its bucket, where changed this cycle or built here; else in
        ``_base_counts``, the kept index's counts of its pool."""
        self._base_counts: dict[str, Mapping[str, int]] = {}
        if base is None:
            self.free: dict[str, NodeFree] = {n.name: NodeFree(n) for n in nodes}
            self._owned.update(self.free)
            for allocation in allocations:
                self.take(allocation.grants)
        else:
            self.free = copied(base)
        self._whole = whole if base is not None else None
        self.reserved: dict[str, str] = {}
        """Node name → the request id it is held for."""
        if layout is None:
            layout = Layout.of(nf.node for nf in self.free.values())
        self._by_pool = layout.by_pool
        self._mig_by_pool = layout.mig_by_pool

    def _pool_buckets(self, pool: str) -> list[Bucket] | None:
        """The pool's nodes by free whole GPUs, built on first use in the cycle."""
        buckets = self._buckets.get(pool)
        if buckets is None:
            members = self._by_pool.get(pool)
            if not members:
                return None
            whole = self._whole
            if whole is not None and pool in whole.names:
                free = self.free
                if not any(free[name].node.pool == pool for name in self.touched):
                    # Nothing in the pool changed yet: the kept index is this one.
                    # Each bucket stays the kept index's tuple until this cycle changes it.
                    buckets = self._buckets[pool] = list(whole.names[pool])
                    self._base_counts[pool] = whole.counts[pool]  # read, never changed
                    return buckets
            free = self.free
            size = max(len(free[n].node.gpus) for n in members) + 1
            built: list[dict[str, None]] = [{} for _ in range(size)]
            bucket_of = self._bucket_of
            for name in members:
                count = len(free[name].whole)
                built[count][name] = None
                bucket_of[name] = count
            buckets = self._buckets[pool] = list(built)
        return buckets

    @staticmethod
    def _bucket(buckets: list[Bucket], count: int) -> dict[str, None]:
        """The bucket of ``count`` free whole GPUs, as a dict this cycle may change."""
        bucket = buckets[count]
        if isinstance(bucket, dict):
            return bucket
        found = buckets[count] = dict.fromkeys(bucket)
        return found

    def _own(self, name: str) -> NodeFree:
        if name not in self._owned:
            self.free[name] = self.free[name].copy()
            self._owned.add(name)
        return self.free[name]

    def _index(self, node_free: NodeFree) -> None:
        name = node_free.node.name
        buckets = self._buckets.get(node_free.node.pool)
        if buckets is None:
            return
        old = self._bucket_of.get(name)
        if old is None:
            base = self._base_counts.get(node_free.node.pool)
            if base is not None:
                old = base.get(name)
        new = len(node_free.whole)
        if old == new:
            return
        if old is not None:
            del self._bucket(buckets, old)[name]
        self._bucket(buckets, new)[name] = None
        self._bucket_of[name] = new

    def free_whole_total(self, pool: str) -> int:
        """Free whole GPUs in the pool, on any node."""
        buckets = self._pool_buckets(pool) or []
        return sum(k * len(bucket) for k, bucket in enumerate(buckets))

    def free_whole_nodes(self, pool: str, at_least: int) -> Iterator[NodeFree]:
        """Nodes of the pool with at least ``at_least`` free whole GPUs (``at_least`` >= 1)."""
        buckets = self._pool_buckets(pool) or []
        free = self.free
        for k in range(at_least, len(buckets)):
            for name in buckets[k]:
                yield free[name]

    def pool_names(self, pool: str) -> tuple[str, ...]:
        """The pool's node names, in name order."""
        return self._by_pool.get(pool, ())

    def pool_nodes(self, pool: str) -> list[NodeFree]:
        free = self.free
        return [free[name] for name in self._by_pool.get(pool, ())]

    def eligible(self, node_free: NodeFree, request: Request) -> bool:
        """May new work for ``request`` land on this node at all (health, labels, holds)?"""
        return open_to(node_free.node, request, self.reserved)

    def best(
        self,
        request: Request,
        strategy: PlacementStrategy,
        exclude: frozenset[str] = frozenset(),
        backfill: bool = False,
    ) -> tuple[NodeFree, tuple[Slice, ...]] | None:
        """The best node for the request now, or None.

        With bucketed best/worst fit, the first bucket holding a fitting node
        decides: nodes in later buckets fit less tightly (or more, for worst fit).
        Of equally tight nodes, the first tried wins.
        """
        first_fit = strategy is PlacementStrategy.FIRST_FIT
        worst = strategy is PlacementStrategy.WORST_FIT
        reserved: Mapping[str, str] = {} if backfill else self.reserved
        pick: NodeFree | None = None
        pick_key: Tightness = ()
        for group in self._groups(request, strategy):
            for node_free in group:
                if node_free.node.name in exclude or not open_to(node_free.node, request, reserved):
                    continue
                key = node_free.tightness(request)
                if key is None:
                    continue
                if first_fit:
                    pick = node_free
                    break
                if pick is None or (key > pick_key if worst else key < pick_key):
                    pick, pick_key = node_free, key
            if pick is not None:
                break
        if pick is None:
            return None
        slices = pick.slices_for(request)
        assert slices is not None
        return pick, slices

    def _groups(
        self, request: Request, strategy: PlacementStrategy
    ) -> Iterator[Iterable[NodeFree]]:
        """Groups of nodes to try in turn; a later group never fits better."""
        pool = request.pool
        free = self.free
        # Built here whatever the request, so that the index keeps one order of nodes.
        buckets = self._pool_buckets(pool)
        if request.mig is not None:
            # Only nodes with MIG instances can hold a MIG slice; order as in the pool.
            yield (free[name] for name in self._mig_by_pool.get(pool, ()))
            return
        whole_only = request.gpus or request.gpu_milli
        if buckets is None or strategy is PlacementStrategy.FIRST_FIT or not whole_only:
            yield (free[name] for name in self._by_pool.get(pool, ()))
            return
        if request.gpu_milli:
            shared = [nf for nf in self.pool_nodes(pool) if nf.shared]
            if shared:
                yield shared
            low = 1
        else:
            low = request.gpus
        order = range(low, len(buckets))
        if strategy is PlacementStrategy.WORST_FIT:
            order = range(len(buckets) - 1, low - 1, -1)
        for k in order:
            bucket = buckets[k]
            if bucket:
                yield [free[name] for name in bucket]

    def place(
        self, request: Request, strategy: PlacementStrategy, backfill: bool = False
    ) -> tuple[NodeGrant, ...] | None:
        """Grants for the request on free slices (taken from capacity), or None;
        ``backfill``: held nodes count as free too."""
        if request.nodes == 1:
            found = self.best(request, strategy, backfill=backfill)
            if found is None:
                return None
            node_free, slices = found
            grant = NodeGrant(node_free.node.name, slices, request.cpus, request.memory_gib)
            self.take((grant,))
            return (grant,)
        # Nodes are taken one at a time, each the best of those not yet taken; a
        # node's fit does not depend on what lands elsewhere, so the picks can be
        # listed first and only then taken (or, if too few, not taken at all).
        picks = self._picks(request, strategy, backfill)
        if len(picks) < request.nodes:
            self._as_if_taken_and_given(request, picks)
            return None
        grants: list[NodeGrant] = []
        for name in picks:
            pieces = self.free[name].slices_for(request)
            assert pieces is not None
            grant = NodeGrant(name, pieces, request.cpus, request.memory_gib)
            self.take((grant,))
            grants.append(grant)
        return tuple(grants)

    def _picks(
        self, request: Request, strategy: PlacementStrategy, backfill: bool = False
    ) -> list[str]:
        """The nodes `best` would pick in turn for a multi-node request (at most ``nodes``)."""
        first_fit = strategy is PlacementStrategy.FIRST_FIT
        worst = strategy is PlacementStrategy.WORST_FIT
        reserved: Mapping[str, str] = {} if backfill else self.reserved
        need = request.nodes
        picks: dict[str, None] = {}
        for group in self._groups(request, strategy):
            fitting: list[tuple[Tightness, str]] = []
            for node_free in group:
                name = node_free.node.name
                if name in picks or not open_to(node_free.node, request, reserved):
                    continue
                key = node_free.tightness(request)
                if key is None:
                    continue
                if first_fit:
                    picks[name] = None
                    if len(picks) == need:
                        return list(picks)
                else:
                    fitting.append((key, name))
            # Stable: of equally tight nodes, the first tried goes first, as in `best`.
            fitting.sort(key=lambda item: item[0], reverse=worst)
            for _, name in fitting:
                picks[name] = None
                if len(picks) == need:
                    return list(picks)
        return list(picks)

    def _as_if_taken_and_given(self, request: Request, names: list[str]) -> None:
        """Leave the nodes as taking the request's part on each, then giving it all
        back, would: same free slices, but each node goes to the back of its bucket,
        a MIG instance to the back of its list, and CPUs and memory through the
        same float arithmetic."""
        for name in names:
            node_free = self._own(name)
            self.touched.append(name)
            self.grown.append(name)
            taken = 0
            if request.mig is not None:
                free = node_free.mig[request.mig]
                free.append(free.pop(0))
            elif request.gpu_milli:
                need = request.gpu_milli
                if not any(used + need <= MILLI for used in node_free.shared.values()):
                    taken = 1
            else:
                taken = request.gpus
            if taken and not node_free._in_order:
                # Whole GPUs come back in index order, as `NodeFree.give` puts them.
                gpus = node_free.whole[:taken]
                del node_free.whole[:taken]
                for gpu in gpus:
                    node_free._add_whole(gpu.uuid)
            node_free.cpus -= request.cpus
            node_free.cpus += request.cpus
            node_free.memory_gib -= request.memory_gib
            node_free.memory_gib += request.memory_gib
            buckets = self._buckets.get(node_free.node.pool)
            if taken and buckets is not None:
                bucket = self._bucket(buckets, len(node_free.whole))
                del bucket[name]
                bucket[name] = None

    def take(self, grants: Iterable[NodeGrant]) -> None:
        for grant in grants:
            if grant.node not in self.free:
                continue
            self.touched.append(grant.node)
            node_free = self._own(grant.node)
            node_free.take(grant)
            self._index(node_free)

    def give(self, grants: Iterable[NodeGrant]) -> None:
        for grant in grants:
            if grant.node not in self.free:
                continue
            self.touched.append(grant.node)
            self.grown.append(grant.node)
            node_free = self._own(grant.node)
            node_free.give(grant)
            self._index(node_free)
