"""Funding: is an entry funded, on what ground, and for how long (R2, S5 and S6 of
docs/architecture.md). Each rule is one function; `fund` asks them in turn.

* `window_funding` (R2): within the guaranteed share, or the window budget (as the
  team's only funded work, or beside it up to the burst cap, S4);
* `oversize_slice` (S5): a job larger than the team's share is funded from the
  last day's share (its own, or a level above it that lends), for as long as that
  pays;
* `within_share_slice` (S5): a job within the share that R2 does not fund beside the
  team's work below the share is a day slice too (burst work that holds no nodes);
* `own_slice` (S6): a team's job larger than its share, waiting long enough, may
  slice its own team; until it can, the team's new batch work is not funded.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler_core.kept import Queued
from scheduler_core.model import RequestClass
from scheduler_core.policy.cycle import Cycle, Pass, Result
from scheduler_core.policy.day import lent, slice_pays
from scheduler_core.policy.victims import own_swappable
from scheduler_core.ranking import Key
from scheduler_core.rules import funding, oversize_above
from scheduler_core.verdict import (
    DAY_SLICE,
    DAY_SPENT,
    FUNDED_GROUNDS,
    NO_SHARE,
    OVER_SHARE_BESIDE,
    TEAM_SLICING,
)

__all__ = ["Funding", "Turn", "fund", "own_slice", "oversize_slice", "window_funding"]

Funding = tuple[str, float, float, bool, bool]
"""(ground, protected seconds, units charged, beside: a day slice beside the team's
other funded work, which holds no nodes; swap: a job that slices its own team)."""


class Turn:
    """One team's turn in a pool's pass: the figures that stand still until the team is
    charged (which ends the turn), and the answers that hold while nothing changes."""

    __slots__ = (
        "team",
        "rate_key",
        "leaf_units",
        "leaf_budget",
        "share_rate",
        "share_limit",
        "day_sliced",
        "day_headroom",
        "lenders",
        "afters",
        "known",
    )

    def __init__(self, cycle: Cycle, state: Pass, team: str) -> None:
        settings = cycle.settings
        self.team = team
        self.rate_key = (team, state.name)
        self.leaf_units, self.leaf_budget = state.ranking.leaf(team)
        window = cycle.view.window
        self.share_rate = self.leaf_budget / window if window > 0 else 0.0
        self.share_limit = oversize_above(self.share_rate, settings)
        """The rate above which an entry is larger than the team's share (S5)."""
        self.day_sliced = settings.guaranteed_share > 0 and cycle.day.usage is not None
        self.day_headroom: float | None = None
        self.lenders: list[tuple[tuple[str, ...], float, float]] | None = None
        self.afters: dict[float, Key] = {}
        """Per units charged, the team's key after them (R4's test)."""
        self.known: dict[int, Result] = {}
        """Per entry kind (and age class), the answer an entry of it got while nothing
        changed since (`order.judge_all`): the next such entry gets the same."""

    def day_headroom_of(self, cycle: Cycle) -> float:
        """Units the team may still be charged before its day's share (S5)."""
        if self.day_headroom is None:
            self.day_headroom = cycle.day.headroom(self.team, self.rate_key[1], self.share_rate)
        return self.day_headroom


def window_funding(cycle: Cycle, turn: Turn, entry: Queued, running: float, units: float) -> str:
    """R2: the ground on which the window budget funds the entry beside ``running``
    (the charge rate of the team's funded work), or why not (`rules.funding`)."""
    budget = turn.leaf_budget
    return funding(
        budget > 0.0 and (turn.leaf_units + units) / budget <= 1.0,
        running,
        entry.rate,
        turn.share_rate,
        cycle.settings,
    )


