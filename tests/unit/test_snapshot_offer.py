"""Issue 50: a snapshot is offered ("Start" restores it) only while it is its server's
latest state. A session of the server that ran and was stopped (restored or fresh) ends
the offer; the snapshot is kept, and a later preemption's snapshot is offered again. The
end is in the event log, so a new Hub process answers the same."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness import builders
from scheduler_core.model import Allocation, NodeGrant, Request, Team
from scheduler_core.store import Store
from spawner.hub.embedded import BudgetScheduler
from spawner.hub.mysessions import rows_of
from spawner.runtime.snaprecord import snapshot_sentence

REPORT = {
    "kernels": [
        {"notebook": "a.ipynb", "variables": ["x", "df", "n"]},
        {"notebook": "work/b.ipynb", "variables": ["m"]},
    ],
    "kernel_state": "saved",
    "files": "kept in the home",
}


def _store(tmp_path: Path) -> Store:
    return builders.store(
        builders.sqlite_file_url(tmp_path),
        pools=builders.pools().values(),
        teams=[Team("guests", {})],
    )


def _scheduler(store: Store) -> BudgetScheduler:
    scheduler = BudgetScheduler()
    scheduler.started = True
    scheduler.store = store
    scheduler.core = SimpleNamespace(running={}, pending={})  # type: ignore[assignment]
    return scheduler


def _request(rid: str, submit: float) -> Request:
    return Request(rid, "gus", "guests", "gpu", submit, gpus=1)


def _snapshot(store: Store, request: Request, created: float, key: str) -> None:
    store.add_request(request)
    store.save_snapshot(
        request.id,
        created,
        "img",
        key=key,
        server="",
        node="gpu-1",
        report={**REPORT, "key": key},
    )


def _allocation(request: Request, start: float) -> Allocation:
    grant = NodeGrant("gpu-1", (), cpus=1, memory_gib=4)
    return Allocation(request, (grant,), start, True, start + 3600, 1.0)


class _User:
    """What rows_of reads of a Hub user: no running spawner, no options."""

    name = "gus"
    spawners: dict[str, Any] = {}
    orm_spawners: dict[str, Any] = {}


def test_a_stopped_restored_session_ends_the_offer_and_a_new_preemption_renews_it(
    tmp_path: Path,
) -> None:
    with _store(tmp_path) as store:
        scheduler = _scheduler(store)
        first = _request("gus//a", 10.0)
        _snapshot(store, first, 100.0, "20261206T100000-aaaaaaaa")
        offered = scheduler.offered_snapshot("gus", "")
        assert offered is not None and offered.key == "20261206T100000-aaaaaaaa"
        restored_by_default = scheduler.restorable("gus", "", None)
        assert restored_by_default is not None and restored_by_default.key == offered.key
        notice = scheduler.snapshot_notice("gus", "") or ""
        assert "Stopped at" in notice and "on gpu-1" in notice
        assert "4 variables of 2 notebooks come back" in notice
        assert "(in a.ipynb, work/b.ipynb)" in notice and "tick" not in notice
        [row] = rows_of(scheduler, _User())
        assert (row.state, row.offered) == ("snapshot", True)
        assert "Start fresh ignores it" in row.snapshot_line

        # Restored at 200, worked in, stopped by its user: the snapshot is kept, not offered.
        restored = _request("gus//b", 150.0)
        store.add_request(restored)
        scheduler.core.running[restored.id] = _allocation(restored, 200.0)
        [row] = rows_of(scheduler, _User())
        assert row.state == "starting" and not row.offered  # its spawner not ready here
        assert "This session started after it" in row.snapshot_line
        assert "come back" not in row.snapshot_line
        scheduler._session_ended(scheduler.core.running.pop(restored.id))
        assert scheduler.offered_snapshot("gus", "") is None
        assert scheduler.restorable("gus", "", None) is None  # a plain start restores nothing
        assert scheduler.snapshot_notice("gus", "") is None
        assert scheduler.home_snapshot_notice("gus") is None
        kept = scheduler.kept_snapshot_notice("gus", "") or ""
        assert "An older snapshot, taken at" in kept and "4 variables of 2 notebooks" in kept
        assert "a start does not restore it" in kept
        [row] = rows_of(scheduler, _User())
        assert (row.state, row.offered) == ("stopped", False)
        assert row.snapshot_line == kept
        # Still the user's to restore by name, and to delete.
        named = scheduler.restorable("gus", "", "20261206T100000-aaaaaaaa")
        assert named is not None

        # A new Hub process reads the end from the event log.
        again = _scheduler(store)
        assert again.offered_snapshot("gus", "") is None

        # Preempted again at 300: that snapshot is the latest state, and offered.
        _snapshot(store, _request("gus//c", 250.0), 300.0, "20261206T110000-bbbbbbbb")
        offered = again.offered_snapshot("gus", "")
        assert offered is not None and offered.key == "20261206T110000-bbbbbbbb"
        assert again.kept_snapshot_notice("gus", "") is None


def test_a_preempted_sessions_own_stop_does_not_end_its_snapshots_offer(tmp_path: Path) -> None:
    """The Hub stops a preempted server after its snapshot was taken: that session started
    before the snapshot, so the offer stands."""
    with _store(tmp_path) as store:
        scheduler = _scheduler(store)
        request = _request("gus//a", 10.0)
        _snapshot(store, request, 100.0, "20261206T100000-aaaaaaaa")
        scheduler._session_ended(_allocation(request, 20.0))
        assert scheduler.offered_snapshot("gus", "") is not None
        assert scheduler.offered_snapshot("gus", "other") is None  # per server


def test_the_snapshot_sentence_names_no_control_of_any_page() -> None:
    sentence = snapshot_sentence({**REPORT, "key": "K"})
    assert "Start fresh" not in sentence and "tick" not in sentence
    assert "1 variable" not in snapshot_sentence({"key": "K", "kernels": []})
