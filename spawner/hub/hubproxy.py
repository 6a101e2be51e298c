"""The Hub's proxy class: configurable-http-proxy, told only about routes that exist.

JupyterHub removes a server's route before every stop, also for a spawn that never
got one (a request that left the queue). The proxy answers 404 and the Hub logs
``api_request to proxy failed: 404`` at error level; a subclass that skips the call for
a BudgetSpawner that never launched a session keeps that out of the log, and keeps
every other stop exactly as stock.
"""

from __future__ import annotations

from typing import Any

from jupyterhub.proxy import ConfigurableHTTPProxy


class BudgetProxy(ConfigurableHTTPProxy):  # type: ignore[misc]
    """ConfigurableHTTPProxy that does not delete routes it was never given."""

    async def delete_user(self, user: Any, server_name: str = "") -> None:
        spawner = user.spawners.get(server_name)
        if spawner is not None and getattr(spawner, "launched", True) is False:
            self.log.debug("%s never launched a session: no route to remove", spawner._log_name)
            return
        await super().delete_user(user, server_name)
