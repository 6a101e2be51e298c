"""A real JupyterHub (with BudgetSpawner and its Node configurable-http-proxy) in a subprocess.

Everything listens on 127.0.0.1; sessions use host networking and their own
ports. Each Hub gets its own container label (``hub_name``) so that tests
never see each other's containers.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests

from scheduler_core.store import Store
from spawner.runtime.dockernodes import docker_client

VENV_BIN = Path(sys.executable).parent
ADMIN_TOKEN = secrets.token_hex(16)
PASSWORD = "budgethub-test"


HUB_OWNERS: dict[str, str] = {}
"""Hub name → the test that made it, so a leftover container names its test. Only
these Hubs' containers are this run's to clean up: another run on the same engine
(or one killed before its cleanup) has Hubs of its own. Here, not in conftest.py:
pytest loads that as a module of its own name, and an import of it by its package
path gives a second, empty copy."""


def new_hub_name(owner: str) -> str:
    """A fresh Hub name for the test ``owner`` (its node id), recorded in HUB_OWNERS."""
    hub_name = f"test-{secrets.token_hex(4)}"
    HUB_OWNERS[hub_name] = owner
    return hub_name


_GIVEN: set[int] = set()
"""Ports `free_port` has handed out in this process."""

WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
"""This pytest-xdist worker's number (0 without xdist): each worker takes its Hub ports
and its sessions' ports from a range of its own, so parallel Hubs never race for one."""
HUB_PORTS = (20000 + 500 * WORKER, 20000 + 500 * WORKER + 499)
"""Loopback ports for Hubs and proxies, below Linux's ephemeral range (32768-60999), so
no outgoing connection takes one between `free_port` and the bind."""
SESSION_PORTS = (61000 + 120 * WORKER, 61000 + 120 * WORKER + 119)
"""This worker's share of BudgetScheduler.port_range's default (61000-61999)."""


def free_port() -> int:
    """A loopback port of this worker's range, free now and not handed out before in this
    process. Ports picked one after another could repeat, the kernel handing back the one
    just released: a Hub whose proxy got the same port for its public and its API side
    failed to start."""
    low, high = HUB_PORTS
    for port in range(low, high + 1):
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free loopback port left in {low}-{high}")


