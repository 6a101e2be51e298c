"""The budget service ends when the Hub that started it dies without a word (SIGKILL):
a Hub restarted that way must not leave one more service process behind each time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness import REPO


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill 0; it has exited all the same.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_the_service_stops_when_its_hub_is_killed(store_file_url: str) -> None:
    url = store_file_url
    port = _free_port()
    env = dict(
        os.environ,
        JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{port}/",
        JUPYTERHUB_SERVICE_PREFIX="/services/budget/",
        BUDGETHUB_STORE_URL=url,
    )
    # A stand-in for the Hub: a parent that starts the service and is then killed.
    hub = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -m spawner.readmodel.service & echo $!; wait"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert hub.stdout is not None
    service = int(hub.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("the service never listened")
        assert _alive(service)
        hub.send_signal(signal.SIGKILL)
        hub.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _alive(service) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(service), "the service outlived the Hub that started it"
    finally:
        hub.stdout.close()
        if hub.poll() is None:
            hub.kill()
            hub.wait(timeout=10)
        if _alive(service):
            os.kill(service, signal.SIGKILL)
