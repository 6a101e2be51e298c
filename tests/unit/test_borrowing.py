"""A sub-team's job larger than its share is day-sliced from its parent's day too.

A parent's share is owed to the demand of its whole subtree (the daily figure
counts it so), but a sub-team's own day is often far smaller than its job. So a
job larger than the sub-team's share may also be funded from the parent's share
of the last day, for as long as that pays for the job, the sub-team's other
funded work and what its relatives claim (what they run funded and, up to their
own shares, wait for).
"""

from __future__ import annotations

from typing import Any

from harness.builders import HOUR, gpu_request, gpu_scenario, records_of
from scheduler_core.simulator import RequestRecord


def _job(rid: str, team: str, submit: float, gpus: int, **extra: Any) -> dict[str, Any]:
    """A resumable batch job (the fast-lane tests' request otherwise)."""
    return gpu_request(rid, team, submit, gpus, "batch", resumable=True, **extra)


def _run(
    extra: list[dict[str, Any]], charged: float = 91.0, **policy: Any
) -> dict[str, RequestRecord]:
    """Two 4-GPU nodes; ``p`` (half) has sub-teams ``p1`` and ``p2`` (a quarter each),
    ``o`` has the other half. ``o`` fills the cluster at 0 (its second job, beyond its
    share, runs unallocated). ``p1`` was charged ``charged`` GPU-h an hour ago: by
    default 91, far past its own day (48 GPU-h), 5 GPU-h short of p's (96). At 10 min
    it asks for 4 GPUs."""
    teams = [
        {"name": "p", "share": {"gpu": 0.5}},
        {"name": "p1", "share": 0.5, "parent": "p"},
        {"name": "p2", "share": 0.5, "parent": "p"},
        {"name": "o", "share": {"gpu": 0.5}},
    ]
    requests = [
        _job("o-1", "o", 0, 4),
        _job("o-2", "o", 1, 4),
        _job("p1-big", "p1", 600, 4, duration=3 * HOUR),
        *extra,
    ]
    usage = {"p1": charged * HOUR}
    return records_of(gpu_scenario(requests, usage=usage, teams=teams, name="borrowing", **policy))


def test_a_sub_team_slices_its_parents_day_while_its_sibling_is_idle() -> None:
    records = _run([])
    assert records["o-2"].funded[0] is False
    # p's day pays 4 GPUs for 1.25 h: funded, it stops o's unallocated job at once.
    # Without the rule p1's own day is spent: unfunded, it may stop no one, and waits
    # for o's jobs to end at 20 h.
    big = records["p1-big"]
    assert big.starts[0] < HOUR and big.funded[0]
    assert records["o-2"].preemptions >= 1


def test_a_waiting_sibling_keeps_its_part_of_the_parents_day() -> None:
    # p2 waits for 2 GPUs, one on each node (o's funded job holds n-0 for its
    # protected hour): it runs nothing, but what it waits for, within its share, is
    # its claim. With p1 charged 94.8 GPU-h, p's 1.2 GPU-h over 4 + 2 GPUs pay 12 min,
    # less than the shortest slice (15 min, `debug_min_runtime`), so p1's job is not
    # funded and does not start before o's work ends; counted without the claim, it
    # would be funded for 18 min.
    gang = _job("p2-gang", "p2", 300, 1, nodes=2, duration=2 * HOUR)
    records = _run([gang], charged=94.8)
    big = records["p1-big"]
    assert not records["p2-gang"].starts or records["p2-gang"].starts[0] >= HOUR
    assert not any(f for s, f in zip(big.starts, big.funded, strict=True) if s < HOUR)


def test_a_cycle_over_new_arrivals_still_counts_the_relatives_claims() -> None:
    # As above, with no full cycle due when p1's job arrives (the budget is looked at
    # again only hourly): a cycle over the new request alone would not see p2's
    # waiting gang, and would fund p1's job for 18 min. A sub-team's arrival is
    # weighed against the whole queue.
    gang = _job("p2-gang", "p2", 300, 1, nodes=2, duration=2 * HOUR)
    records = _run([gang], charged=94.8, budget_recheck="1h")
    big = records["p1-big"]
    assert not any(f for s, f in zip(big.starts, big.funded, strict=True) if s < HOUR)
