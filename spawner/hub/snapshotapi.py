"""The Hub's REST route for a user's own snapshots (registered by ``configure_hub``).

``GET /hub/api/budgethub/users/{name}/snapshots`` lists them (newest first, per
server; ``offered``: a start restores it) and ``…/snapshots/{key}`` gives one
snapshot's report. The token needs
``read:servers`` on that user (JupyterHub's own check), and the caller must be that
very user: an admin's token, a service or another user get 404, as for a snapshot
that does not exist, so nobody learns whether another user has one.
"""

from __future__ import annotations

import json
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from scheduler_core.store import SnapshotRecord
from spawner.hub.embedded import BudgetScheduler


def summary(record: SnapshotRecord, offered: bool) -> dict[str, Any]:
    """One snapshot; ``offered``: it is its server's latest state, so a start restores it
    (a snapshot older than the server's last stopped session is only kept)."""
    report = dict(record.report)
    return {
        "key": record.key,
        "offered": offered,
        "server": record.server,
        "node": record.node,
        "time": record.created,
        "kernel_state": report.get("kernel_state"),
        "why": report.get("why"),
        "saved": list(record.saved),
        "unsaved": dict(record.unsaved),
        "sizes": dict(record.sizes),
    }


class SnapshotsAPIHandler(APIHandler):  # type: ignore[misc]
    def _scheduler(self) -> BudgetScheduler:
        scheduler = BudgetScheduler.instance()
        if not scheduler.started:
            raise web.HTTPError(503, "the budget scheduler is not running")
        return scheduler

    def _same_user(self, user_name: str) -> None:
        current = self.current_user
        if getattr(current, "kind", None) != "user" or current.name != user_name:
            raise web.HTTPError(404, f"no snapshots of user {user_name}")

    @needs_scope("read:servers")  # type: ignore[untyped-decorator]
    async def get(self, user_name: str, key: str | None = None) -> None:
        self._same_user(user_name)
        scheduler = self._scheduler()
        store = scheduler.store
        records = list(reversed(store.list_snapshots(user=user_name)))
        offered = {
            found.key
            for found in (
                scheduler.offered_snapshot(user_name, server)
                for server in {r.server for r in records}
            )
            if found is not None
        }
        if key is None:
            self.write(json.dumps([summary(r, r.key in offered) for r in records]))
            return
        record = store.get_snapshot(key)
        if record is None or record.user != user_name:
            raise web.HTTPError(404, f"no snapshot {key}")
        self.write(
            json.dumps({**summary(record, record.key in offered), "report": dict(record.report)})
        )


HANDLERS = [
    (r"/api/budgethub/users/([^/]+)/snapshots/?", SnapshotsAPIHandler),
    (r"/api/budgethub/users/([^/]+)/snapshots/([^/]+)", SnapshotsAPIHandler),
]
