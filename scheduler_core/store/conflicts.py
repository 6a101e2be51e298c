"""Which slices may be booked together on one GPU: the rule the store checks under its lock.

A whole GPU excludes every other booking on it; a MIG instance excludes whole and
fractional bookings of its GPU and any other booking of the same instance;
fractions share a GPU while their milli-GPUs sum to at most 1000.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler_core.model import MILLI, Slice, SliceKind
from scheduler_core.store.errors import SliceConflict


@dataclass(frozen=True, slots=True)
class Holding:
    """A slice on a node, held (or wanted) by the allocation of request ``holder``."""

    holder: str
    node: str
    slice: Slice


def check_free(held: Iterable[Holding], wanted: Iterable[Holding]) -> None:
    """Raise SliceConflict for the first wanted slice that cannot join what is held.

    ``wanted`` slices are checked against each other too, in order.
    """
    on_gpu: defaultdict[str, list[Holding]] = defaultdict(list)
    for holding in held:
        on_gpu[holding.slice.gpu_uuid].append(holding)
    for want in wanted:
        others = on_gpu[want.slice.gpu_uuid]
        blocking = _blocking(others, want.slice)
        if blocking:
            raise _conflict(want, blocking)
        others.append(want)


def _blocking(others: list[Holding], wanted: Slice) -> list[Holding]:
    """The holdings that keep ``wanted`` from being booked next to ``others``."""
    if wanted.kind is SliceKind.WHOLE:
        return others
    if wanted.kind is SliceKind.MIG:
        return [
            o
            for o in others
            if o.slice.kind is not SliceKind.MIG or o.slice.device_id == wanted.device_id
        ]
    exclusive = [o for o in others if o.slice.kind is not SliceKind.FRACTION]
    if exclusive:
        return exclusive
    if sum(o.slice.milli for o in others) + wanted.milli > MILLI:
        return others
    return []


def _conflict(want: Holding, blocking: list[Holding]) -> SliceConflict:
    holders = sorted({b.holder for b in blocking})
    device = want.slice.device_id
    where = f"{device} on node {want.node}"
    by = ", ".join(holders)
    if want.slice.kind is SliceKind.FRACTION and all(
        b.slice.kind is SliceKind.FRACTION for b in blocking
    ):
        taken = sum(b.slice.milli for b in blocking)
        message = (
            f"{where}: {want.holder} asks {want.slice.milli} milli-GPU but {by} "
            f"hold {taken} of {MILLI}"
        )
    else:
        kinds = ", ".join(sorted({b.slice.kind.value for b in blocking}))
        message = f"{where} is held by {by} ({kinds}); {want.holder} cannot book it"
    return SliceConflict(device, holders, message)
