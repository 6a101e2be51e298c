"""Idle sessions: the first victims, and with ``idle_release`` free to any funded request.

Run through the simulator, which reports idleness to the scheduler as the live
actuator does (``Scheduler.mark_activity``), so the same policy code is tested.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.builders import HOUR, gpu_request, gpu_scenario, records_of
from scheduler_core.errors import InputError
from scheduler_core.scenario import parse_scenario


def _scenario(requests: list[dict[str, Any]], **policy: Any) -> dict[str, Any]:
    """Two 4-GPU nodes with 32 CPUs each (`gpu_scenario`). b has used far more than its
    share lately: it ranks below a, so its funded requests may not stop a's funded
    sessions by the rank rule alone."""
    usage = {"b": 4 * 24 * 5 * HOUR}
    return gpu_scenario(requests, cpus=32, usage=usage, name="idle", **policy)


def _notebook(rid: str, team: str, submit: float, gpus: int, **extra: Any) -> dict[str, Any]:
    return gpu_request(rid, team, submit, gpus, "interactive", **extra)


def test_an_idle_session_is_stopped_before_one_that_would_lose_less_work() -> None:
    # Two unallocated sessions of a (its funded room taken by a0); x started first, so
    # by lost work alone y (younger) would go. x has been idle since 10 minutes in.
    def requests(idle: bool) -> list[dict[str, Any]]:
        x_extra = {"idle_after": 600} if idle else {}
        return [
            _notebook("a0", "a", 0, 4),
            _notebook("x", "a", 1, 2, **x_extra),
            _notebook("y", "a", 60, 2),
            _notebook("bb", "b", 3 * HOUR, 2),
        ]

    # funded_burst 1: a's funded room ends at its share, so x and y run unallocated.
    busy = records_of(_scenario(requests(idle=False), funded_burst=1))
    assert not busy["x"].funded[0] and not busy["y"].funded[0]
    assert (busy["x"].preemptions, busy["y"].preemptions) == (0, 1)
    idle = records_of(_scenario(requests(idle=True), funded_burst=1))
    assert (idle["x"].preemptions, idle["y"].preemptions) == (1, 0)
    assert idle["bb"].starts[0] == 3 * HOUR


def test_idle_release_lets_any_funded_request_stop_an_idle_funded_session() -> None:
    # a's one funded session holds a whole node; the other node is full of a's funded
    # work too. b's funded request ranks below a, so only idleness can free room.
    requests = [
        _notebook("a1", "a", 0, 4, idle_after=HOUR),
        _notebook("a2", "a", 0, 4),
        # Off the 5-minute budget rechecks, so only the idle wake can start it at 1.5 h.
        _notebook("b1", "b", 1.27 * HOUR, 2),
    ]
    # funded_burst 2: a's window budget funds both of its sessions.
    kept = records_of(_scenario(requests, funded_burst=2))
    assert kept["a2"].funded == [True]
    assert kept["a1"].funded == [True] and kept["a1"].preemptions == 0
    assert kept["b1"].starts == [] or kept["b1"].starts[0] >= 20 * HOUR

    released = records_of(_scenario(requests, idle_release=1800, funded_burst=2))
    # Idle since 1 h, releasable from 1.5 h: b1 starts then, not at the next budget check.
    assert released["a1"].ends[0] == pytest.approx(1.5 * HOUR)
    assert released["b1"].starts[0] == pytest.approx(1.5 * HOUR)
    assert released["b1"].funded[0]
    assert released["a2"].preemptions == 0


def test_idle_release_waits_for_the_protected_window() -> None:
    requests = [
        _notebook("a1", "a", 0, 4, idle_after=60, min_runtime=4 * HOUR),
        _notebook("a2", "a", 0, 4, min_runtime=4 * HOUR),
        _notebook("b1", "b", 0.5 * HOUR, 2),
    ]
    records = records_of(_scenario(requests, idle_release=600, funded_burst=2))
    assert records["b1"].starts[0] == pytest.approx(4 * HOUR)


def test_a_session_is_idle_again_only_after_idle_after_of_its_new_run() -> None:
    # Idle, a1 is stopped for b1 at 1.5 h. It does not stop b1 in return (S10): it comes
    # back when a2 ends at 20 h (the simulator requeues it). Its new run is busy at
    # first, so b2, waiting for 4 GPUs from 20.25 h, stops it no sooner than 1 h + 30
    # min into it.
    requests = [
        _notebook("a1", "a", 0, 4, idle_after=HOUR),
        _notebook("a2", "a", 0, 4),
        _notebook("b1", "b", 1.25 * HOUR, 2, duration=30 * HOUR),
        _notebook("b2", "b", 20.25 * HOUR, 4),
    ]
    # guaranteed_share 2: a1 comes back within a's guaranteed room.
    records = records_of(_scenario(requests, idle_release=1800, funded_burst=2, guaranteed_share=2))
    a1 = records["a1"]
    assert records["b1"].preemptions == 0
    assert a1.preemptions >= 2
    for start, end in zip(a1.starts[: a1.preemptions], a1.ends, strict=False):
        assert end - start >= 1.5 * HOUR - 1e-6


def test_idle_after_is_checked_like_every_field() -> None:
    scenario = _scenario([_notebook("a1", "a", 0, 1, idle_after=-5)])
    with pytest.raises(InputError) as error:
        parse_scenario(scenario)
    assert error.value.where == "requests[0].idle_after"


def test_idle_release_is_a_duration_setting() -> None:
    scenario = _scenario([_notebook("a1", "a", 0, 1)], idle_release="30m")
    assert parse_scenario(scenario).settings.idle_release == 1800
    with pytest.raises(InputError) as error:
        parse_scenario(_scenario([], idle_release="soon"))
    assert "idle_release" in error.value.where
