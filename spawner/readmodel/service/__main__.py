"""``python -m spawner.readmodel.service``: the budget service as the Hub starts it.

Reads JupyterHub's service environment (``JUPYTERHUB_SERVICE_URL``,
``JUPYTERHUB_SERVICE_PREFIX``, ``JUPYTERHUB_API_URL``, ``JUPYTERHUB_API_TOKEN``) and
``BUDGETHUB_STORE_URL``, the scheduler's store (``serve.py``).

The port is bound first, with the standard library alone, and the service's modules
are imported after: the Hub waits for a managed service by asking its URL on a
doubling backoff (0.2 s, 0.6 s, 1.4 s, 3 s, ...), so a service that listened only once
its imports were done (about 0.7 s idle, 2 s on a busy machine) was found up to a
second or two late on every Hub start. Bound early, the Hub's first try waits in the
socket's backlog and is answered as soon as the service runs.
"""

from __future__ import annotations

import asyncio
import os
import socket
from urllib.parse import urlparse


def listening_socket() -> socket.socket:
    """The service's port, bound and listening (JUPYTERHUB_SERVICE_URL's host and port)."""
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101/"))
    host, port = url.hostname or "127.0.0.1", url.port or 80
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind((host, port))
    listening.listen(128)
    return listening


def main() -> None:
    # The Hub's pid, read first: read after the port listens, a Hub killed in between
    # was already replaced as parent, and the service would never see it go.
    hub = os.getppid()
    listening = listening_socket()
    # Imported once the port listens (the module docstring says why).
    from spawner.readmodel.service.serve import serve

    asyncio.run(serve(listening, hub))


if __name__ == "__main__":
    main()
