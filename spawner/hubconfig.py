"""Wire budgethub into a JupyterHub configuration: ``configure_hub(c)``.

It selects the spawner, declares the ``budgethub`` service whose token the
embedded scheduler uses to stop preempted servers through the Hub, and starts
the scheduler as soon as the Hub runs, so that spawns queued before a restart
are queued again even if nobody opens the Hub.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any

SERVICE = "budgethub"
SCOPES = ["servers", "read:users", "read:groups"]

log = logging.getLogger(__name__)
_STARTING: set[asyncio.Task[None]] = set()
"""The start-up task, held (the event loop keeps only weak references to tasks)."""


def configure_hub(c: Any, token: str | None = None) -> None:
    """Make JupyterHub config ``c`` use BudgetSpawner with its embedded scheduler."""
    token = token or os.environ.get("BUDGETHUB_API_TOKEN") or secrets.token_hex(32)
    c.JupyterHub.spawner_class = "budget"
    # The pure-Python proxy, streaming (spawner/proxy.py): no Node.js needed.
    c.ConfigurableHTTPProxy.command = [str(Path(sys.executable).parent / "budgethub-proxy")]
    services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
    services = [s for s in services if s.get("name") != SERVICE]
    services.append({"name": SERVICE, "api_token": token, "display": False})
    c.JupyterHub.services = services
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    roles = [r for r in roles if r.get("name") != "budgethub-scheduler"]
    roles.append({"name": "budgethub-scheduler", "scopes": SCOPES, "services": [SERVICE]})
    c.JupyterHub.load_roles = roles
    c.BudgetScheduler.hub_api_token = token
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # loaded outside a running Hub (e.g. by a test reading the file)
    _STARTING.add(loop.create_task(_start_with_hub()))


async def _start_with_hub() -> None:
    """Once the Hub is up, start the scheduler and queue again the spawns it had."""
    from jupyterhub.app import JupyterHub

    from spawner.embedded import BudgetScheduler

    for _ in range(3000):  # the Hub starts within minutes or not at all
        await asyncio.sleep(0.1)
        if not JupyterHub.initialized():
            continue
        app = JupyterHub.instance()
        if getattr(app, "io_loop", None) is None or app.proxy is None:
            continue
        try:
            scheduler = BudgetScheduler.instance(config=app.config)
            await scheduler.ensure_started(app.hub.api_url)
            for _attempt in range(120):  # the Hub's API answers once its start is done
                if await scheduler.requeue_detached():
                    break
                await asyncio.sleep(0.5)
        except Exception:
            log.exception("budgethub: the embedded scheduler did not start")
        return
