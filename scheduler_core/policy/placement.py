"""R3 of docs/architecture.md, placement on free slices, and S3, backfill of held
nodes. Both take their grants from the cycle's capacity, and remember a shape that
found no room for the rest of the pool's pass (`Failures`)."""

from __future__ import annotations

from scheduler_core.kept import Queued
from scheduler_core.model import NodeGrant
from scheduler_core.policy.cycle import Cycle
from scheduler_core.policy.failures import Failures

__all__ = ["backfill", "fit"]


def fit(
    cycle: Cycle, entry: Queued, holder: bool, no_fit: Failures
) -> tuple[NodeGrant, ...] | None:
    """R3: grants for the entry on free slices, taken from the capacity, or None. A
    shape that found no room is remembered in ``no_fit`` unless the entry holds nodes
    (which no other request may use)."""
    grants = cycle.capacity.place(entry.request, cycle.settings.placement)
    if grants is None and not holder:
        no_fit.add(entry.shape, (), entry.shape_id)
    return grants


def backfill(cycle: Cycle, entry: Queued, no_backfill: Failures) -> tuple[NodeGrant, ...] | None:
    """S3: an entry that would run unallocated and can be resumed may use the free
    slices of nodes held for others; the holder stops it (past its grace) the moment
    the rest of its nodes is free. A debug entry may too, funded or not, before it
    looks for victims: it is short and small, and the holder stops it past its
    protection by the rank rule as it would any session (else waits for it to end,
    as for the sessions that were on the node when it was held)."""
    grants = cycle.capacity.place(entry.request, cycle.settings.placement, backfill=True)
    if grants is None:
        no_backfill.add(entry.shape, (), entry.shape_id)
    return grants
