"""What each page and API route shows, as JSON-ready dicts, filtered for who asks.

Pages and the API render the same dicts, so they always agree. A user sees every
team's totals, their own sessions and requests in full, and of other people only
what the policy order needs (team, class, size, how long they waited): no names,
servers or request ids. Admins (``custom:budget:admin``) see everything.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scheduler_core.model import Allocation, PoolKind
from spawner.admin import LIMITS, team_specs
from spawner.hubapi import split_request_id
from spawner.readmodel.storeview import DAY, State, TeamPool, Waiting, slices_text

READ = "custom:budget:read"
ADMIN = "custom:budget:admin"


@dataclass(frozen=True, slots=True)
class Viewer:
    name: str
    groups: frozenset[str]
    scopes: frozenset[str]

    @property
    def admin(self) -> bool:
        return ADMIN in self.scopes

    @property
    def can_read(self) -> bool:
        return READ in self.scopes or self.admin

    def owns(self, request_id: str) -> bool:
        return request_id.startswith(self.name + "/") and split_request_id_user(request_id) == (
            self.name
        )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _sig(value: float) -> float:
    """Six significant digits: a small share stays a share (rounding to 6 decimals made
    a sub-team's 1e-7 a 0, and the team dropped out of the ratio chart)."""
    return float(f"{value:.6g}")


def _server(request_id: str) -> str:
    try:
        return split_request_id(request_id)[1]
    except ValueError:
        return ""


def team_pool(tp: TeamPool, teams_in_pool: int, *, daily: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pool": tp.status.pool,
        "unit": tp.status.unit,
        "share": _sig(tp.share),
        "share_units": _sig(tp.status.share),
        "used_units": round(tp.used_units, 3),
        "slurm_units": round(tp.status.slurm_units, 3),
        "budget_units": round(tp.budget_units, 3),
        "used_fraction": None if tp.used_fraction is None else round(tp.used_fraction, 6),
        "holds_funded": round(tp.status.funded, 6),
        "holds_unallocated": round(tp.status.unallocated, 6),
        "ratio": None if _finite(tp.ratio) is None else round(tp.ratio, 6),
        "rank": tp.rank,
        "teams_in_pool": teams_in_pool,
        "pending": tp.pending,
        "would_fund": tp.would_fund,
        "protected_s": tp.protected_s,
        "why_unallocated": tp.why,
    }
    if daily:
        out["daily"] = [
            {"day": day, "owed_units": round(owed, 3), "delivered_units": round(delivered, 3)}
            for day, owed, delivered in tp.daily
        ]
    return out


def session(state: State, allocation: Allocation, activity: dict[str, str]) -> dict[str, Any]:
    kind = state.core.pools[allocation.pool].kind
    server = _server(allocation.id)
    return {
        "id": allocation.id,
        "user": allocation.request.user,
        "server": server,
        "team": allocation.team,
        "pool": allocation.pool,
        "profile": allocation.request.profile,
        "class": allocation.request.klass.value,
        "nodes": list(allocation.node_names),
        "slices": slices_text(allocation),
        "units": allocation.charge_rate
        if allocation.funded
        else allocation.request.charge_rate(kind),
        "funded": allocation.funded,
        "start": allocation.start,
        # An unallocated session is not protected: its protected_until is only its grace.
        "protected_until": allocation.protected_until if allocation.funded else None,
        "activity": activity.get(server, "unknown"),
    }


def waiting(state: State, w: Waiting, viewer: Viewer) -> dict[str, Any]:
    """A queued request; the viewer's own (an admin's: every one) with its estimate."""
    request, status = w.request, w.status
    kind = state.core.pools[request.pool].kind
    mine = viewer.owns(request.id)
    full = mine or viewer.admin
    out: dict[str, Any] = {
        "id": request.id if full else None,
        "user": request.user if full else None,
        "server": _server(request.id) if full else None,
        "mine": mine,
        "team": request.team,
        "pool": request.pool,
        "class": request.klass.value,
        "profile": request.profile if full else None,
        "units": request.charge_rate(kind),
        "unit": status.unit,
        "position": status.position,
        "waiting": status.waiting,
        "team_position": status.team_position,
        "team_waiting": status.team_waiting,
        "funded": status.funded,
        "protected_s": status.protected_s,
        "estimated_start": None,
        "waited_s": round(max(0.0, state.now - request.submit), 3),
        "why": w.why,
        "held_nodes": list(w.held_nodes),
    }
    if full:  # the request's user, and the admin on every row of the queue
        out["estimated_start"] = state.estimate(request.id)
    return out


def me(state: State, viewer: Viewer, activity: dict[str, str] | None = None) -> dict[str, Any]:
    activity = activity or {}
    mine = sorted(t for t in viewer.groups if t in state.core.teams.teams)
    counts = _teams_in_pool(state)
    return {
        "user": viewer.name,
        "now": state.now,
        "window_days": state.settings.lookback / DAY,
        "max_min_runtime_s": state.settings.max_min_runtime,
        "teams": [
            {
                "team": team,
                "pools": [
                    team_pool(state.teams[(team, pool)], counts[pool])
                    for pool in _pools(state)
                    if (team, pool) in state.teams
                ],
            }
            for team in mine
        ],
        "sessions": [session(state, a, activity) for a in state.running if viewer.owns(a.id)],
        "queued": [waiting(state, w, viewer) for w in state.queue if viewer.owns(w.request.id)],
        "snapshots": [
            {
                "id": s.id,
                "request": s.request_id,
                "server": s.server or _server(s.request_id),
                "created": s.created,
                "image": s.image,
                "saved": list(s.saved),
                "unsaved": dict(s.unsaved),
            }
            for s in state.snapshots
            if (s.user or split_request_id_user(s.request_id)) == viewer.name
        ],
    }


def split_request_id_user(request_id: str) -> str:
    try:
        return split_request_id(request_id)[0]
    except ValueError:
        return ""


def _pools(state: State) -> list[str]:
    """Pools with capacity (a pool without nodes has nothing to show)."""
    return [p for p in state.pools if state.core.capacity[p] > 0]


def _teams_in_pool(state: State) -> dict[str, int]:
    """How many teams a pool's rank counts: every team, a team with no share included (it
    ranks too, last), so a rank is never "3 of 2"."""
    return {pool: sum(1 for (_, p) in state.teams if p == pool) for pool in state.pools}


def _tree(state: State, parent: str | None) -> list[dict[str, Any]]:
    teams = state.core.teams.teams
    return [
        {"name": name, "children": _tree(state, name)}
        for name in sorted(teams)
        if teams[name].parent == parent
    ]


def teams(state: State, viewer: Viewer) -> dict[str, Any]:
    counts = _teams_in_pool(state)
    tree = state.core.teams.teams
    out = []
    for name in state.team_names:
        entry: dict[str, Any] = {
            "name": name,
            "parent": tree[name].parent,
            "member": name in viewer.groups,
            "pools": [
                team_pool(state.teams[(name, pool)], counts[pool])
                for pool in _pools(state)
                if (name, pool) in state.teams
            ],
            "running": sum(1 for a in state.running if a.team == name),
            "sessions": None,
        }
        if viewer.admin:
            entry["sessions"] = [session(state, a, {}) for a in state.running if a.team == name]
        out.append(entry)
    return {
        "now": state.now,
        "window_days": state.settings.lookback / DAY,
        "pools": [
            {
                "name": pool,
                "unit": state.unit(pool),
                "capacity": state.core.capacity[pool],
            }
            for pool in _pools(state)
        ],
        "teams": out,
        "tree": _tree(state, None),
    }


def queue(state: State, viewer: Viewer, *, limit: int = 200, offset: int = 0) -> dict[str, Any]:
    """Each pool's waiting requests in policy order, ``limit`` of them from ``offset``."""
    pools = []
    for pool in state.pools:
        entries = [w for w in state.queue if w.request.pool == pool]
        pools.append(
            {
                "pool": pool,
                "unit": state.unit(pool),
                "total": len(entries),
                "offset": offset,
                "requests": [waiting(state, w, viewer) for w in entries[offset : offset + limit]],
            }
        )
    return {"now": state.now, "pools": pools}


def session_label(request_id: str, viewer: Viewer) -> str:
    """A session as a person names it: ``your default server``, ``your server train``; to
    an admin, another user's ``ann's server train``; to anyone else, ``another session``
    (a request id such as ``ann//b1a18bbc`` is for the API, not for reading)."""
    try:
        user, server = split_request_id(request_id)
    except ValueError:
        return request_id if viewer.admin else "another session"
    what = f"server {server}" if server else "default server"
    if viewer.owns(request_id):
        return f"your {what}"
    return f"{user}'s {what}" if viewer.admin else "another session"


def nodes(state: State, viewer: Viewer) -> dict[str, Any]:
    def holder(request_ids: str) -> str | None:
        if not request_ids:
            return None
        return ", ".join(session_label(r.strip(), viewer) for r in request_ids.split(","))

    out = []
    for view in state.nodes:
        node = view.node
        out.append(
            {
                "name": node.name,
                "pool": node.pool,
                "health": node.health.value,
                "inventory": "virtual" if view.virtual else ("nvml" if node.gpus else "cpu"),
                "unit": view.unit,
                "capacity": view.capacity,
                "used": round(view.used, 6),
                "free": round(view.capacity - view.used, 6),
                "cpus": node.cpus,
                "memory_gib": node.memory_gib,
                "cpus_used": round(view.cpus_used, 6),
                "cpus_free": round(node.cpus - view.cpus_used, 6),
                "memory_used_gib": round(view.memory_used_gib, 6),
                "memory_free_gib": round(node.memory_gib - view.memory_used_gib, 6),
                "held_for": (
                    session_label(view.held_for, viewer)
                    if view.held_for and (viewer.admin or viewer.owns(view.held_for))
                    else ("a request that waited longer" if view.held_for else None)
                ),
                "slices": [
                    {"device": device, "kind": kind, "held": bool(by), "by": holder(by)}
                    for device, kind, by in view.slices
                ],
                "sessions": len(view.sessions),
            }
        )
    return {"now": state.now, "nodes": out}


def admin(state: State) -> dict[str, Any]:
    applied = state.status.applied_audit_id if state.status is not None else 0
    newest = state.audit[0].id if state.audit else 0
    return {
        "now": state.now,
        "settings": {key: getattr(state.settings, key) for key in LIMITS},
        "limits": {key: {"min": lo, "max": hi} for key, (lo, hi) in LIMITS.items()},
        "pools": state.pools,
        "teams": team_specs(state.core.teams.teams.values()),
        "nodes": [
            {"name": v.node.name, "pool": v.node.pool, "health": v.node.health.value}
            for v in state.nodes
        ],
        "applied": applied,
        "newest_change": newest,
        "scheduler_seen": state.status is not None,
        "audit": [
            {
                "id": e.id,
                "time": e.time,
                "actor": e.actor,
                "target": e.target,
                "old": e.old,
                "new": e.new,
            }
            for e in state.audit
        ],
    }


def unit_kind(state: State, pool: str) -> PoolKind:
    return state.core.pools[pool].kind


def names(items: Iterable[dict[str, Any]]) -> list[str]:
    return [str(i.get("name")) for i in items]
