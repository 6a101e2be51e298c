"""The budget service's process: its app served on the socket ``__main__`` bound.

Reads JupyterHub's service environment (``JUPYTERHUB_SERVICE_URL``,
``JUPYTERHUB_SERVICE_PREFIX``, ``JUPYTERHUB_API_URL``, ``JUPYTERHUB_API_TOKEN``) and
``BUDGETHUB_STORE_URL``, the scheduler's store (and ``BUDGETHUB_REPLAY_REPORTS``, where
replay reports are kept: `replays`). The Hub's scheduler owns the
store's migrations; until they ran, routes answer 503.

The service ends with the Hub: on SIGTERM or SIGINT, and also when the Hub that
started it is gone without a word (SIGKILL, a crash), which it sees as its parent
process changing; otherwise each such Hub restart left one more service running.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
from urllib.parse import urlparse

from tornado.httpserver import HTTPServer

from scheduler_core.store import Store
from spawner.logfilters import redact_log_handlers
from spawner.readmodel.service.app import make_app
from spawner.readmodel.service.replays import directory_from_env
from spawner.readmodel.storeview import StoreModel


class QuietPageViews(logging.Filter):
    """JupyterHub's auth warns on every page view that needs no XSRF token ("Skipping
    XSRF check for insecure request GET …"): that is every page here, so it is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Skipping XSRF check")


async def serve(listening: socket.socket, hub: int) -> None:
    """Serve on ``listening`` until SIGTERM or SIGINT, or until ``hub`` (the pid of the
    process that started this one, read before the port listened) is no longer the
    parent."""
    logging.basicConfig(
        level=logging.INFO, format="[budget %(levelname)1.1s %(asctime)s %(name)s] %(message)s"
    )
    redact_log_handlers([logging.getLogger()])
    logging.getLogger("tornado.application").addFilter(QuietPageViews())
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101/"))
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/budget/")
    base = os.environ.get("JUPYTERHUB_BASE_URL", "/")
    store = Store.create(os.environ["BUDGETHUB_STORE_URL"], migrate_schema=False)
    app = make_app(
        StoreModel(store),
        prefix=prefix,
        hub_prefix=base.rstrip("/") + "/hub/",
        hub_api_url=os.environ.get("JUPYTERHUB_API_URL", ""),
        api_token=os.environ.get("JUPYTERHUB_API_TOKEN", ""),
        cookie_secret=secrets.token_bytes(32),
        reports=directory_from_env(),
    )
    server = HTTPServer(app, xheaders=True)
    listening.setblocking(False)
    server.add_sockets([listening])
    logging.getLogger("budgethub.service").info("budget service at %s", url.geturl())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(_until_orphaned(hub, stop))
    await stop.wait()
    watcher.cancel()
    server.stop()
    store.close()


async def _until_orphaned(parent: int, stop: asyncio.Event, every: float = 1.0) -> None:
    """Set ``stop`` once the process that started this one is no longer its parent."""
    while not stop.is_set():
        if os.getppid() != parent:
            logging.getLogger("budgethub.service").warning(
                "the Hub (pid %d) is gone; the budget service stops", parent
            )
            stop.set()
            return
        await asyncio.sleep(every)
