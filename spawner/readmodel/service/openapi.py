"""The budget service's JSON API, as an OpenAPI 3.0 document (served at api/v1/openapi.json).

Written out here, next to the handlers, rather than generated: the tests hold every
response to it (and schemathesis fuzzes the API from it), so it is the contract.
"""

from __future__ import annotations

from typing import Any

NUM = {"type": "number"}
NUM_OR_NULL = {"type": "number", "nullable": True}
INT = {"type": "integer"}
STR = {"type": "string"}
STR_OR_NULL = {"type": "string", "nullable": True}
BOOL = {"type": "boolean"}
BOOL_OR_NULL = {"type": "boolean", "nullable": True}


def obj(properties: dict[str, Any], *, required: bool = True) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = sorted(properties)
    return schema


def arr(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS: dict[str, Any] = {
    "Error": obj({"error": STR, "field": STR_OR_NULL, "status": INT}),
    "Day": obj({"day": NUM, "owed_units": NUM, "delivered_units": NUM}),
    "TeamPool": obj(
        {
            "pool": STR,
            "unit": {"type": "string", "enum": ["GPU", "CPU"]},
            "share": NUM,
            "share_units": NUM,
            "used_units": NUM,
            "slurm_units": NUM,
            "budget_units": NUM,
            "used_fraction": NUM_OR_NULL,
            "holds_funded": NUM,
            "holds_unallocated": NUM,
            "ratio": NUM_OR_NULL,
            "rank": INT,
            "teams_in_pool": INT,
            "pending": INT,
            "would_fund": BOOL,
            "protected_s": NUM,
            "why_unallocated": STR,
            "daily": arr(ref("Day")),
        }
    ),
    "Session": obj(
        {
            "id": STR,
            "user": STR,
            "server": STR,
            "team": STR,
            "pool": STR,
            "profile": STR_OR_NULL,
            "class": STR,
            "nodes": arr(STR),
            "slices": STR,
            "units": NUM,
            "funded": BOOL,
            "start": NUM,
            "protected_until": NUM_OR_NULL,
            "activity": {"type": "string", "enum": ["idle", "busy", "unknown"]},
        }
    ),
    "Waiting": obj(
        {
            "id": STR_OR_NULL,
            "user": STR_OR_NULL,
            "server": STR_OR_NULL,
            "mine": BOOL,
            "team": STR,
            "pool": STR,
            "class": STR,
            "profile": STR_OR_NULL,
            "units": NUM,
            "unit": STR,
            "position": INT,
            "waiting": INT,
            "team_position": INT,
            "team_waiting": INT,
            "funded": BOOL_OR_NULL,
            "protected_s": NUM,
            "estimated_start": NUM_OR_NULL,
            "waited_s": NUM,
            "why": STR,
            "held_nodes": arr(STR),
        }
    ),
    "Snapshot": obj(
        {
            "id": INT,
            "request": STR,
            "server": STR,
            "created": NUM,
            "image": STR,
            "saved": arr(STR),
            "unsaved": {"type": "object", "additionalProperties": STR},
        }
    ),
    "Me": obj(
        {
            "user": STR,
            "now": NUM,
            "window_days": NUM,
            "max_min_runtime_s": NUM,
            "teams": arr(obj({"team": STR, "pools": arr(ref("TeamPool"))})),
            "sessions": arr(ref("Session")),
            "queued": arr(ref("Waiting")),
            "snapshots": arr(ref("Snapshot")),
        }
    ),
    "TreeNode": obj({"name": STR, "children": arr({"type": "object"})}),
    "Teams": obj(
        {
            "now": NUM,
            "window_days": NUM,
            "pools": arr(obj({"name": STR, "unit": STR, "capacity": NUM})),
            "teams": arr(
                obj(
                    {
                        "name": STR,
                        "parent": STR_OR_NULL,
                        "member": BOOL,
                        "pools": arr(ref("TeamPool")),
                        "running": INT,
                        "sessions": {"type": "array", "items": ref("Session"), "nullable": True},
                    }
                )
            ),
            "tree": arr(ref("TreeNode")),
        }
    ),
    "Queue": obj(
        {
            "now": NUM,
            "pools": arr(
                obj(
                    {
                        "pool": STR,
                        "unit": STR,
                        "total": INT,
                        "offset": INT,
                        "requests": arr(ref("Waiting")),
                    }
                )
            ),
        }
    ),
    "Nodes": obj(
        {
            "now": NUM,
            "nodes": arr(
                obj(
                    {
                        "name": STR,
                        "pool": STR,
                        "health": {
                            "type": "string",
                            "enum": ["ready", "draining", "down", "unreachable"],
                        },
                        "inventory": {"type": "string", "enum": ["virtual", "nvml", "cpu"]},
                        "unit": STR,
                        "capacity": NUM,
                        "used": NUM,
                        "free": NUM,
                        "cpus": NUM,
                        "memory_gib": NUM,
                        "cpus_used": NUM,
                        "cpus_free": NUM,
                        "memory_used_gib": NUM,
                        "memory_free_gib": NUM,
                        "held_for": STR_OR_NULL,
                        "slices": arr(
                            obj({"device": STR, "kind": STR, "held": BOOL, "by": STR_OR_NULL})
                        ),
                        "sessions": INT,
                    }
                )
            ),
        }
    ),
    "TeamSpec": obj(
        {
            "name": STR,
            "parent": STR_OR_NULL,
            "share": {"type": "object", "additionalProperties": NUM},
        }
    ),
    "AuditEntry": obj(
        {
            "id": INT,
            "time": NUM,
            "actor": STR,
            "target": STR,
            "old": {"nullable": True},
            "new": {"nullable": True},
        }
    ),
    "Admin": obj(
        {
            "now": NUM,
            "settings": obj({"lookback": NUM, "max_min_runtime": NUM}),
            "limits": {"type": "object"},
            "pools": arr(STR),
            "teams": arr(ref("TeamSpec")),
            "nodes": arr(obj({"name": STR, "pool": STR, "health": STR})),
            "applied": INT,
            "newest_change": INT,
            "scheduler_seen": BOOL,
            "audit": arr(ref("AuditEntry")),
        }
    ),
    "Changed": obj({"audit_id": INT, "changed": arr(ref("AuditEntry"))}),
    "TeamChange": {
        "type": "object",
        "properties": {
            "share": {"type": "object", "additionalProperties": {"type": "number"}},
            "parent": {"type": "string", "nullable": True},
        },
        "additionalProperties": False,
    },
    "SettingsChange": {
        "type": "object",
        "properties": {
            "lookback": {"oneOf": [{"type": "number"}, {"type": "string"}]},
            "max_min_runtime": {"oneOf": [{"type": "number"}, {"type": "string"}]},
        },
        "additionalProperties": False,
    },
    "NodeChange": {
        "type": "object",
        "properties": {"state": {"type": "string", "enum": ["ready", "draining"]}},
        "required": ["state"],
        "additionalProperties": False,
    },
}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "bad input: the field and the reason",
        401: "not logged in",
        403: "missing scope",
        404: "no such route",
        503: "the store is not ready yet",
    }
    return {
        str(code): {
            "description": words[code],
            "content": {"application/json": {"schema": ref("Error")}},
        }
        for code in codes
    }


