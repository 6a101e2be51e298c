"""``budgethub-proxy``: the pure-Python configurable-http-proxy, streaming responses.

The PyPI proxy (configurable-http-proxy 0.4) reads a whole response before it
answers and gives up after tornado's 20 s request timeout, so the spawn page's
progress stream (Server-Sent Events: queue position, estimated start) never
reaches the browser. This launcher runs that same proxy with its forwarding
method replaced by one that passes headers and body chunks on as they arrive.
Everything else (routes, REST API, websockets, options) is the upstream proxy.
"""

from __future__ import annotations

import sys
from typing import Any

from configurable_http_proxy import cli, handlers
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.iostream import StreamClosedError

_SKIPPED = {"content-length", "transfer-encoding", "content-encoding", "connection"}
STREAM_TIMEOUT = 24 * 3600.0
"""A proxied response may stream this long (a spawn waiting in the queue)."""


async def _streaming_call_proxy(self: Any, path: str | None = None) -> None:
    url = await self.get_target_url(path)
    if url is None:
        return
    request = self._get_proxy_request(url)
    request.request_timeout = self.proxy.proxy_timeout or STREAM_TIMEOUT
    request.decompress_response = False
    started = False
    # The proxy's own headers (Server, Content-Type, Date) are replaced; the target's
    # repeated headers (Set-Cookie) are all kept.
    own = {name.lower() for name in self._headers}

    def on_header(line: str) -> None:
        nonlocal started
        if line.startswith("HTTP/"):
            _version, code, reason = (line.rstrip("\r\n").split(" ", 2) + ["", ""])[:3]
            self.set_status(int(code), reason or None)
            return
        if line.strip() == "":
            started = True
            return
        name, _, value = line.partition(":")
        key = name.strip().lower()
        if key in _SKIPPED:
            return
        if key in own:
            own.discard(key)
            self.set_header(name.strip(), value.strip())
        else:
            self.add_header(name.strip(), value.strip())

    def on_chunk(chunk: bytes) -> None:
        if self.request.connection.stream is None or self.request.connection.stream.closed():
            return
        self.write(chunk)
        try:
            self.flush()
        except StreamClosedError:
            pass

    request.header_callback = on_header
    request.streaming_callback = on_chunk
    try:
        await AsyncHTTPClient().fetch(request, raise_error=False)
    except HTTPClientError as error:
        if not started:
            await self.handle_proxy_error(503, error)
            return
    except Exception as error:
        if not started:
            await self.handle_proxy_error(503, error)
            return
    if not self._finished:
        self.finish()


def main() -> None:
    handlers.ProxyHandler.call_proxy = _streaming_call_proxy
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