def hub_config(
    *,
    directory: Path,
    port: int,
    hub_port: int,
    proxy_api_port: int,
    hub_name: str,
    nodes: list[dict[str, Any]],
    teams: list[dict[str, Any]],
    groups: dict[str, list[str]],
    pools: list[dict[str, str]] | None = None,
    profiles: list[dict[str, Any]] | None = None,
    extra: str = "",
) -> str:
    pools = pools or [{"name": "gpu", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"}]
    lines = [
        "from spawner.hubconfig import configure_hub",
        "c = get_config()  # noqa",
        f"configure_hub(c, token={secrets.token_hex(16)!r})",
        f"c.JupyterHub.bind_url = 'http://127.0.0.1:{port}'",
        "c.JupyterHub.hub_ip = '127.0.0.1'",
        f"c.JupyterHub.hub_port = {hub_port}",
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{proxy_api_port}'",
        f"c.JupyterHub.db_url = 'sqlite:///{directory}/jupyterhub.sqlite'",
        f"c.JupyterHub.cookie_secret_file = '{directory}/cookie_secret'",
        f"c.JupyterHub.pid_file = '{directory}/jupyterhub.pid'",
        "c.JupyterHub.cleanup_servers = False",
        "c.JupyterHub.cleanup_proxy = True",
        "c.JupyterHub.allow_named_servers = True",
        "c.JupyterHub.authenticator_class = 'shared-password'",
        f"c.SharedPasswordAuthenticator.user_password = {PASSWORD!r}",
        "c.Authenticator.allow_all = True",
        f"c.JupyterHub.load_groups = {json.dumps({g: {'users': u} for g, u in groups.items()})}",
        f"c.JupyterHub.services.append({{'name': 'tester', 'api_token': {ADMIN_TOKEN!r}}})",
        "c.JupyterHub.load_roles.append({'name': 'tester', 'services': ['tester'], "
        "'scopes': ['admin:users', 'admin:servers', 'access:servers', 'admin:groups', "
        "'tokens', 'read:users']})",
        f"c.BudgetScheduler.store_url = 'sqlite:///{directory}/budgethub.sqlite'",
        f"c.BudgetScheduler.hub_name = {hub_name!r}",
        f"c.BudgetScheduler.pools = {pools!r}",
        f"c.BudgetScheduler.nodes = {nodes!r}",
        f"c.BudgetScheduler.teams = {teams!r}",
        f"c.BudgetScheduler.port_range = {SESSION_PORTS!r}",
        "c.BudgetScheduler.cycle_tick = 1.0",
        "c.BudgetScheduler.health_interval = 1.0",
        "c.BudgetScheduler.launch_timeout = 60",
        "c.Spawner.http_timeout = 60",
        "c.JupyterHub.log_level = 'DEBUG'",
    ]
    if profiles is not None:
        lines.append(f"c.BudgetSpawner.profile_list = {profiles!r}")
    lines.append(extra)
    return "\n".join(lines) + "\n"


def scheduler_lines(settings: dict[str, Any]) -> str:
    """``c.BudgetScheduler`` configuration lines, one per setting."""
    return "".join(f"c.BudgetScheduler.{k} = {v!r}\n" for k, v in settings.items())


def start_hub(
    directory: Path,
    *,
    hub_name: str,
    nodes: list[dict[str, Any]],
    teams: list[dict[str, Any]],
    groups: dict[str, list[str]],
    start: bool = True,
    **config: Any,
) -> Hub:
    """A Hub in ``directory`` on three fresh loopback ports, started unless ``start`` is
    False; ``config`` goes to `hub_config` (pools, profiles, extra lines)."""
    port = free_port()
    text = hub_config(
        directory=directory,
        port=port,
        hub_port=free_port(),
        proxy_api_port=free_port(),
        hub_name=hub_name,
        nodes=nodes,
        teams=teams,
        groups=groups,
        **config,
    )
    hub = Hub(directory, text, port, hub_name)
    if start:
        hub.start()
    return hub


class Hub:
    """A JupyterHub process and a REST client for it."""

    def __init__(self, directory: Path, config: str, port: int, hub_name: str = "") -> None:
        self.directory = directory
        self.hub_name = hub_name
        """The label of this Hub's containers (``BudgetScheduler.hub_name``)."""
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.api = f"{self.url}/hub/api"
        self.config_path = directory / "jupyterhub_config.py"
        self.config_path.write_text(config)
        self.log_path = directory / "jupyterhub.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.killed = False
        """Did a stop need SIGKILL? Then a container create it had sent may still land."""
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {ADMIN_TOKEN}"

    def start(self, timeout: float = 60.0) -> None:
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(VENV_BIN / "jupyterhub"), "-f", str(self.config_path)],
                cwd=self.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterHub exited:\n{self.log_tail()}")
            try:
                if self.http.get(f"{self.api}/", timeout=2).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):
                # Not listening yet, or listening but too busy to answer in 2 s (a
                # loaded machine, a Hub that restarts with 40 sessions to find): the
                # deadline above bounds the wait, not one slow answer.
                pass
            time.sleep(0.2)
        raise RuntimeError(f"JupyterHub did not answer in {timeout} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the Hub (and its proxy); sessions keep running (cleanup_servers=False)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
            self.killed = True
        self.process = None

    def log_tail(self, lines: int = 80) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- REST -------------------------------------------------------------------

    def server_path(self, user: str, server: str = "") -> str:
        return (
            f"{self.api}/users/{user}/servers/{server}"
            if server
            else (f"{self.api}/users/{user}/server")
        )

    def spawn(self, user: str, options: dict[str, Any], server: str = "") -> requests.Response:
        self.http.post(f"{self.api}/users/{user}", timeout=10)  # create if missing
        return self.http.post(self.server_path(user, server), json=options, timeout=30)

    def user_model(self, user: str) -> dict[str, Any]:
        response = self.http.get(f"{self.api}/users/{user}", timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def server_model(self, user: str, server: str = "") -> dict[str, Any] | None:
        model = self.user_model(user).get("servers", {}).get(server)
        return dict(model) if model else None

    def wait_ready(self, user: str, server: str = "", timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.server_model(user, server)
            if model and model.get("ready"):
                return model
            if model is None and time.monotonic() > deadline - timeout + 5:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{user}:{server} not ready in {timeout} s:\n{self.log_tail()}")

    def wait_stopped(self, user: str, server: str = "", timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server_model(user, server) is None:
                return
            time.sleep(0.2)
        raise AssertionError(f"{user}:{server} did not stop in {timeout} s:\n{self.log_tail()}")

    def stop_server(self, user: str, server: str = "") -> None:
        response = self.http.delete(self.server_path(user, server), timeout=60)
        assert response.status_code in (202, 204), response.text
        self.wait_stopped(user, server)

    def progress(
        self, user: str, server: str = "", limit: float = 30.0
    ) -> Iterator[dict[str, Any]]:
        """Progress events of a pending spawn (the EventStream the spawn page reads)."""
        url = f"{self.api}/users/{user}/server/progress"
        if server:
            url = f"{self.api}/users/{user}/servers/{server}/progress"
        with self.http.get(url, stream=True, timeout=limit) as response:
            for raw in response.iter_lines(decode_unicode=True):
                line = raw.decode() if isinstance(raw, bytes) else str(raw)
                if line.startswith("data:"):
                    yield json.loads(line[5:])

    def through_proxy(self, user: str, path: str = "api", server: str = "") -> requests.Response:
        prefix = f"/user/{user}/{server + '/' if server else ''}"
        return self.http.get(f"{self.url}{prefix}{path}", timeout=10, allow_redirects=False)

    def login(self, user: str) -> requests.Session:
        """A browser-like client logged in as ``user`` through the login form."""
        browser = requests.Session()
        browser.get(f"{self.url}/hub/login", timeout=10)
        response = browser.post(
            f"{self.url}/hub/login",
            data={
                "username": user,
                "password": PASSWORD,
                "_xsrf": browser.cookies.get("_xsrf", ""),
            },
            timeout=10,
            allow_redirects=False,
        )
        assert response.status_code == 302, response.text[:300]
        return browser


def queue_events(hub: Hub, user: str, found: list[dict[str, Any]], stop: threading.Event) -> None:
    """Collect a pending spawn's progress events until told to stop (or the spawn ends)."""
    try:
        for event in hub.progress(user, limit=120):
            found.append(event)
            if stop.is_set() or event.get("ready") or event.get("failed"):
                return
    except Exception as error:  # the stream ends when the spawn does
        found.append({"error": str(error)})


def positions(events: list[dict[str, Any]]) -> list[int]:
    return [e["queue"]["position"] for e in events if "queue" in e]


def hub_kill(hub: Hub) -> None:
    """SIGKILL the Hub and its proxy (no clean shutdown at all)."""
    assert hub.process is not None
    os.killpg(hub.process.pid, signal.SIGKILL)
    hub.process.wait(timeout=30)
    hub.process = None


def booked(hub: Hub) -> dict[str, set[str]]:
    """Slices booked in the scheduler's store, per request."""
    store = Store.create(f"sqlite:///{hub.directory}/budgethub.sqlite")
    try:
        return {
            a.id: {s.device_id for g in a.grants for s in g.slices}
            for a in store.active_allocations()
        }
    finally:
        store.engine.dispose()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 0.2 s until it is true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def containers(
    hub_name: str, engine: str | None = None, tls: dict[str, str] | None = None
) -> list[Any]:
    """The Hub's containers on an engine (``tls``: a node's ca/cert/key files)."""
    client = docker_client(engine, tls)
    try:
        return list(
            client.containers.list(all=True, filters={"label": f"org.budgethub.hub={hub_name}"})
        )
    finally:
        client.close()


def remove_containers(
    hub_name: str,
    engine: str | None = None,
    tls: dict[str, str] | None = None,
    stragglers_s: float = 0.0,
) -> None:
    """Remove the Hub's containers; with ``stragglers_s``, keep looking that long for
    ones an engine was still creating (asked for by a Hub that was killed)."""
    deadline = time.monotonic() + stragglers_s
    while True:
        for container in containers(hub_name, engine, tls):
            container.remove(force=True)
        if time.monotonic() >= deadline:
            return
        time.sleep(1.0)
