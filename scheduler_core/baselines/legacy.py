"""`legacy`: the scheduler the seed's team ran before budgets, as a baseline.

Each team may hold at most ``share x pool capacity`` GPUs (cores, in a CPU pool)
of non-preemptible work at once; no budget, no lookback window. Declared
priority orders the whole cluster, then submit time (so priority inflation pays
off across teams). A request that fits under its team's limit runs
non-preemptible (funded); anything beyond the limit runs preemptible
(unallocated) on idle capacity, and non-preemptible work that does not fit on
free slices stops preemptible sessions past their grace to make room (the least
work lost first, as everywhere). Non-preemptible work is never preempted.
Requests that do not fit are passed over (see common.py).

Setting ``legacy_preemption``: ``priority`` (default), where only sessions of
strictly lower declared priority may be stopped, as priority-class schedulers
(Kubernetes, the seed's old one) do; or ``limit``, where being within the limit
is enough. The seed does not say which; ``priority`` reproduces its "before"
(debug p90 of hours on a busy cluster), ``limit`` lets debug work in at once.
"""

from __future__ import annotations

from scheduler_core.baselines.common import GreedyCycle, funding_share
from scheduler_core.registry import register
from scheduler_core.rules import funded_rates
from scheduler_core.settings import LegacyPreemption
from scheduler_core.view import ClusterView, Decisions


def team_limits(view: ClusterView) -> dict[tuple[str, str], float]:
    """(team, pool) → the most non-preemptible units the team may hold at once."""
    tree = view.teams
    return {
        (name, pool): funding_share(tree, name, pool) * capacity
        for pool, capacity in view.capacity.items()
        for name in tree.teams
    }


@register("legacy")
def legacy_policy(view: ClusterView, now: float) -> Decisions:
    """Priority across the cluster; per-team limits on non-preemptible work."""
    cycle = GreedyCycle(view, now)
    limits = team_limits(view)
    held = funded_rates(view, cycle.stopped)
    cycle.victims_may_be(lambda allocation: allocation.protected_until <= now)
    grace = view.settings.unallocated_grace
    by_priority = view.settings.legacy_preemption is LegacyPreemption.PRIORITY

    for request in sorted(view.pending, key=lambda r: (-r.priority, r.submit, r.id)):
        key = (request.team, request.pool)
        rate = cycle.rate(request)
        protected = held[key] + rate <= limits.get(key, 0.0) + 1e-9
        cycle.consider(request, protected)
        grants = cycle.place(request)
        preempts: tuple[str, ...] = ()
        if grants is None and protected:
            found = cycle.preempt_for(request, request.priority if by_priority else None)
            if found is not None:
                grants, preempts = found
        if grants is None:
            continue
        if protected:
            held[key] += rate
            cycle.admit(request, grants, True, cycle.min_runtime(request), preempts)
        else:
            cycle.admit(request, grants, False, grace)
    return cycle.decisions()
