"""Free capacity during one cycle, with what-if operations that can be undone.

`Capacity` is built from a snapshot's nodes and allocations; the policy takes
and gives back grants on it as it decides. Placement follows DESIGN.md §4 rule
3: free slices first, best fit by default, whole nodes kept free for whole-node
requests (nodes are indexed by their count of free whole GPUs, so best fit is a
walk up that index rather than a scan of every node), fractional GPUs packed
onto GPUs already shared before a fresh GPU is broken.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from scheduler_core.model import (
    MILLI,
    Allocation,
    Gpu,
    Health,
    MigInstance,
    Node,
    NodeGrant,
    Request,
    Slice,
    SliceKind,
)
from scheduler_core.settings import PlacementStrategy

_EPS = 1e-9


class NodeFree:
    """What is still free on one node."""

    __slots__ = ("node", "cpus", "memory_gib", "whole", "shared", "mig", "_gpus")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.cpus = node.cpus
        self.memory_gib = node.memory_gib
        self.whole: list[Gpu] = [g for g in node.gpus if not g.mig]
        self.shared: dict[str, int] = {}
        """Milli-GPUs in use on GPUs that hold fractional sessions."""
        self.mig: dict[str, list[tuple[str, MigInstance]]] = {}
        for gpu in node.gpus:
            for inst in gpu.mig:
                self.mig.setdefault(inst.profile, []).append((gpu.uuid, inst))
        self._gpus = {g.uuid: g for g in node.gpus}

    def copy(self) -> NodeFree:
        clone = NodeFree.__new__(NodeFree)
        clone.node = self.node
        clone.cpus = self.cpus
        clone.memory_gib = self.memory_gib
        clone.whole = list(self.whole)
        clone.shared = dict(self.shared)
        clone.mig = {k: list(v) for k, v in self.mig.items()}
        clone._gpus = self._gpus
        return clone

    @property
    def free_whole(self) -> int:
        return len(self.whole)

    def slices_for(self, request: Request) -> tuple[Slice, ...] | None:
        """The slices this node would give the request now, or None if it does not fit."""
        if request.cpus > self.cpus + _EPS or request.memory_gib > self.memory_gib + _EPS:
            return None
        if request.mig is not None:
            free = self.mig.get(request.mig)
            if not free:
                return None
            gpu_uuid, inst = free[0]
            return (Slice(gpu_uuid, SliceKind.MIG, MILLI, inst.uuid, inst.profile),)
        if request.gpu_milli:
            need = request.gpu_milli
            best: str | None = None
            best_used = -1
            for gpu_uuid, used in self.shared.items():
                if used + need <= MILLI and used > best_used:
                    best, best_used = gpu_uuid, used
            if best is None:
                if not self.whole:
                    return None
                best = self.whole[0].uuid
            return (Slice(best, SliceKind.FRACTION, need),)
        if request.gpus > len(self.whole):
            return None
        return tuple(Slice(g.uuid, SliceKind.WHOLE) for g in self.whole[: request.gpus])

    def take(self, grant: NodeGrant) -> None:
        self.cpus -= grant.cpus
        self.memory_gib -= grant.memory_gib
        for piece in grant.slices:
            if piece.kind is SliceKind.MIG:
                free = self.mig[piece.mig_profile or ""]
                free[:] = [(g, i) for g, i in free if i.uuid != piece.mig_uuid]
            elif piece.kind is SliceKind.FRACTION:
                if piece.gpu_uuid not in self.shared:
                    self._remove_whole(piece.gpu_uuid)
                    self.shared[piece.gpu_uuid] = 0
                self.shared[piece.gpu_uuid] += piece.milli
            else:
                self._remove_whole(piece.gpu_uuid)

    def give(self, grant: NodeGrant) -> None:
        self.cpus += grant.cpus
        self.memory_gib += grant.memory_gib
        for piece in grant.slices:
            if piece.kind is SliceKind.MIG:
                gpu = self._gpus[piece.gpu_uuid]
                inst = next(i for i in gpu.mig if i.uuid == piece.mig_uuid)
                self.mig.setdefault(inst.profile, []).append((gpu.uuid, inst))
            elif piece.kind is SliceKind.FRACTION:
                left = self.shared[piece.gpu_uuid] - piece.milli
                if left <= 0:
                    del self.shared[piece.gpu_uuid]
                    self._add_whole(piece.gpu_uuid)
                else:
                    self.shared[piece.gpu_uuid] = left
            else:
                self._add_whole(piece.gpu_uuid)

    def _remove_whole(self, gpu_uuid: str) -> None:
        for i, gpu in enumerate(self.whole):
            if gpu.uuid == gpu_uuid:
                del self.whole[i]
                return
        raise ValueError(f"GPU {gpu_uuid} on {self.node.name} is not free")

    def _add_whole(self, gpu_uuid: str) -> None:
        gpu = self._gpus[gpu_uuid]
        at = len(self.whole)
        while at > 0 and self.whole[at - 1].index > gpu.index:
            at -= 1
        self.whole.insert(at, gpu)


def labels_match(wanted: Mapping[str, str], have: Mapping[str, str]) -> bool:
    return all(have.get(k) == v for k, v in wanted.items())


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
    ) -> None:
        """Free capacity of ``nodes`` with ``allocations`` running.

        ``base``, when given, is what is free with those allocations already
        taken (kept up to date by the scheduler between cycles); it is copied
        node by node on first change, never changed itself.
        """
        self._owned: set[str] = set()
        self._buckets: dict[str, list[dict[str, None]]] = {}
        """Per pool, node names by free whole GPUs; built on first use."""
        self._bucket_of: dict[str, int] = {}
        if base is None:
            self.free: dict[str, NodeFree] = {n.name: NodeFree(n) for n in nodes}
            self._owned.update(self.free)
            for allocation in allocations:
                self.take(allocation.grants)
        else:
            self.free = dict(base)
        self.reserved: dict[str, str] = {}
        """Node name → the request id it is held for."""
        self._by_pool: dict[str, list[str]] = {}
        for name in sorted(self.free):
            self._by_pool.setdefault(self.free[name].node.pool, []).append(name)

    def _pool_buckets(self, pool: str) -> list[dict[str, None]] | None:
        """The pool's nodes by free whole GPUs, built on first use in the cycle."""
        buckets = self._buckets.get(pool)
        if buckets is None:
            members = self._by_pool.get(pool)
            if not members:
                return None
            size = max(len(self.free[n].node.gpus) for n in members) + 1
            buckets = self._buckets[pool] = [{} for _ in range(size)]
            for name in members:
                count = len(self.free[name].whole)
                buckets[count][name] = None
                self._bucket_of[name] = count
        return buckets

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
        new = node_free.free_whole
        if old == new:
            return
        if old is not None:
            del buckets[old][name]
        buckets[new][name] = None
        self._bucket_of[name] = new

    def free_whole_total(self, pool: str) -> int:
        """Free whole GPUs in the pool, on any node."""
        buckets = self._pool_buckets(pool) or []
        return sum(k * len(bucket) for k, bucket in enumerate(buckets))

    def pool_nodes(self, pool: str) -> list[NodeFree]:
        free = self.free
        return [free[name] for name in self._by_pool.get(pool, ())]

    def eligible(self, node_free: NodeFree, request: Request) -> bool:
        """May new work for ``request`` land on this node at all (health, labels, holds)?"""
        node = node_free.node
        if node.health is not Health.READY:
            return False
        if self.reserved:
            holder = self.reserved.get(node.name)
            if holder is not None and holder != request.id:
                return False
        return not request.labels or labels_match(request.labels, node.labels)

    def best(
        self, request: Request, strategy: PlacementStrategy, exclude: frozenset[str] = frozenset()
    ) -> tuple[NodeFree, tuple[Slice, ...]] | None:
        """The best node for the request now, or None.

        With bucketed best/worst fit, the first bucket holding a fitting node
        decides: nodes in later buckets fit less tightly (or more, for worst fit).
        """
        found: list[tuple[tuple[float, ...], NodeFree, tuple[Slice, ...]]] = []
        reverse = strategy is PlacementStrategy.WORST_FIT
        for group in self._groups(request, strategy):
            for node_free in group:
                if node_free.node.name in exclude or not self.eligible(node_free, request):
                    continue
                slices = node_free.slices_for(request)
                if slices is None:
                    continue
                if strategy is PlacementStrategy.FIRST_FIT:
                    return node_free, slices
                found.append((_tightness(node_free, request, slices), node_free, slices))
            if found:
                break
        if not found:
            return None
        pick = max(found, key=lambda i: i[0]) if reverse else min(found, key=lambda i: i[0])
        return pick[1], pick[2]

    def _groups(self, request: Request, strategy: PlacementStrategy) -> Iterator[list[NodeFree]]:
        """Groups of nodes to try in turn; a later group never fits better."""
        buckets = self._pool_buckets(request.pool)
        whole_only = request.mig is None and (request.gpus or request.gpu_milli)
        if buckets is None or strategy is PlacementStrategy.FIRST_FIT or not whole_only:
            yield self.pool_nodes(request.pool)
            return
        if request.gpu_milli:
            shared = [nf for nf in self.pool_nodes(request.pool) if nf.shared]
            if shared:
                yield shared
            low = 1
        else:
            low = request.gpus
        order = range(low, len(buckets))
        if strategy is PlacementStrategy.WORST_FIT:
            order = range(len(buckets) - 1, low - 1, -1)
        for k in order:
            if buckets[k]:
                yield [self.free[name] for name in buckets[k]]

    def place(self, request: Request, strategy: PlacementStrategy) -> tuple[NodeGrant, ...] | None:
        """Grants for the request on free slices (taken from capacity), or None."""
        grants: list[NodeGrant] = []
        used: set[str] = set()
        for _ in range(request.nodes):
            found = self.best(request, strategy, frozenset(used))
            if found is None:
                self.give(grants)
                return None
            node_free, slices = found
            grant = NodeGrant(node_free.node.name, slices, request.cpus, request.memory_gib)
            self.take((grant,))
            grants.append(grant)
            used.add(grant.node)
        return tuple(grants)

    def take(self, grants: Iterable[NodeGrant]) -> None:
        for grant in grants:
            if grant.node not in self.free:
                continue
            node_free = self._own(grant.node)
            node_free.take(grant)
            self._index(node_free)

    def give(self, grants: Iterable[NodeGrant]) -> None:
        for grant in grants:
            if grant.node not in self.free:
                continue
            node_free = self._own(grant.node)
            node_free.give(grant)
            self._index(node_free)


def _tightness(
    node_free: NodeFree, request: Request, slices: tuple[Slice, ...]
) -> tuple[float, ...]:
    """Smaller is a tighter fit: what would be left free after placing the request.

    Fractions prefer a GPU already shared (the fuller the better); whole-GPU and
    CPU-only work prefers the node with the fewest GPUs left, so that empty nodes
    stay whole for whole-node requests.
    """
    if request.mig is not None:
        return (float(len(node_free.mig.get(request.mig, ()))), node_free.cpus - request.cpus)
    if request.gpu_milli:
        piece = slices[0]
        used = node_free.shared.get(piece.gpu_uuid)
        fresh = 1.0 if used is None else 0.0
        left = MILLI - (used or 0) - piece.milli
        return (fresh, float(left), float(node_free.free_whole), node_free.cpus - request.cpus)
    return (
        float(node_free.free_whole - request.gpus),
        float(len(node_free.shared)),
        node_free.cpus - request.cpus,
        node_free.memory_gib - request.memory_gib,
    )
