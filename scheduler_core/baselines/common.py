"""What every baseline cycle shares: free capacity, node health, greedy placement, victims.

A baseline walks its pending requests in its own order and places each one that
fits (a request that does not fit is passed over, never waits at the head of the
line: the scheduler is not told runtimes, so it cannot backfill around a
reservation). `GreedyCycle` keeps the cycle's what-if capacity, the admissions
and preemptions so far, and returns the `Decisions` the scheduler carries out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import MappingProxyType

from scheduler_core.capacity import Capacity
from scheduler_core.model import Allocation, NodeGrant, PoolKind, Request
from scheduler_core.preemption import Victims, find_targets
from scheduler_core.rules import health_preemptions
from scheduler_core.teams import TeamTree
from scheduler_core.view import Admission, ClusterView, Decisions, Preemption


def funding_share(tree: TeamTree, team: str, pool: str) -> float:
    """The fraction of the pool that backs the team's own requests.

    A sub-team's share is a fraction of its parent's; a parent team's own work
    gets the part of its share its children do not hold.
    """
    return tree.own_share(team, pool) if tree.has_children(team) else tree.share(team, pool)


Dims = tuple[int, int, int, float, float]
"""What a request needs per node: whole GPUs, nodes, milli-GPUs, CPUs, memory."""


def _shape(request: Request) -> tuple[tuple[object, ...], Dims]:
    """Requests of one kind (pool, labels, MIG profile, fractional or not) compare by dims."""
    labels = tuple(sorted(request.labels.items())) if request.labels else ()
    kind = (request.pool, request.mig, request.gpu_milli > 0, labels)
    return kind, (request.gpus, request.nodes, request.gpu_milli, request.cpus, request.memory_gib)


def _covers(small: Dims, large: Dims) -> bool:
    return (
        small[0] <= large[0]
        and small[1] <= large[1]
        and small[2] <= large[2]
        and small[3] <= large[3]
        and small[4] <= large[4]
    )


class NoRoom:
    """Shapes that found no room this cycle.

    Capacity only shrinks while a greedy cycle places work, so a shape that did
    not fit keeps not fitting, and so does any larger one; freeing slices clears
    it. Only the smallest failed shapes of each kind are kept.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[object, ...], list[Dims]] = {}

    def known(self, request: Request) -> bool:
        if not self._seen:
            return False
        kind, dims = _shape(request)
        for failed in self._seen.get(kind, ()):
            if _covers(failed, dims):
                return True
        return False

    def add(self, request: Request) -> None:
        kind, dims = _shape(request)
        kept = [failed for failed in self._seen.get(kind, ()) if not _covers(dims, failed)]
        self._seen[kind] = [*kept, dims]

    def clear(self) -> None:
        self._seen.clear()


def _permitted(
    allocation: Allocation, exposed: Callable[[Allocation], bool], below_priority: int | None
) -> bool:
    if allocation.funded or not exposed(allocation):
        return False
    return below_priority is None or allocation.request.priority < below_priority


class GreedyCycle:
    """One baseline cycle: node health handled, then requests placed one by one."""

    def __init__(self, view: ClusterView, now: float) -> None:
        self.view = view
        self.now = now
        self.settings = view.settings
        self.capacity = Capacity(view.nodes, view.allocations, view.free)
        self.preemptions: list[Preemption] = health_preemptions(view, now)
        self.stopped = {p.allocation_id for p in self.preemptions}
        if self.stopped:
            for allocation in view.allocations:
                if allocation.id in self.stopped:
                    self.capacity.give(allocation.grants)
        self.admissions: list[Admission] = []
        self.order: list[str] = []
        self.funded: dict[str, bool] = {}
        self.kinds = {name: pool.kind for name, pool in view.pools.items()}
        self._no_room = NoRoom()
        self._no_victims: dict[int | None, NoRoom] = {}
        self._victims: dict[int | None, Victims] = {}
        """Victim indices by the priority bound they were built for (None: no bound)."""
        self._exposed: Callable[[Allocation], bool] | None = None

    @property
    def running(self) -> Iterable[Allocation]:
        """Allocations still running after this cycle's health preemptions."""
        return (a for a in self.view.allocations if a.id not in self.stopped)

    def rate(self, request: Request) -> float:
        """Units per second the request holds: GPU-equivalents, or cores in a CPU pool."""
        return request.charge_rate(self.kinds[request.pool])

    def is_gpu_pool(self, pool: str) -> bool:
        return self.kinds[pool] is PoolKind.GPU

    def min_runtime(self, request: Request) -> float:
        return self.settings.capped_min_runtime(request.min_runtime, request.klass)

    def consider(self, request: Request, funded: bool) -> None:
        """Record that the cycle looked at ``request`` and whether it would be funded."""
        self.order.append(request.id)
        self.funded[request.id] = funded

    def place(self, request: Request) -> tuple[NodeGrant, ...] | None:
        """Grants on free slices (taken from the cycle's capacity), or None."""
        if self._no_room.known(request):
            return None
        grants = self.capacity.place(request, self.settings.placement)
        if grants is None:
            self._no_room.add(request)
        return grants

    def victims_may_be(self, exposed: Callable[[Allocation], bool]) -> None:
        """Which running sessions `preempt_for` may stop (unallocated ones only); call once."""
        self._exposed = exposed

    def preempt_for(
        self, request: Request, below_priority: int | None = None
    ) -> tuple[tuple[NodeGrant, ...], tuple[str, ...]] | None:
        """Stop the cheapest permitted victims so ``request`` fits: its grants and the victims.

        Candidates are the unallocated sessions `victims_may_be` permits (and,
        with ``below_priority``, only those of lower declared priority); the
        request has already failed to fit on free slices.
        """
        exposed = self._exposed
        if exposed is None:
            return None
        no_victims = self._no_victims.setdefault(below_priority, NoRoom())
        if no_victims.known(request):
            return None
        victims = self._victims.get(below_priority)
        if victims is None:
            victims = self._victims[below_priority] = Victims(
                (a for a in self.running if _permitted(a, exposed, below_priority)), self.now
            )
        targets = find_targets(request, self.capacity, victims, frozenset(), self.now)
        if targets is None:
            no_victims.add(request)
            return None
        chosen: dict[str, Allocation] = {}
        for target in targets:
            for victim in target.victims:
                chosen[victim.id] = victim
        for victim in chosen.values():
            self.capacity.give(victim.grants)
            self.stopped.add(victim.id)
            self.preemptions.append(Preemption(victim.id, "funded", request.id))
            for bound, index in self._victims.items():
                if _permitted(victim, exposed, bound):
                    index.remove(victim)
        grants = tuple(
            NodeGrant(t.node, t.slices, request.cpus, request.memory_gib) for t in targets
        )
        self.capacity.take(grants)
        self._no_room.clear()
        self._no_victims.clear()
        return grants, tuple(chosen)

    def admit(
        self,
        request: Request,
        grants: tuple[NodeGrant, ...],
        funded: bool,
        protected_for: float,
        preempts: tuple[str, ...] = (),
    ) -> None:
        """Start ``request`` on ``grants``, protected from preemption for ``protected_for`` s."""
        self.admissions.append(
            Admission(
                request, grants, funded, self.now + protected_for, self.rate(request), preempts
            )
        )

    def decisions(self) -> Decisions:
        return Decisions(
            admissions=tuple(self.admissions),
            preemptions=tuple(self.preemptions),
            order=tuple(self.order),
            funded=MappingProxyType(self.funded),
        )
