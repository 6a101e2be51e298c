"""`fifo`: first come, first served, as a baseline.

Requests go in submit order (ties by id) across teams, priorities ignored;
each is placed if it fits now, and nothing is ever preempted. A request that
does not fit is passed over rather than blocking the line (Kubernetes' default
scheduler behaves so): strict head-of-line blocking would idle GPUs behind
every 64-GPU request at 2-3x demand, a strawman; the price is that large
requests may wait behind a stream of small ones.
"""

from __future__ import annotations

from scheduler_core.baselines.common import GreedyCycle
from scheduler_core.registry import register
from scheduler_core.view import ClusterView, Decisions


@register("fifo")
def fifo_policy(view: ClusterView, now: float) -> Decisions:
    """Oldest request first, placed if it fits; no preemption."""
    cycle = GreedyCycle(view, now)
    for request in sorted(view.pending, key=lambda r: (r.submit, r.id)):
        cycle.consider(request, True)
        grants = cycle.place(request)
        if grants is not None:
            cycle.admit(request, grants, True, cycle.min_runtime(request))
    return cycle.decisions()
