"""The Hub's REST API as the embedded scheduler uses it (the `budgethub` service).

One shared client, as kubespawner shares one Kubernetes client: the scheduler
stops preempted servers and spawns again the queued ones through it, so the
Hub's own state stays true. Request ids name their server (``user/server/token``).
"""

from __future__ import annotations

import json
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest


def split_request_id(request_id: str) -> tuple[str, str]:
    """(user, server name) from a request id ``user/server/token``."""
    user, server, _token = request_id.rsplit("/", 2)
    return user, server


def server_path(request_id: str) -> str:
    """The Hub REST path of the server a request is for."""
    user, server = split_request_id(request_id)
    return f"users/{user}/servers/{server}" if server else f"users/{user}/server"


class HubClient:
    """Calls the Hub's REST API with the `budgethub` service's token."""

    def __init__(self, token: str, url: str = "", timeout: float = 30.0) -> None:
        self.token = token
        self.url = url
        """The Hub's API URL, known once a spawner or the Hub's start-up hook tells it."""
        self.timeout = timeout

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request; raises tornado's HTTPClientError, or OSError if unreachable."""
        if not self.url or not self.token:
            raise OSError("the Hub's API URL or the budgethub service token is not known")
        request = HTTPRequest(
            f"{self.url.rstrip('/')}/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
            body=json.dumps(body)
            if body is not None
            else (None if method in ("GET", "DELETE") else ""),
            request_timeout=self.timeout,
        )
        response = await AsyncHTTPClient().fetch(request)
        return json.loads(response.body) if response.body else None

    async def stop_server(self, request_id: str) -> None:
        """Ask the Hub to stop the server a request is for."""
        await self.call("DELETE", server_path(request_id))

    async def spawn_server(self, request_id: str, options: dict[str, Any]) -> None:
        """Ask the Hub to spawn the server a request is for, with its options."""
        await self.call("POST", server_path(request_id), options)
