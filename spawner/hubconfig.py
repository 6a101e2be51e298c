"""Wire budgethub into a JupyterHub configuration: ``configure_hub(c)``.

It selects the spawner, declares the ``budgethub`` service whose token the
embedded scheduler uses to stop preempted servers through the Hub, and starts
the scheduler as soon as the Hub runs, so that spawns queued before a restart
are queued again even if nobody opens the Hub. It also runs the Node.js
configurable-http-proxy installed in ``proxy/`` (``spawner/chp.py``), keeps
tokens out of the Hub's and the proxy's logs, makes the Hub's state files
readable by their owner only, and lifts JupyterHub's limit on pending spawns
(a session waiting in the queue is a pending spawn).

The Hub's own pages get budgethub's template overrides (``spawner/hub/templates/``,
first in ``template_paths``; each extends the stock template it replaces) and the
``budgethub`` template variable (``spawner/hub/pages.py``). A refused spawn (the form or
the REST API) is logged as one WARNING line, its message cut short, instead of the
Hub's ERROR (and, for the form, its traceback): it is the user's input, answered with a
message naming the field, not a fault of the Hub.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jupyterhub.app import JupyterHub
from sqlalchemy.engine import make_url
from traitlets.config import Config

from spawner import chp
from spawner.hub import mysessions, queuecontrol, snapshotapi
from spawner.hub.embedded import BudgetScheduler
from spawner.hub.pages import page_vars
from spawner.hub.servicewiring import configure_budget_service
from spawner.logfilters import redact_log_handlers

SERVICE = "budgethub"
TEMPLATES = Path(__file__).resolve().parent / "hub" / "templates"
SCOPES = ["servers", "read:users", "read:groups"]

UMASK = 0o077
"""Files the Hub creates (its database, the scheduler's, the cookie secret, pid files,
logs) are readable and writable by their owner only."""
REDACT_FILTER = "budgethub_redact"
REFUSAL_FILTER = "budgethub_refusals"

log = logging.getLogger(__name__)
_STARTING: set[asyncio.Task[None]] = set()
"""The start-up task, held (the event loop keeps only weak references to tasks)."""


class ProxyNotInstalled(RuntimeError):
    """The Node.js proxy (or Node.js itself) is missing: ``make`` installs both."""


def proxy_command() -> list[str]:
    """The command that runs the local configurable-http-proxy through ``spawner/chp.py``."""
    node = shutil.which("node")
    if node is None:
        raise ProxyNotInstalled(
            "budgethub: Node.js (`node`) is not on PATH, so the Hub's proxy cannot run; "
            f"run `make proxy` in {chp.ROOT} (make demo and make test do it too; "
            "it installs nodejs and npm with apt-get if missing)"
        )
    if not chp.CHP_BIN.is_file():
        raise ProxyNotInstalled(
            f"budgethub: the Hub's proxy is not installed ({chp.CHP_BIN} is missing); "
            f"run `make proxy` in {chp.ROOT} (make demo and make test do it too: "
            "npm ci in proxy/)"
        )
    return [sys.executable, "-I", str(Path(chp.__file__).resolve()), node, str(chp.CHP_BIN)]


def configure_hub(c: Config, token: str | None = None) -> None:
    """Make JupyterHub config ``c`` use BudgetSpawner with its embedded scheduler."""
    token = token or os.environ.get("BUDGETHUB_API_TOKEN") or secrets.token_hex(32)
    os.umask(UMASK)  # before the Hub creates its files (it loads this config first)
    c.JupyterHub.spawner_class = "budget"
    # An operator's own proxy command (set before this call) or external proxy is kept.
    if "command" not in c.ConfigurableHTTPProxy and c.ConfigurableHTTPProxy.get(
        "should_start", True
    ):
        c.ConfigurableHTTPProxy.command = proxy_command()
    # Every queued session is a pending spawn: JupyterHub's default limit (100) would
    # answer 429 to the 101st user. 0 = no limit, unless the operator chose one.
    if "concurrent_spawn_limit" not in c.JupyterHub:
        c.JupyterHub.concurrent_spawn_limit = 0
    if "proxy_class" not in c.JupyterHub:  # skips removing routes a queued spawn never had
        c.JupyterHub.proxy_class = "spawner.hub.hubproxy.BudgetProxy"
    paths = list(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    c.JupyterHub.template_paths = [str(TEMPLATES), *(p for p in paths if p != str(TEMPLATES))]
    template_vars = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    template_vars.setdefault("budgethub", page_vars)
    c.JupyterHub.template_vars = template_vars
    c.JupyterHub.logging_config = _with_redaction(
        dict(c.JupyterHub.logging_config) if "logging_config" in c.JupyterHub else {}
    )
    services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
    services = [s for s in services if s.get("name") != SERVICE]
    services.append({"name": SERVICE, "api_token": token, "display": False})
    c.JupyterHub.services = services
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    roles = [r for r in roles if r.get("name") != "budgethub-scheduler"]
    roles.append({"name": "budgethub-scheduler", "scopes": SCOPES, "services": [SERVICE]})
    c.JupyterHub.load_roles = roles
    c.BudgetScheduler.hub_api_token = token
    # The REST routes: a user's snapshots, My sessions, the admin's queue control.
    ours = [*snapshotapi.HANDLERS, *mysessions.HANDLERS, *queuecontrol.HANDLERS]
    handlers = list(c.JupyterHub.extra_handlers) if "extra_handlers" in c.JupyterHub else []
    c.JupyterHub.extra_handlers = [*handlers, *(h for h in ours if h not in handlers)]
    configure_budget_service(c)  # the budget service: pages, API, /metrics, admin
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # loaded outside a running Hub (e.g. by a test reading the file)
    _STARTING.add(loop.create_task(_start_with_hub()))


async def _start_with_hub() -> None:
    """Once the Hub is up, start the scheduler and queue again the spawns it had."""
    for _ in range(3000):  # the Hub starts within minutes or not at all
        await asyncio.sleep(0.1)
        if not JupyterHub.initialized():
            continue
        app = JupyterHub.instance()
        if getattr(app, "io_loop", None) is None or app.proxy is None:
            continue
        redact_log_handlers([logging.getLogger(), app.log])
        restrict_files(state_files(app))
        try:
            scheduler = BudgetScheduler.instance(config=app.config)
            # Once started (now, or after safe mode), it queues again the spawns it had.
            await scheduler.ensure_started(app.hub.api_url)
            restrict_files(sqlite_files(scheduler.store_url))
        except Exception:
            log.exception("budgethub: the embedded scheduler did not start")
        return


def _with_redaction(config: dict[str, Any]) -> dict[str, Any]:
    """``logging_config`` with the redaction filter on the Hub's console handler.

    traitlets rebuilds the handlers from this dict whenever a logging setting
    changes, so a filter given here stays on; ``redact_log_handlers`` adds it to
    handlers set up in other ways once the Hub runs.
    """
    config = dict(config)
    filters = dict(config.get("filters", {}))
    filters[REDACT_FILTER] = {"()": "spawner.chp.RedactFilter"}
    filters[REFUSAL_FILTER] = {"()": "spawner.logfilters.QuietRefusalFilter"}
    config["filters"] = filters
    handlers = {name: dict(h) for name, h in config.get("handlers", {}).items()}
    handlers.setdefault("console", {})
    for handler in handlers.values():
        names = list(handler.get("filters", []))
        for name in (REFUSAL_FILTER, REDACT_FILTER):
            if name not in names:
                names.append(name)
        handler["filters"] = names
    config["handlers"] = handlers
    return config


def sqlite_files(url: str) -> list[Path]:
    """A SQLite database's file and its -wal, -shm and -journal files (none for others)."""
    try:
        parsed = make_url(url)
    except Exception:
        return []
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return []
    database = Path(str(parsed.database))
    return [database] + [
        database.with_name(database.name + s) for s in ("-wal", "-shm", "-journal")
    ]


def state_files(app: JupyterHub) -> list[Path]:
    """The files the Hub keeps its state and secrets in, and its log files."""
    paths = sqlite_files(str(app.db_url))
    for name in ("cookie_secret_file", "pid_file"):
        if getattr(app, name, ""):
            paths.append(Path(getattr(app, name)))
    if getattr(app.proxy, "pid_file", ""):
        paths.append(Path(app.proxy.pid_file))
    for logger in (logging.getLogger(), app.log):
        for handler in logger.handlers:
            if isinstance(handler, logging.FileHandler):
                paths.append(Path(handler.baseFilename))
    return paths


def restrict_files(paths: Iterable[Path]) -> None:
    """Make the files that exist among ``paths`` readable and writable by their owner only."""
    for path in paths:
        try:
            if path.is_file() and path.stat().st_mode & 0o077:
                path.chmod(0o600)
        except OSError as error:
            log.warning("budgethub: could not make %s private: %s", path, error)
