"""The budget policy: ``budget_policy(view, now) -> Decisions``, pure.

It carries out the scheduling contract of docs/architecture.md; every unit cites
the rule it carries out by ID, and docs/policy.md lists the rules with the
measurements that justified each. A cycle runs in phases, as Kueue's
``schedule()`` does:

1. start (`cycle.Cycle`): health preemptions (R6), time-slice stops (S5,
   `day.DayUsage`), kept holds (R7), funded charge rates;
2. heads of the queue (`heads.queue_heads`): per pool and team, the queue in order;
3. team order (`order.pool_pass`, R1, S1), each entry judged for funding
   (`funding.fund`: R2, S4, S5, S6);
4. fit (`placement.fit`, R3), else backfill (`placement.backfill`, S3), else victims
   (`victims.evict`, R4, S4-S8; `victims.lane`, S1), else hold (`holds.hold`, R7);
   an entry that found room is admitted (`cycle.Cycle.admit`, S2);
5. decisions (`cycle.Cycle.decisions`), with a verdict per entry (verdict.py).

Speed: when the view carries a `CycleIndex` (kept.py) the sorted queues, protected
sessions and victims come from it, and victim searches that failed in earlier
cycles are only re-checked on the nodes that grew since (`KnownFailures`). Within a
pass, shapes that found no room are remembered (`failures.Failures`), and an entry
like one already judged in its team's turn, with nothing changed since, gets the
same answer (`order.judge_all`). Each is exact, not a heuristic; the last holds only
while every rule reads no more of an entry than its kind (docs/policy.md, "Adding a
rule"), so it can be turned off: ``memo=False``, or ``BUDGETHUB_NO_MEMO=1`` for a
whole process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from scheduler_core.model import Pool, Request, RequestClass
from scheduler_core.policy.cycle import Cycle
from scheduler_core.policy.failures import Failures
from scheduler_core.policy.heads import queue_heads, queue_order
from scheduler_core.policy.holds import choose_reservation
from scheduler_core.policy.order import pool_pass
from scheduler_core.registry import register
from scheduler_core.rules import oversize
from scheduler_core.settings import Settings
from scheduler_core.teams import TeamTree
from scheduler_core.view import ClusterView, Decisions

__all__ = [
    "MEMO",
    "NO_MEMO_ENV",
    "Failures",
    "budget_policy",
    "choose_reservation",
    "partial_cycle_safe",
    "queue_heads",
    "queue_order",
]


NO_MEMO_ENV = "BUDGETHUB_NO_MEMO"

MEMO = os.environ.get(NO_MEMO_ENV, "") in ("", "0")
"""Whether a cycle reuses an answer for an entry of the same kind (`order.judge_all`),
unless told otherwise. Read once, at import: ``BUDGETHUB_NO_MEMO=1`` judges every
entry afresh in every cycle of the process (a simulation, a benchmark, the Hub), with
the same decisions and more time; tests pass ``memo=False`` instead."""


@register("budget")
def budget_policy(view: ClusterView, now: float, memo: bool = MEMO) -> Decisions:
    """The scheduling contract of docs/architecture.md: start the cycle, take the heads
    of the queue, then each pool in name order, and return what was decided.
    ``memo=False``: every entry is judged afresh (`order.judge_all`)."""
    cycle = Cycle(view, now, memo)
    queues = queue_heads(view, cycle.index)
    for pool_name in sorted(queues):
        team_queues = queues[pool_name]
        if team_queues:
            pool_pass(cycle, pool_name, team_queues)
    return cycle.decisions()


def partial_cycle_safe(
    settings: Settings,
    now: float,
    pending: Mapping[str, Request],
    fresh: Iterable[str],
    ended: Iterable[tuple[str, str]],
    teams: TeamTree,
    capacity: Mapping[str, float],
    pools: Mapping[str, Pool],
) -> bool:
    """May the next cycle look at part of the queue only (the new arrivals, the funded
    requests), or must it look at all of it? The scheduler asks before it narrows one.

    S6 (a team slices itself): whether a team slices itself, and whether its new
    batch work is funded, depend on its waiting jobs and its running ones'
    protection, which a cycle over part of the queue does not see. So it is unsafe
    when a team with a job larger than its share (`rules.oversize`), waiting longer
    than ``own_slice_after``, had a protected window end (``ended``: team and pool)
    or asked for new batch work (``fresh``: ids of new requests in ``pending``).
    Asked on every protected window that ends, the whole queue was looked at on
    nearly every event of a saturated month: 38 s against 21 s.
    """
    bound = settings.own_slice_after
    if bound <= 0:
        return True
    slots = set(ended)
    for request_id in fresh:
        request = pending.get(request_id)
        if request is not None and request.klass is RequestClass.BATCH:
            slots.add((request.team, request.pool))
    if not slots:
        return True
    for request in pending.values():
        slot = (request.team, request.pool)
        if slot not in slots or now - request.submit < bound:
            continue
        share_rate = teams.own_share(request.team, request.pool) * capacity.get(request.pool, 0.0)
        if oversize(request.charge_rate(pools[request.pool].kind), share_rate, settings):
            return False
    return True
