"""What admins change through the budget service, its audit log, and the scheduler's status.

Kept beside `Store` (the same engine, its own short transactions) because two
processes use it: the budget service writes a change and its audit entry in one
transaction; the embedded scheduler reads the changes (cheaply: the newest audit id
says whether anything changed) and reports its cycles for /metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from scheduler_core.store.models import AdminSettingRow, AuditRow, SchedulerStatusRow
from scheduler_core.store.store import Store

ADMIN_KEYS = ("teams", "lookback", "max_min_runtime", "drained")
"""What an admin may change (see `spawner/admin.py` for how each is checked)."""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    time: float
    actor: str
    target: str
    old: Any
    new: Any


@dataclass(frozen=True, slots=True)
class SchedulerStatus:
    hub: str
    updated: float
    cycles: int
    cycle_seconds_sum: float
    cycle_buckets: tuple[tuple[float, int], ...]
    """(upper bound in seconds, cumulative count) for the finite bounds; ``cycles`` is
    the +Inf bucket (JSON has no infinity)."""
    settings: Mapping[str, Any]
    applied_audit_id: int


class AdminStore:
    """Admin overrides, the audit log and the scheduler status in a `Store`'s database."""

    def __init__(self, store: Store) -> None:
        # The store's own transactions (same package): reads, and writes that lock first.
        self._read = store._read
        self._write = store._write

    def overrides(self) -> dict[str, Any]:
        """Every admin-changed value by key."""
        with self._read() as session:
            return {row.key: row.value for row in session.scalars(select(AdminSettingRow))}

    def change(
        self,
        actor: str,
        when: float,
        values: Mapping[str, Any],
        audit: Sequence[tuple[str, Any, Any]],
    ) -> int:
        """Set admin values by key and log each change ``(target, old, new)`` in the
        audit log, in one transaction; returns the newest audit id."""
        unknown = set(values) - set(ADMIN_KEYS)
        if unknown:
            raise ValueError(f"not admin settings: {', '.join(sorted(unknown))}")
        with self._write() as session:
            for key, value in values.items():
                row = session.get(AdminSettingRow, key)
                if row is None:
                    session.add(
                        AdminSettingRow(key=key, value=value, changed=when, changed_by=actor)
                    )
                else:
                    row.value, row.changed, row.changed_by = value, when, actor
            for target, old, new in audit:
                session.add(AuditRow(time=when, actor=actor, target=target, old=old, new=new))
            session.flush()
            return int(session.scalar(select(func.max(AuditRow.id))) or 0)

    def version(self) -> int:
        """The newest audit id (0: no admin change yet); it grows with every change."""
        with self._read() as session:
            return int(session.scalar(select(func.max(AuditRow.id))) or 0)

    def audit(self, limit: int = 200) -> list[AuditEntry]:
        """The newest entries of the audit log, newest first."""
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        with self._read() as session:
            return [
                AuditEntry(r.id, r.time, r.actor, r.target, r.old, r.new)
                for r in session.scalars(query)
            ]

    def report(self, status: SchedulerStatus) -> None:
        """Insert or replace the scheduler's status row."""
        with self._write() as session:
            session.merge(
                SchedulerStatusRow(
                    hub=status.hub,
                    updated=status.updated,
                    cycles=status.cycles,
                    cycle_seconds_sum=status.cycle_seconds_sum,
                    cycle_buckets=[list(b) for b in status.cycle_buckets],
                    settings=dict(status.settings),
                    applied_audit_id=status.applied_audit_id,
                )
            )

    def statuses(self) -> list[SchedulerStatus]:
        with self._read() as session:
            return [
                SchedulerStatus(
                    hub=r.hub,
                    updated=r.updated,
                    cycles=r.cycles,
                    cycle_seconds_sum=r.cycle_seconds_sum,
                    cycle_buckets=tuple((float(b), int(n)) for b, n in r.cycle_buckets),
                    settings=dict(r.settings),
                    applied_audit_id=r.applied_audit_id,
                )
                for r in session.scalars(
                    select(SchedulerStatusRow).order_by(SchedulerStatusRow.hub)
                )
            ]
