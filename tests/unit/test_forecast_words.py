"""How the Hub words a forecast: the verdict's own reason, "starts now", and what an
estimate rests on (spawner.hub.spawner's queue message and form lines)."""

from __future__ import annotations

import time

from spawner.hub.spawner import BudgetSpawner, estimate_words, outlook_words
from spawner.readmodel.status import Outlook, QueueStatus, TeamStatus, unallocated_why

TEAM = TeamStatus("vision", "gpu", "GPU", 1.0, 0.0, 1.2, 1.5, 0.02, 7.0)


def test_the_queue_message_gives_the_verdicts_reason_for_unallocated_work() -> None:
    status = QueueStatus(
        position=1,
        waiting=1,
        team_position=1,
        team_waiting=1,
        funded=False,
        protected_s=0.0,
        estimated_start=None,
        team_funded=1.0,
        team_share=1.2,
        ground="over-burst",
    )
    message = BudgetSpawner._queue_message(None, status)
    assert "; beyond the team's burst limit next to its other funded work (its funded " in (message)
    assert "it will run unallocated (preemptible)" in message


def test_the_form_says_starts_now_and_the_verdicts_reason() -> None:
    why = unallocated_why(TEAM, ground="over-budget")
    assert why.startswith("the team's window budget is spent (its funded sessions hold 1 GPU")
    now = Outlook(False, 0.0, why, 3, 3, 1, time.time(), TEAM, starts_now=True)
    assert outlook_words(now) == f"would run unallocated, preemptible: {why}; starts now"
    later = Outlook(True, 3600.0, "", 3, 3, 0, 4e9, TEAM, basis="running sessions end soon")
    clock = time.strftime("%H:%M", time.localtime(4e9))
    assert outlook_words(later) == (
        f"would be funded, protected for 1 h; 2 ahead in the queue; estimated start about "
        f"{clock}, if running sessions end soon"
    )


def test_an_unfunded_estimate_is_not_a_promise() -> None:
    words = estimate_words(False, 4e9, 0.0, basis="running sessions end soon")
    assert "not promised (it would run unallocated), if running sessions end soon" in words
    assert estimate_words(False, None, 0.0).startswith("no start time can be promised")
    assert estimate_words(True, None, 0.0).startswith("no estimate")
