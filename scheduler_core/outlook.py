"""Where each waiting request stands: the order the budget policy would admit them in.

A cycle weighs teams by occupancy ratio and charges each funded admission before
it picks the next request, so a team that is given one session may fall behind
others. The positions users are shown follow that projection (as if every request
fitted where it asks), not the order some earlier cycle happened to look at: a
stale order showed positions that admission did not follow. Pure: no I/O.
"""

from __future__ import annotations

import heapq

from scheduler_core.policy import queue_heads
from scheduler_core.ranking import PoolRanking
from scheduler_core.view import ClusterView


def admission_order(view: ClusterView, now: float) -> list[str]:
    """Every waiting request of the view, pool by pool, in the order the policy's
    team ranking would reach them if each were admitted in turn (funded ones charged
    to their team as they go)."""
    index = view.index
    queues = queue_heads(view, index)
    order: list[str] = []
    for pool in sorted(queues):
        team_queues = {team: q for team, q in queues[pool].items() if q}
        if not team_queues:
            continue
        protected = index.protected.get(pool, ()) if index is not None else None
        ranking = PoolRanking(view, pool, now, protected)
        heads = dict.fromkeys(team_queues, 0)
        heap = [(ranking.key(team), q[0].request.submit, team) for team, q in team_queues.items()]
        heapq.heapify(heap)
        while heap:
            key, _, team = heapq.heappop(heap)
            current = ranking.key(team)
            if current > key:  # charged since it was pushed: it moved back
                entry = team_queues[team][heads[team]]
                heapq.heappush(heap, (current, entry.request.submit, team))
                continue
            entry = team_queues[team][heads[team]]
            heads[team] += 1
            order.append(entry.request.id)
            if ranking.can_fund(team, entry.units):
                ranking.charge(team, entry.units)
            if heads[team] < len(team_queues[team]):
                following = team_queues[team][heads[team]]
                heapq.heappush(heap, (ranking.key(team), following.request.submit, team))
    return order
