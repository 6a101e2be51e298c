"""What is still free on one node, and how a request would fit there.

`NodeFree` counts free whole GPUs (in index order), milli-GPUs in use on shared
GPUs, free MIG instances, CPUs and memory; `take` and `give` apply a grant.
The scheduler keeps one per node between cycles (kept.py); a cycle's `Capacity`
(capacity.py) copies those it changes, so the kept ones never change under it.
"""

from __future__ import annotations

from typing import Final

from scheduler_core.model import MILLI, Gpu, MigInstance, Node, NodeGrant, Request, Slice, SliceKind

_EPS: Final = 1e-9

Tightness = tuple[float, ...]
"""How tightly a request fits a node (smaller is tighter)."""


class NodeFree:
    """What is still free on one node."""

    __slots__ = ("node", "cpus", "memory_gib", "whole", "shared", "mig", "_gpus", "_in_order")

    def __init__(self, node: Node, source: NodeFree | None = None) -> None:
        """What is free on an empty ``node``, or a copy of ``source`` (its node's)."""
        self.node = node
        self.cpus: float
        self.memory_gib: float
        self.whole: list[Gpu]
        self.shared: dict[str, int]
        """Milli-GPUs in use on GPUs that hold fractional sessions."""
        self.mig: dict[str, list[tuple[str, MigInstance]]]
        self._gpus: dict[str, Gpu]
        self._in_order: bool
        """Are the whole GPUs listed by index (as `give` keeps them)?"""
        if source is not None:
            self.cpus = source.cpus
            self.memory_gib = source.memory_gib
            self.whole = list(source.whole)
            self.shared = dict(source.shared)
            self.mig = {k: list(v) for k, v in source.mig.items()}
            self._gpus = source._gpus
            self._in_order = source._in_order
            return
        self.cpus = node.cpus
        self.memory_gib = node.memory_gib
        self.whole = [g for g in node.gpus if not g.mig]
        self.shared = {}
        self.mig = {}
        for gpu in node.gpus:
            for inst in gpu.mig:
                self.mig.setdefault(inst.profile, []).append((gpu.uuid, inst))
        self._gpus = {g.uuid: g for g in node.gpus}
        indexes = [g.index for g in self.whole]
        self._in_order = all(a < b for a, b in zip(indexes, indexes[1:], strict=False))

    def copy(self) -> NodeFree:
        return NodeFree(self.node, self)

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

    def fits(self, request: Request) -> bool:
        """Does the request fit here now: `slices_for` is not None, without making the
        slices (the victim search asks this of every trial it makes)."""
        if request.cpus > self.cpus + _EPS or request.memory_gib > self.memory_gib + _EPS:
            return False
        if request.mig is not None:
            return bool(self.mig.get(request.mig))
        if request.gpu_milli:
            need = request.gpu_milli
            for used in self.shared.values():
                if used + need <= MILLI:
                    return True
            return bool(self.whole)
        return request.gpus <= len(self.whole)

    def tightness(self, request: Request) -> Tightness | None:
        """How tightly the request fits here now (smaller is tighter), or None if it does not.

        None exactly when `slices_for` is None. Fractions prefer a GPU already
        shared (the fuller the better); whole-GPU and CPU-only work prefers the
        node with the fewest GPUs left, so that empty nodes stay whole for
        whole-node requests.
        """
        if request.cpus > self.cpus + _EPS or request.memory_gib > self.memory_gib + _EPS:
            return None
        cpus_left = self.cpus - request.cpus
        if request.mig is not None:
            free = self.mig.get(request.mig)
            if not free:
                return None
            return (float(len(free)), cpus_left)
        whole = len(self.whole)
        if request.gpu_milli:
            need = request.gpu_milli
            best_used = -1
            for used in self.shared.values():
                if used + need <= MILLI and used > best_used:
                    best_used = used
            if best_used >= 0:
                return (0.0, float(MILLI - best_used - need), float(whole), cpus_left)
            if not whole:
                return None
            return (1.0, float(MILLI - need), float(whole), cpus_left)
        if request.gpus > whole:
            return None
        return (
            float(whole - request.gpus),
            float(len(self.shared)),
            cpus_left,
            self.memory_gib - request.memory_gib,
        )

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
