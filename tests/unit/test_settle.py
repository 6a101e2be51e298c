"""`Scheduler.settle`: the one follow-up loop the live scheduler and the simulator share."""

from __future__ import annotations

from collections.abc import Iterable

from harness.builders import scheduler
from scheduler_core.scheduler import MAX_FOLLOW_UPS, Scheduler
from scheduler_core.view import Decisions, Preemption

FREED = Decisions(released=("r",))
"""A cycle that freed room it had passed over (a hold ended)."""
CALM = Decisions()


class Scripted(Scheduler):
    """A scheduler whose step answers ``step`` and whose cycles answer ``cycles`` in turn."""

    def __init__(self, step: Decisions | None, cycles: Iterable[Decisions]) -> None:
        core = scheduler()
        super().__init__(core.settings, (), (), (), core.clock, core.actuator)
        self.answer = step
        self.answers = iter(cycles)
        self.ran: list[Decisions] = []

    def step(self) -> Decisions | None:
        return self.answer

    def cycle(self, scope: Iterable[str] | None = None) -> Decisions:
        self.ran.append(next(self.answers))
        return self.ran[-1]


def scripted(
    step: Decisions | None, cycles: Iterable[Decisions]
) -> tuple[Scheduler, list[Decisions]]:
    core = Scripted(step, cycles)
    return core, core.ran


def test_nothing_to_do_runs_no_cycle() -> None:
    core, ran = scripted(None, [])
    seen: list[Decisions] = []
    assert core.settle(seen.append) is None
    assert seen == [] and ran == []


def test_a_cycle_that_freed_nothing_is_not_followed() -> None:
    core, ran = scripted(CALM, [])
    assert core.settle() is CALM
    assert ran == []


def test_follow_ups_run_until_a_cycle_frees_nothing() -> None:
    preempted = Decisions(preemptions=(Preemption("x", "funded", "y"),))
    core, ran = scripted(FREED, [preempted, CALM, FREED])
    seen: list[Decisions] = []
    assert core.settle(seen.append) is FREED
    assert ran == [preempted, CALM]
    assert seen == [FREED, preempted, CALM]


def test_at_most_max_follow_ups_cycles_in_all() -> None:
    core, ran = scripted(FREED, [FREED] * 10)
    seen: list[Decisions] = []
    core.settle(seen.append)
    assert len(seen) == MAX_FOLLOW_UPS
    assert len(ran) == MAX_FOLLOW_UPS - 1
