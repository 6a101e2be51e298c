"""Rules of the scheduling contract that the budget policy and the baselines share.

Node health (R6: sessions on down nodes stop at once, on draining nodes once
their protection ends), the holds kept from the last cycle (R7), and funding (R2:
`funds`, and the funded charge rates it compares with a team's share), and which
jobs are larger than their team's share (`oversize`: those run in day slices, S5).
The rule IDs are those of the scheduling contract in docs/architecture.md. Pure
functions of the view (and of a cycle's `Capacity`), so every policy reads
them alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from typing import Final

from scheduler_core.capacity import Capacity, copied
from scheduler_core.model import Health, Node
from scheduler_core.settings import Settings
from scheduler_core.verdict import (
    BUDGET,
    BURST,
    FUNDED_GROUNDS,
    NO_SHARE,
    OVER_BUDGET,
    OVER_BURST,
    SHARE,
)
from scheduler_core.view import ClusterView, Preemption

__all__ = [
    "funded_rates",
    "funding",
    "funds",
    "health_preemptions",
    "kept_reservations",
    "oversize",
    "oversize_above",
]

_all_ready: Final[list[tuple[Node, ...]]] = []
"""The last node tuple found all ready (the scheduler keeps one tuple while nothing
changes): a memo of `health_preemptions`' answer, not state."""


def health_preemptions(view: ClusterView, now: float) -> list[Preemption]:
    """Sessions on down nodes end now; on draining nodes, once their protection ends."""
    nodes = view.nodes
    if _all_ready and _all_ready[0] is nodes:
        return []
    if all(n.health is Health.READY for n in nodes):
        _all_ready[:] = [nodes]
        return []
    health = {n.name: n.health for n in view.nodes}
    found: list[Preemption] = []
    for allocation in view.allocations:
        states = {health.get(node, Health.DOWN) for node in allocation.node_names}
        if Health.DOWN in states:
            found.append(Preemption(allocation.id, "node-down"))
        elif Health.DRAINING in states and allocation.protected_until <= now:
            found.append(Preemption(allocation.id, "drain"))
    return found


def kept_reservations(
    view: ClusterView, capacity: Capacity, waiting: Collection[str] | None = None
) -> None:
    """Carry last cycle's holds over while their request waits and their nodes are ready.
    ``waiting``, if given, holds every waiting request's id (the scheduler keeps them)."""
    if not view.reservations:
        return
    if view.queued is not None:
        pending: Collection[str] = view.queued
    elif waiting is not None:
        pending = waiting
    else:
        pending = {r.id for r in view.pending}
    for request_id, nodes in view.reservations.items():
        if request_id not in pending:
            continue
        if all(n in capacity.free and capacity.free[n].node.health is Health.READY for n in nodes):
            for node in nodes:
                capacity.reserved[node] = request_id


_EPS: Final = 1e-9
"""Slack for sums of charge rates compared with a share."""


def funding(
    within_budget: bool, running: float, rate: float, share_rate: float, settings: Settings
) -> str:
    """R2 (docs/architecture.md): on what ground is a request of ``rate`` units per second
    funded (a `verdict.FUNDED_GROUNDS` code), or why not?

    ``within_budget``: the team's usage over the window plus the request's protected
    window stays within its budget; ``running``: the charge rate of the team's funded
    sessions in the pool; ``share_rate``: its share of the pool's capacity. Funded
    within the guaranteed part of the share (`SHARE`); else, within the budget, as the
    team's only funded work (`BUDGET`) or beside it up to the burst cap (`BURST`, S4).
    """
    after = running + rate
    guaranteed = settings.guaranteed_share * share_rate
    if guaranteed > 0 and after <= guaranteed + _EPS:
        return SHARE
    if not within_budget:
        return OVER_BUDGET if share_rate > 0 else NO_SHARE
    if running <= _EPS:
        return BUDGET
    cap = settings.funded_burst
    return BURST if not cap or after <= cap * share_rate + _EPS else OVER_BURST


def funds(
    within_budget: bool, running: float, rate: float, share_rate: float, settings: Settings
) -> bool:
    """R2 (docs/architecture.md): is a request of ``rate`` units per second funded?
    (`funding`'s answer is a funded ground.)"""
    return funding(within_budget, running, rate, share_rate, settings) in FUNDED_GROUNDS


def oversize_above(share_rate: float, settings: Settings) -> float:
    """The charge rate above which a job is larger than its team's share: the
    guaranteed part of the team's own share of the pool (``share_rate``, units per
    second). Such a job runs in day slices (time-slicing) rather than beside the share.
    The policy, its time-slice stops and the scheduler's cycle trigger all ask here,
    so that a job exactly the size of its share is never oversize to one and not to
    another."""
    return settings.guaranteed_share * share_rate + _EPS


def oversize(rate: float, share_rate: float, settings: Settings) -> bool:
    """Is a job of ``rate`` units per second larger than its team's share? See
    `oversize_above`."""
    return rate > oversize_above(share_rate, settings)


def funded_rates(
    view: ClusterView, stopped: Collection[str] = ()
) -> defaultdict[tuple[str, str], float]:
    """Per (team, pool), the charge rate of the view's funded allocations, less
    those in ``stopped`` (this cycle's health preemptions)."""
    rates: defaultdict[tuple[str, str], float] = defaultdict(float)
    if view.funded_rates is None:
        for allocation in view.allocations:
            if allocation.funded and allocation.id not in stopped:
                rates[(allocation.team, allocation.pool)] += allocation.charge_rate
        return rates
    rates.update(copied(view.funded_rates))
    if stopped:  # rare: only health preemptions
        for allocation in view.allocations:
            if allocation.funded and allocation.id in stopped:
                rates[(allocation.team, allocation.pool)] -= allocation.charge_rate
    return rates
