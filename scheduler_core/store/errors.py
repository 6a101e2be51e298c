"""Errors the store raises: a slice already taken, or a record that is missing or clashes."""

from __future__ import annotations

from collections.abc import Sequence


class StoreError(Exception):
    """A store operation that cannot be done as asked (unknown id, wrong state, duplicate)."""


class SliceConflict(StoreError):
    """A slice to be booked is already held by an active allocation.

    ``device_id`` is the GPU or MIG instance in question and ``holders`` the
    request ids of the active allocations that hold it.
    """

    def __init__(self, device_id: str, holders: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.device_id = device_id
        self.holders = tuple(holders)
