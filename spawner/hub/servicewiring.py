"""Declare the ``budget`` service in a JupyterHub configuration (called by ``configure_hub``).

The Hub starts it (``python -m spawner.readmodel.service``), lists it in its Services menu and
routes ``/services/budget/`` to it. Its scopes are custom scopes
(``c.JupyterHub.custom_scopes``): every user gets ``custom:budget:read`` through the
``user`` role; members of the ``budget-admins`` group get ``custom:budget:admin``
through the ``budget-admin`` role. The service lists both in its
``oauth_client_allowed_scopes``, or the user model it receives would carry neither.
The store URL is resolved when the Hub starts the service (a callable in its
environment), since the configuration sets it after this runs.
"""

from __future__ import annotations

import socket
import sys

from jupyterhub.app import JupyterHub
from jupyterhub.spawner import Spawner
from traitlets.config import Config

from spawner.hub.embedded import BudgetScheduler
from spawner.readmodel.service.replays import REPORTS_ENV, default_directory

NAME = "budget"
READ = "custom:budget:read"
ADMIN = "custom:budget:admin"
ADMIN_GROUP = "budget-admins"
ACCESS = f"access:services!service={NAME}"
CUSTOM_SCOPES = {
    READ: {"description": "See team budgets, the queue, nodes, and your own sessions."},
    ADMIN: {
        "description": "Change shares, the team hierarchy and scheduler settings; drain nodes.",
        "subscopes": [READ],
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def store_url(_spawner: Spawner | None = None) -> str:
    """The scheduler's store as the Hub's configuration names it (called at service start)."""
    # The Hub's one scheduler (c.BudgetScheduler configures that class, not its bases).
    return str(BudgetScheduler.instance(config=JupyterHub.instance().config).store_url)


def replay_reports(_spawner: Spawner | None = None) -> str:
    """Where replay reports are kept (`BudgetScheduler.replay_reports`, else ``replay/``
    beside a SQLite store), for the admin page's link (called at service start)."""
    scheduler = BudgetScheduler.instance(config=JupyterHub.instance().config)
    return str(scheduler.replay_reports) or default_directory(str(scheduler.store_url))


def configure_budget_service(c: Config) -> None:
    services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
    if not any(s.get("name") == NAME for s in services):
        services.append(
            {
                "name": NAME,
                "url": f"http://127.0.0.1:{_free_port()}",
                "command": [sys.executable, "-m", "spawner.readmodel.service"],
                "environment": {"BUDGETHUB_STORE_URL": store_url, REPORTS_ENV: replay_reports},
                "oauth_client_allowed_scopes": [READ, ADMIN],
                "oauth_no_confirm": True,
            }
        )
    c.JupyterHub.services = services
    custom = dict(c.JupyterHub.custom_scopes) if "custom_scopes" in c.JupyterHub else {}
    for scope, spec in CUSTOM_SCOPES.items():
        custom.setdefault(scope, spec)
    c.JupyterHub.custom_scopes = custom
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    user_role = next((r for r in roles if r.get("name") == "user"), None)
    if user_role is None:
        user_role = {"name": "user", "scopes": ["self"]}
        roles.append(user_role)
    user_role["scopes"] = [
        *user_role.get("scopes", []),
        *(s for s in (READ, ACCESS) if s not in user_role.get("scopes", [])),
    ]
    roles = [r for r in roles if r.get("name") not in ("budget-admin", "budget-service")]
    roles.append(
        {
            "name": "budget-admin",
            "description": "Change allocations and drain nodes in the budget service",
            "scopes": [ADMIN, READ, ACCESS],
            "groups": [ADMIN_GROUP],
        }
    )
    # The service's own token: the user's servers (idle or busy) for My budget.
    roles.append({"name": "budget-service", "scopes": ["read:servers"], "services": [NAME]})
    c.JupyterHub.load_roles = roles
