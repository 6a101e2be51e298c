"""`quota`: Kueue-style nominal quotas with borrowing and reclaim, as a baseline.

Every team is a ClusterQueue with a nominal quota of ``share x pool capacity``
in one cohort. Requests are taken by declared priority, then submit time
(BestEffortFIFO: one that does not fit is passed over). A request that keeps its
team within nominal quota (counting all the team's running work) is admitted
first, funded; if it does not fit it reclaims: it stops borrowed sessions of
teams that are over their nominal quota (least work lost first). Then what is
still idle is lent: the other requests are admitted as borrowed work
(unallocated), with no minimum-runtime protection at all, so a reclaim may stop
them the next cycle. Admitted work within quota is never preempted.

Kueue has no per-workload "borrowed" flag; here a session is borrowed if its
team was over nominal quota when it started, and it may be reclaimed while its
team is over quota at the start of a cycle.
"""

from __future__ import annotations

from collections import defaultdict

from scheduler_core.baselines.common import GreedyCycle
from scheduler_core.baselines.legacy import team_limits
from scheduler_core.model import Allocation
from scheduler_core.registry import register
from scheduler_core.view import ClusterView, Decisions


@register("quota")
def quota_policy(view: ClusterView, now: float) -> Decisions:
    """Admit within nominal quota (reclaiming borrowed capacity), then lend what is idle."""
    cycle = GreedyCycle(view, now)
    nominal = team_limits(view)
    used: dict[tuple[str, str], float] = defaultdict(float)
    for allocation in cycle.running:
        used[(allocation.team, allocation.pool)] += allocation.charge_rate
    borrowing = {key for key, units in used.items() if units > nominal.get(key, 0.0) + 1e-9}

    def reclaimable(allocation: Allocation) -> bool:
        return (allocation.team, allocation.pool) in borrowing

    cycle.victims_may_be(reclaimable)

    queue = sorted(view.pending, key=lambda r: (-r.priority, r.submit, r.id))
    lend: list[str] = []
    by_id = {r.id: r for r in queue}
    for request in queue:
        key = (request.team, request.pool)
        rate = cycle.rate(request)
        within = used[key] + rate <= nominal.get(key, 0.0) + 1e-9
        cycle.consider(request, within)
        if not within:
            lend.append(request.id)
            continue
        grants = cycle.place(request)
        preempts: tuple[str, ...] = ()
        if grants is None:
            found = cycle.preempt_for(request)
            if found is None:
                continue
            grants, preempts = found
        used[key] += rate
        cycle.admit(request, grants, True, cycle.min_runtime(request), preempts)

    for request_id in lend:
        request = by_id[request_id]
        grants = cycle.place(request)
        if grants is not None:
            used[(request.team, request.pool)] += cycle.rate(request)
            cycle.admit(request, grants, False, 0.0)
    return cycle.decisions()
