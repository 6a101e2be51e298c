"""Verdicts: what one cycle of the policy decided for each request it looked at, and why.

A verdict says whether the request is funded and on what ground (or why not),
how long it would be protected if it started now, whether it was placed (its
node grants) or why not, and its place in the order the cycle used. Reasons
are constants with one human-readable map (`MESSAGES`), as Kueue keeps its
condition reasons, so every page and metric prints the same words for them.

Why lazy: a steady cycle looks at every waiting request (2,000 in bench.cycle)
and nearly all fail the same cheap checks, so the policy keeps one small record
per request and a `Verdict` object is built only when someone reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from scheduler_core.model import NodeGrant

__all__ = [
    "BACKFILLED",
    "BUDGET",
    "BURST",
    "DAY_SLICE",
    "DAY_SPENT",
    "FUNDED_GROUNDS",
    "HELD_ELSEWHERE",
    "HOLDING",
    "MESSAGES",
    "NO_ROOM",
    "NO_SHARE",
    "NO_VICTIMS",
    "NOT_WEIGHED",
    "OVER_BUDGET",
    "OVER_BURST",
    "OVER_SHARE_BESIDE",
    "PLACED",
    "PLACED_REASONS",
    "PREEMPTS",
    "SHARE",
    "TEAM_SLICING",
    "VICTIM_BELOW",
    "VICTIM_BORROWED",
    "VICTIM_CODES",
    "VICTIM_IDLE",
    "VICTIM_OWN",
    "Verdict",
    "Victim",
    "Verdicts",
    "message",
]

# -- funding: grounds on which a request is funded (R2, S4, S5 of docs/architecture.md)
SHARE: Final = "share"
"""Funded: with it, the team's funded sessions stay within the guaranteed part of its share."""
BUDGET: Final = "budget"
"""Funded by the window budget: the team's only funded work in the pool, within its budget."""
BURST: Final = "burst"
"""Funded by the window budget beyond the share, beside the team's other funded work (S4)."""
DAY_SLICE: Final = "day-slice"
"""Funded from the last day's share, for as long as that pays (S5)."""

# -- funding: why a request is not funded
NO_SHARE: Final = "no-share"
"""The team has no share of the pool."""
OVER_BUDGET: Final = "over-budget"
"""The team's window budget does not cover the request's protected window (R2)."""
OVER_BURST: Final = "over-burst"
"""Beyond the share, and past the burst cap (``funded_burst``) beside the team's work (R2)."""
DAY_SPENT: Final = "day-spent"
"""Larger than the team's share, and the day's share left does not pay for a slice (S5)."""
OVER_SHARE_BESIDE: Final = "over-share-beside"
"""Larger than the team's share, beside team work that is itself beyond the share (S5)."""
TEAM_SLICING: Final = "team-slicing"
"""Batch work held back while the team's own large job waits to slice the team (S6)."""

FUNDED_GROUNDS: Final = frozenset({SHARE, BUDGET, BURST, DAY_SLICE})

# -- placement: where it went, or why not (R3, R4, R7, S1, S3)
PLACED: Final = "placed"
"""Placed on free slices (R3)."""
BACKFILLED: Final = "backfilled"
"""Placed on free slices of nodes held for another request (S3)."""
PREEMPTS: Final = "preempts"
"""Placed on room made by stopping sessions (R4, or the fast lane S1)."""
NO_ROOM: Final = "no-room"
"""No free slices fit it, and as unfunded work it may stop no one (R3, R4)."""
NO_VICTIMS: Final = "no-victims"
"""No free slices fit it, and no sessions it may stop would make room (R4, S1, S4-S8)."""
HOLDING: Final = "holding"
"""Not placed; nodes are held for it until they clear (R7)."""
HELD_ELSEWHERE: Final = "held-elsewhere"
"""Not placed: it would fit but for capacity that jobs budgethub did not start hold (on
Slurm, other users' batch jobs). Set by the Hub's read model in place of NO_ROOM or
NO_VICTIMS (`spawner.runtime.foreign`); it starts once those jobs end."""

PLACED_REASONS: Final = frozenset({PLACED, BACKFILLED, PREEMPTS})

# -- victims: why a session was stopped for a request (R4, S1, S6), each with its cost
VICTIM_BORROWED: Final = "victim-borrowed"
"""Unallocated work past its grace: it ran on capacity it borrowed (R4)."""
VICTIM_IDLE: Final = "victim-idle"
"""A funded session idle longer than ``idle_release``: any funded request may stop it."""
VICTIM_BELOW: Final = "victim-below"
"""Funded work of a team that ranks below the requester's, or holds more than its share
(the fast lane, S1), past its protected window (R4)."""
VICTIM_OWN: Final = "victim-own-team"
"""The requester's own team's work past its protected window (S1, S6)."""

