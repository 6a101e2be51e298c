"""Phase 2, heads of the queue: per pool and team, the waiting requests in queue order.

Inside one team: debug requests first (the fast lane, S1 of docs/architecture.md),
then declared priority (high first), then submit time (R1). The scheduler keeps
these queues sorted between cycles (`CycleIndex.queues`); without them they are
built here from the view.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from scheduler_core.kept import CycleIndex, Queued, queue_key
from scheduler_core.model import PoolKind, Request
from scheduler_core.view import ClusterView

__all__ = ["queue_heads", "queue_order"]


def queue_order(requests: list[Request]) -> list[Request]:
    """Order inside one team: declared priority (high first), then submit time."""
    return sorted(requests, key=queue_key)


def queue_heads(
    view: ClusterView, index: CycleIndex | None = None
) -> Mapping[str, Mapping[str, tuple[Queued, ...]]]:
    """Heads of the queue: per pool and team, the view's pending requests in queue
    order (`queue_key`), with the figures the policy weighs. ``index``, if given and
    holding the queues, answers instead of sorting ``pending`` again."""
    if index is not None and index.queues is not None:
        return index.queues
    grouped: dict[str, dict[str, list[Request]]] = defaultdict(lambda: defaultdict(list))
    for request in view.pending:
        grouped[request.pool][request.team].append(request)
    settings = view.settings
    kinds = {name: pool.kind for name, pool in view.pools.items()}
    out: dict[str, dict[str, tuple[Queued, ...]]] = {}
    for pool, teams in grouped.items():
        kind = kinds.get(pool, PoolKind.GPU)
        out[pool] = {
            team: tuple(Queued.of(r, settings, kind) for r in sorted(requests, key=queue_key))
            for team, requests in teams.items()
        }
    return out
