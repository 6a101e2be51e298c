"""Why a request waits when other jobs hold the room it needs (other users' Slurm jobs).

The Hub keeps what jobs it did not start hold on each node as one stand-in allocation
per node in the core (`spawner.runtime.foreign`, user `OTHER_JOBS`). The policy sees
only capacity that is taken, and says `verdict.NO_ROOM` or `verdict.NO_VICTIMS`; where
the request would fit with the stand-ins gone, the read model says
`verdict.HELD_ELSEWHERE` instead, so the user learns that it starts when those jobs end.
"""

from __future__ import annotations

from scheduler_core.capacity import Capacity
from scheduler_core.model import Request
from scheduler_core.scheduler import Scheduler
from scheduler_core.verdict import HELD_ELSEWHERE, NO_ROOM, NO_VICTIMS

OTHER_JOBS = "(other jobs)"
"""The user of every stand-in (`spawner.runtime.foreign.FOREIGN_USER`, the same)."""


def is_stand_in(request: Request) -> bool:
    return request.user == OTHER_JOBS


class HeldCheck:
    """Would a waiting request fit but for the stand-ins? Built once per read of the
    queue: one `Capacity` per pool without them, asked and given back."""

    def __init__(self, core: Scheduler) -> None:
        self.core = core
        self.pools = {a.pool for a in core.running.values() if is_stand_in(a.request)}
        self._free: dict[str, Capacity] = {}

    def reason(self, request: Request, reason: str) -> str:
        """``reason``, or `HELD_ELSEWHERE` where only other jobs stand in the way."""
        if reason not in (NO_ROOM, NO_VICTIMS) or request.pool not in self.pools:
            return reason
        capacity = self._free.get(request.pool)
        if capacity is None:
            nodes = [n for n in self.core.nodes.values() if n.pool == request.pool]
            own = [
                a
                for a in self.core.running.values()
                if a.pool == request.pool and not is_stand_in(a.request)
            ]
            capacity = self._free[request.pool] = Capacity(nodes, own)
        grants = capacity.place(request, self.core.settings.placement, backfill=True)
        if grants is None:
            return reason
        capacity.give(grants)  # asked, not taken: the next request sees the same room
        return HELD_ELSEWHERE