def _get(summary: str, schema: str, *, admin: bool = False, paged: bool = False) -> dict[str, Any]:
    parameters = [
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 5000, "default": 200},
        },
        {
            "name": "offset",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 0, "default": 0},
        },
    ]
    return {
        "get": {
            **({"parameters": parameters} if paged else {}),
            "summary": summary,
            "security": [{"token": [("custom:budget:admin" if admin else "custom:budget:read")]}],
            "responses": {
                "200": {
                    "description": summary,
                    "content": {"application/json": {"schema": ref(schema)}},
                },
                **_errors(*((400,) if paged else ()), 401, 403, 503),
            },
        }
    }


def _patch(summary: str, body: str, path_param: str | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"token": ["custom:budget:admin"]}],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref(body)}},
        },
        "responses": {
            "200": {
                "description": "changed; the scheduler takes it in at its next cycle",
                "content": {"application/json": {"schema": ref("Changed")}},
            },
            **_errors(400, 401, 403, 503),
        },
    }
    if path_param:
        op["parameters"] = [
            {"name": path_param, "in": "path", "required": True, "schema": {"type": "string"}}
        ]
    return {"patch": op}


def document(prefix: str = "/services/budget/") -> dict[str, Any]:
    """The OpenAPI document, with the service's URL prefix as its server."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "budgethub budget service",
            "version": "1",
            "description": "Budgets, queue, nodes and allocation admin of the budget scheduler.",
        },
        "servers": [{"url": prefix.rstrip("/") + "/api/v1"}],
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "token": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Authorization",
                    "description": "`token <JupyterHub API token>`, or the service's login cookie",
                }
            },
        },
        "paths": {
            "/me": _get("My teams' budgets, my sessions, my queued requests", "Me"),
            "/teams": _get("Every team's share, usage and ratio; the hierarchy", "Teams"),
            "/queue": _get("Pending requests in policy order", "Queue", paged=True),
            "/nodes": _get("Slices used and free per node, health, holds", "Nodes"),
            "/admin": _get("Allocations, settings, nodes and the audit log", "Admin", admin=True),
            "/admin/teams/{team}": _patch("Change a team's shares or parent", "TeamChange", "team"),
            "/admin/settings": _patch(
                "Change the lookback window or max minimum runtime", "SettingsChange"
            ),
            "/admin/nodes/{node}": _patch("Drain a node or return it", "NodeChange", "node"),
        },
    }