VICTIM_CODES: Final = frozenset({VICTIM_BORROWED, VICTIM_IDLE, VICTIM_BELOW, VICTIM_OWN})

# -- no verdict: a request the cycle did not weigh
NOT_WEIGHED: Final = "not-weighed"
"""No cycle looked at it: no node of its pool takes new work, or the policy gives no
verdicts (the baselines). Set by the read model in place of a funding ground
(`forecast.Reading.read`), and what a request with no codes at all is said to be."""

MESSAGES: Mapping[str, str] = {
    SHARE: "funded: within the team's share",
    BUDGET: "funded: the team's only work here, within its window budget",
    BURST: "funded: beyond the team's share, within its window budget (preemptible by others)",
    DAY_SLICE: "funded: a slice of the team's daily share",
    NO_SHARE: "not funded: the team has no share of this pool",
    OVER_BUDGET: "not funded: the team's window budget is spent",
    OVER_BURST: "not funded: beyond the team's burst limit next to its other funded work",
    DAY_SPENT: "not funded: larger than the team's share, and today's share is spent",
    OVER_SHARE_BESIDE: "not funded: larger than the team's share while its other work "
    "already exceeds it",
    TEAM_SLICING: "not funded: the team's large job is waiting to take its turn",
    PLACED: "placed on free capacity",
    BACKFILLED: "placed on free capacity of nodes held for another request",
    PREEMPTS: "placed by stopping preemptible sessions",
    NO_ROOM: "waiting: no free capacity fits it",
    NO_VICTIMS: "waiting: no free capacity fits it and no preemptible sessions make room",
    HOLDING: "waiting: nodes are held for it until they clear",
    VICTIM_BORROWED: "stopped: it ran unallocated on borrowed capacity, and was the cheapest"
    " to stop",
    VICTIM_IDLE: "stopped: it was idle past the release time, and was the cheapest to stop",
    VICTIM_BELOW: "stopped: its team ranks below the requester's, and it was the cheapest to stop",
    VICTIM_OWN: "stopped: the requester's own team's work, and the cheapest to stop",
    HELD_ELSEWHERE: "waiting: other jobs on the cluster hold the GPUs it needs",
    NOT_WEIGHED: "not weighed yet: no cycle has looked at it (its pool may take no new work)",
}
"""Every reason code, in words (one map for the Hub's pages, the API and /metrics)."""


def message(code: str) -> str:
    """The words for a reason code (the code itself if unknown)."""
    return MESSAGES.get(code, code)


@dataclass(frozen=True, slots=True)
class Victim:
    """One session stopped for a request: why it (a `VICTIM_CODES` code), and what its
    stopping throws away (GPU- or core-seconds; the set chosen is the cheapest that
    makes room)."""

    allocation_id: str
    code: str
    cost: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """The policy's answer for one request in one cycle."""

    request_id: str
    position: int
    """Place in the order the cycle looked at requests (0 first; per cycle, all pools)."""
    funded: bool
    ground: str
    """Why funded (a `FUNDED_GROUNDS` code) or why not."""
    protected_s: float
    """Seconds it is (if placed) or would be (if it started now) protected from preemption."""
    reason: str
    """Where it went (`PLACED_REASONS`) or why it was not placed."""
    grants: tuple[NodeGrant, ...] = ()
    """Its node grants if placed."""
    preempts: tuple[str, ...] = ()
    """Allocations stopped to make room for it."""
    victims: tuple[Victim, ...] = ()
    """The same, each with why it was chosen and its cost."""

    @property
    def placed(self) -> bool:
        return self.reason in PLACED_REASONS

    @property
    def funding_message(self) -> str:
        return message(self.ground)

    @property
    def placement_message(self) -> str:
        return message(self.reason)


class Verdicts(Mapping[str, Verdict]):
    """Request id → `Verdict`, in the order the cycle looked at them, built on read.

    ``order``: the request ids in that order; ``build(position)``: the verdict of the
    request at that position (called at most once per position)."""

    __slots__ = ("_build", "_built", "_index", "_order")

    def __init__(self, order: Sequence[str], build: Callable[[int], Verdict]) -> None:
        self._order = order
        self._build = build
        self._index: dict[str, int] | None = None
        self._built: dict[int, Verdict] = {}

    def _position(self, request_id: str) -> int:
        index = self._index
        if index is None:
            index = self._index = {r: i for i, r in enumerate(self._order)}
        return index[request_id]

    def __getitem__(self, request_id: str) -> Verdict:
        position = self._position(request_id)
        found = self._built.get(position)
        if found is None:
            found = self._built[position] = self._build(position)
        return found

    def __contains__(self, request_id: object) -> bool:
        if not isinstance(request_id, str):
            return False
        try:
            self._position(request_id)
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __repr__(self) -> str:
        return f"Verdicts({len(self._order)} requests)"
