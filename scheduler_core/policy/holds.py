"""R7 of docs/architecture.md, holds for starving requests: a funded request past the
starvation bound holds the nodes closest to fitting it, which take no new work from
others (but S3's backfill) until it fits; the hold ends when it starts or is no
longer funded."""

from __future__ import annotations

from collections.abc import Mapping

from scheduler_core.capacity import Capacity, could_hold
from scheduler_core.kept import Queued
from scheduler_core.model import Request
from scheduler_core.policy.cycle import Cycle, Pass

__all__ = ["choose_reservation", "clears", "drop_hold", "end_hold", "hold"]


def choose_reservation(
    capacity: Capacity, request: Request, clears: Mapping[str, float]
) -> tuple[str, ...] | None:
    """Nodes to hold for a starving request: those closest to fitting it.

    Closest means the nodes that clear soonest (``clears``: per node, when the last
    protected window of what runs there ends; a node not listed has none), then most
    free GPUs now, then most free CPUs: what still runs there ends or becomes
    preemptible in time, and nothing new lands meanwhile. For a gang of several
    nodes, the most free GPUs now often means a node kept busy for hours by a
    notebook's protected window.
    """
    options = [
        nf
        for nf in capacity.pool_nodes(request.pool)
        if nf.node.name not in capacity.reserved
        and capacity.eligible(nf, request)
        and could_hold(nf.node, request)
    ]
    if len(options) < request.nodes:
        return None
    options.sort(
        key=lambda nf: (clears.get(nf.node.name, 0.0), -nf.free_whole, -nf.cpus, nf.node.name)
    )
    return tuple(nf.node.name for nf in options[: request.nodes])


def drop_hold(capacity: Capacity, request_id: str, grown: list[str]) -> None:
    """Give back the nodes held for ``request_id`` (noting them as grown)."""
    for node in [n for n, r in capacity.reserved.items() if r == request_id]:
        del capacity.reserved[node]
        grown.append(node)


def hold(cycle: Cycle, entry: Queued, held: set[str]) -> bool:
    """R7: a funded entry past the starvation bound reserves the nodes closest to
    fitting it (`choose_reservation`); True if it did (none if too few nodes could
    ever take it)."""
    request_id = entry.request.id
    nodes = choose_reservation(cycle.capacity, entry.request, clears(cycle))
    if nodes is None:
        return False
    for node in nodes:
        cycle.capacity.reserved[node] = request_id
    held.add(request_id)
    return True


def clears(cycle: Cycle) -> Mapping[str, float]:
    """Per node, when the last protected window of the sessions left on it ends (no
    entry: none is protected now); worked out on first use, when a hold is made."""
    found = cycle.node_clears
    if found is None:
        found = cycle.node_clears = {}
        now, stopped = cycle.now, cycle.stopped
        for allocation in cycle.view.allocations:
            until = allocation.protected_until
            if until > now and allocation.id not in stopped:
                for node in allocation.node_names:
                    if until > found.get(node, now):
                        found[node] = until
    return found


def end_hold(cycle: Cycle, request_id: str, state: Pass) -> None:
    """R7: the nodes held for ``request_id`` go back to everyone (and count as grown):
    a shape that found no room or no victims without them, burst work's included,
    may find them now, so the pass's shape records are dropped."""
    drop_hold(cycle.capacity, request_id, cycle.known_failures.grown)
    state.epoch += 1
    state.held.discard(request_id)
    state.room_grew()
    cycle.released.append(request_id)
