"""The usage ledger: any order of changes gives the same charges.

A Hub restart replays the store's usage records and adopts running sessions;
sessions of one team overlap in time, so these changes reach the ledger out of
time order (the restart defect: the ledger raised and the Hub dropped every
session).
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.ledger import UsageLedger

Interval = tuple[float, float, float]

intervals = st.lists(
    st.tuples(
        st.integers(0, 1000).map(float),
        st.integers(1, 500).map(float),
        st.sampled_from([0.25, 1.0, 2.0, 8.0]),
    ),
    min_size=1,
    max_size=12,
)


def _expected(sessions: list[Interval], start: float, end: float) -> float:
    total = 0.0
    for begin, length, rate in sessions:
        overlap = min(end, begin + length) - max(start, begin)
        total += rate * max(0.0, overlap)
    return total


@settings(max_examples=200, deadline=None)
@given(intervals, st.randoms(use_true_random=False))
def test_charges_do_not_depend_on_the_order_of_changes(
    sessions: list[Interval], rng: random.Random
) -> None:
    changes = []
    for begin, length, rate in sessions:
        changes.append((begin, rate))
        changes.append((begin + length, -rate))
    rng.shuffle(changes)
    ledger = UsageLedger()
    for when, delta in changes:
        if delta > 0:
            ledger.start_charging("nlp", "gpu", when, delta)
        else:
            ledger.stop_charging("nlp", "gpu", when, -delta)
    for start, end in ((0.0, 2000.0), (100.0, 400.0), (250.0, 251.0), (900.0, 1600.0)):
        assert (
            abs(ledger.charged("nlp", "gpu", start, end) - _expected(sessions, start, end)) < 1e-6
        )
    assert abs(ledger.rate("nlp", "gpu")) < 1e-9


def test_two_overlapping_sessions_replayed_in_start_order() -> None:
    """What the Hub's start-up does: each record as start then stop, by start time."""
    ledger = UsageLedger()
    ledger.start_charging("nlp", "gpu", 0.0, 1.0)
    ledger.stop_charging("nlp", "gpu", 100.0, 1.0)
    ledger.start_charging("nlp", "gpu", 50.0, 1.0)  # overlapped the first
    ledger.stop_charging("nlp", "gpu", 150.0, 1.0)
    ledger.add("nlp", "gpu", 10.0, 5.0)  # seeded history, also in the past
    assert ledger.charged("nlp", "gpu", 0.0, 200.0) == 205.0
    assert ledger.charged("nlp", "gpu", 60.0, 110.0) == 90.0
    assert ledger.rate("nlp", "gpu") == 0.0


def test_a_change_in_a_window_already_handed_out_bumps_the_revision() -> None:
    ledger = UsageLedger()
    ledger.start_charging("nlp", "gpu", 100.0, 1.0)
    window = ledger.window(0.0, 200.0)
    ledger.start_charging("nlp", "gpu", 50.0, 1.0)
    assert ledger.revision != window.revision
