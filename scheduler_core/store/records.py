"""The store's own value types: request states, events and snapshot records.

The scheduling vocabulary (nodes, requests, allocations) lives in
``scheduler_core.model``; these types describe only what the store adds to it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class RequestState(enum.StrEnum):
    """Where a request is in its life. ``requeued`` ones wait in the queue again."""

    PENDING = "pending"
    ADMITTED = "admitted"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    REQUEUED = "preempted-requeued"


WAITING_STATES = (RequestState.PENDING, RequestState.REQUEUED)
"""States of requests that are in the queue, waiting for an allocation."""


@dataclass(frozen=True, slots=True)
class RequestStatus:
    state: RequestState
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class RequestForecast:
    """What the Hub told a request's user when it was submitted: the policy's next cycle
    run dry with the request added, and the scheduler run forward from the live state
    (`scheduler_core.forecast`, through the read model's `QueueView.outlook`). Kept with
    the request as it was said, never recomputed (issue 51)."""

    time: float
    """When the forecast was made (the submit, on the Hub's clock)."""
    start: float | None
    """The estimated start (epoch seconds): ``time`` when it starts now; None when the
    forward run did not start it within its horizon (no estimate was shown)."""
    starts_now: bool
    """The dry run of the next cycle admitted it."""
    funded: bool
    """The funding forecast: funded by its team's budget if it starts as forecast."""
    protected_s: float
    """How long it would be protected if funded (0 when it would run unallocated)."""
    position: int
    """1 + how many of its pool's waiting requests the dry run's order left ahead of it."""
    waiting: int
    """How many of its pool's requests that order held (itself included)."""


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One entry of the append-only event log."""

    id: int
    time: float
    kind: str
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """A saved session: whose, where and when it was taken, and what was or was not saved.

    ``key`` names it (its directory in the snapshot store, and what a restore asks
    for). ``unsaved`` maps each item that could not be saved to the reason, so that
    nothing is dropped silently; ``report`` is the whole account the user is shown.
    """

    id: int
    request_id: str
    allocation_id: int | None
    created: float
    image: str
    saved: tuple[str, ...]
    unsaved: Mapping[str, str]
    key: str = ""
    user: str = ""
    server: str = ""
    node: str | None = None
    sizes: Mapping[str, Any] = field(default_factory=dict)
    kernels: tuple[Any, ...] = ()
    report: Mapping[str, Any] = field(default_factory=dict)
