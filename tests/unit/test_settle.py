"""`Scheduler.settle`: the one follow-up loop the live scheduler and the simulator share."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from harness.builders import scheduler
from scheduler_core.scheduler import MAX_FOLLOW_UPS, Scheduler
from scheduler_core.view import Decisions, Preemption

FREED = Decisions(released=("r",))
"""A cycle that freed room it had passed over (a hold ended)."""
CALM = Decisions()


def scripted(
    monkeypatch: pytest.MonkeyPatch, step: Decisions | None, cycles: Iterable[Decisions]
) -> tuple[Scheduler, list[Decisions]]:
    """A scheduler whose step answers ``step`` and whose cycles answer ``cycles`` in turn."""
    core = scheduler()
    answers = iter(cycles)
    ran: list[Decisions] = []

    def cycle(scope: object = None) -> Decisions:
        ran.append(next(answers))
        return ran[-1]

    monkeypatch.setattr(core, "step", lambda: step)
    monkeypatch.setattr(core, "cycle", cycle)
    return core, ran


def test_nothing_to_do_runs_no_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    core, ran = scripted(monkeypatch, None, [])
    seen: list[Decisions] = []
    assert core.settle(seen.append) is None
    assert seen == [] and ran == []


def test_a_cycle_that_freed_nothing_is_not_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    core, ran = scripted(monkeypatch, CALM, [])
    assert core.settle() is CALM
    assert ran == []


def test_follow_ups_run_until_a_cycle_frees_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    preempted = Decisions(preemptions=(Preemption("x", "funded", "y"),))
    core, ran = scripted(monkeypatch, FREED, [preempted, CALM, FREED])
    seen: list[Decisions] = []
    assert core.settle(seen.append) is FREED
    assert ran == [preempted, CALM]
    assert seen == [FREED, preempted, CALM]


def test_at_most_max_follow_ups_cycles_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    core, ran = scripted(monkeypatch, FREED, [FREED] * 10)
    seen: list[Decisions] = []
    core.settle(seen.append)
    assert len(seen) == MAX_FOLLOW_UPS
    assert len(ran) == MAX_FOLLOW_UPS - 1