def own_slice(cycle: Cycle, state: Pass, turn: Turn, entry: Queued) -> bool:
    """S6: may this job, larger than its team's share and waiting at least
    ``own_slice_after``, stop its own team's work (all of it resumable and past
    protection)? If not yet, the team's later batch work is not funded this pass, so
    that it does not hold the job off."""
    settings = cycle.settings
    after = settings.own_slice_after
    if not (
        after > 0.0
        and entry.rate > turn.share_limit
        and turn.day_sliced
        and cycle.rates[turn.rate_key] > 1e-9
        and cycle.now - entry.request.submit >= after
    ):
        return False
    if own_swappable(cycle, turn.team, state.name):
        return True
    if turn.team not in state.draining:
        state.draining.add(turn.team)
        turn.known.clear()  # the team's batch work is judged differently from now on
    return False


def oversize_slice(
    cycle: Cycle,
    state: Pass,
    turn: Turn,
    entry: Queued,
    swap: bool,
    team_queues: Mapping[str, tuple[Queued, ...]],
) -> Funding:
    """S5: larger than the team's share, funded from a day's share for as long as that
    pays for it and the team's other funded work (which a swap stops), whatever the
    week's budget; beside that work it holds no nodes. Or from its parent's day,
    beside what its relatives claim (`day.lent`). Beside work beyond the share, only
    the window budget funds it (R2), as any request beyond the share."""
    protect, units, rate = entry.min_runtime, entry.units, entry.rate
    others = 0.0 if swap else cycle.rates[turn.rate_key]
    beside = others > 1e-9
    sliced = turn.day_headroom_of(cycle) / (rate + others)
    if turn.lenders is None:
        turn.lenders = lent(cycle, turn.team, team_queues, state)
    if turn.lenders:
        day = cycle.day
        sliced = max(
            sliced,
            min(
                day.subtree_headroom(members, state.name, share) / (rate + others + claimed)
                for members, share, claimed in turn.lenders
            ),
        )
    if turn.leaf_budget <= 0.0:
        ground = NO_SHARE
    elif others > turn.share_limit:
        ground = OVER_SHARE_BESIDE
    elif slice_pays(sliced, protect, cycle.settings):
        ground = DAY_SLICE
    else:
        ground = DAY_SPENT
    if ground is DAY_SLICE:
        if sliced < protect:
            protect, units = sliced, rate * sliced
    elif beside:
        beside = False
        ground = window_funding(cycle, turn, entry, others, units)
    return ground, protect, units, beside, swap


def fund(
    cycle: Cycle,
    state: Pass,
    turn: Turn,
    entry: Queued,
    team_queues: Mapping[str, tuple[Queued, ...]],
) -> Funding:
    """Funding of one entry: S6 first (may it slice its team), then S5 for a job
    larger than the share, else S6's hold on batch work, else R2, and if R2 says no
    to a job within the share beside the team's work below it, S5's day slice."""
    if entry.rate > turn.share_limit and turn.day_sliced:
        swap = own_slice(cycle, state, turn, entry)
        return oversize_slice(cycle, state, turn, entry, swap, team_queues)
    swap = False  # S6 asks only of a job larger than the share, day-sliced (`own_slice`)
    protect, units = entry.min_runtime, entry.units
    if turn.team in state.draining and entry.request.klass is RequestClass.BATCH:
        return TEAM_SLICING, protect, units, False, swap
    running = cycle.rates[turn.rate_key]
    ground = window_funding(cycle, turn, entry, running, units)
    if (
        ground not in FUNDED_GROUNDS
        and turn.day_sliced
        and turn.leaf_budget > 0.0
        and running < turn.share_limit - 1e-9
    ):
        # Within the share, but not funded beside the team's work, which is below the
        # share: a day slice too (S5), burst work that holds no nodes.
        sliced = turn.day_headroom_of(cycle) / (entry.rate + running)
        if slice_pays(sliced, protect, cycle.settings):
            if sliced < protect:
                protect, units = sliced, entry.rate * sliced
            return DAY_SLICE, protect, units, True, swap
    return ground, protect, units, False, swap
