"""The scheduler's persistent store: SQLAlchemy models, Alembic migrations and `Store`.

`Store.create(url)` opens SQLite (a file, or memory for tests) or PostgreSQL and
migrates it; its methods take and return the frozen dataclasses of
`scheduler_core.model`, so the policy never sees the ORM.
"""

from scheduler_core.store.errors import SliceConflict, StoreError
from scheduler_core.store.records import (
    EventRecord,
    RequestForecast,
    RequestState,
    RequestStatus,
    SnapshotRecord,
)
from scheduler_core.store.store import Store

__all__ = [
    "EventRecord",
    "RequestForecast",
    "RequestState",
    "RequestStatus",
    "SliceConflict",
    "SnapshotRecord",
    "Store",
    "StoreError",
]
