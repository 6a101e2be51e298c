"""Admin changes, the audit log and the scheduler's status on SQLite and PostgreSQL."""

from __future__ import annotations

from scheduler_core.store import Store
from scheduler_core.store.admin import AdminStore, SchedulerStatus


def test_admin_changes_audit_and_status_round_trip(store_url: str) -> None:
    with Store.create(store_url) as store:
        records = AdminStore(store)
        teams = [{"name": "nlp", "parent": None, "share": {"gpu": 0.3}}]
        first = records.change("boss", 1.5, {"teams": teams}, [("teams.nlp.share.gpu", 0.5, 0.3)])
        second = records.change(
            "eve", 2.5, {"teams": teams, "lookback": 3600.0}, [("lookback", 604800.0, 3600.0)]
        )
        assert second == first + 1 == records.version()
        assert records.overrides() == {"teams": teams, "lookback": 3600.0}
        assert [(e.actor, e.target, e.old, e.new) for e in records.audit()] == [
            ("eve", "lookback", 604800.0, 3600.0),
            ("boss", "teams.nlp.share.gpu", 0.5, 0.3),
        ]
        status = SchedulerStatus(
            "hub", 3.0, 7, 0.25, ((0.001, 2), (0.5, 7)), {"lookback": 3600.0}, 2
        )
        records.report(status)
        records.report(SchedulerStatus("hub", 4.0, 8, 0.3, ((0.001, 2), (0.5, 8)), {}, 2))
        assert [s.cycles for s in records.statuses()] == [8]
