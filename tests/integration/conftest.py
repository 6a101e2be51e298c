"""Fixtures for tests against a real Docker engine and a real JupyterHub.

The engine and the images come from ``make test`` (scripts/engine, images/build).
Without an engine these tests fail, saying so, unless BUDGETHUB_NO_DOCKER=1.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import DockerException, ImageNotFound
from slurm_fixtures import slurm, slurm_hub  # noqa: F401 - the Slurm tests' fixtures

from harness import REPO
from harness.browser import CHROMIUM, FLAGS
from harness.hub import Hub, new_hub_name, remove_containers, start_hub
from harness.nodes import NODE, demo_teams
from harness.tlsnode import NetnsUnavailable, TlsNode, start_tls_node, stop_tls_node

IMAGES = ("budgethub/base:latest", "budgethub/gpu:latest", "budgethub/dataprep:latest")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.docker)
    # The longest tests first: pytest-xdist hands tests out in this order, and a long one
    # handed out last would leave the other workers idle while it runs.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def engine() -> Iterator[docker.DockerClient]:
    if os.environ.get("BUDGETHUB_NO_DOCKER") == "1":
        pytest.skip("BUDGETHUB_NO_DOCKER=1: Docker tests skipped on request")
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as error:
        pytest.fail(
            f"no Docker engine answers ({error}); run `scripts/engine up` "
            "(make test does), or set BUDGETHUB_NO_DOCKER=1 to skip these tests"
        )
    for image in IMAGES:
        try:
            client.images.get(image)
        except ImageNotFound:
            pytest.fail(f"image {image} is missing; run images/build (make test does)")
    yield client
    client.close()


@pytest.fixture(scope="session")
def second_engine() -> Iterator[str]:
    """A second dockerd (own socket, data-root, exec-root, no bridge) holding the images;
    stopped when the worker that runs its tests ends (tests/conftest.py sends every test
    of this engine to one worker). Its data root stays, so the next run's copy of the
    image has its layers already."""
    started = subprocess.run(
        [str(REPO / "scripts" / "engine"), "node", NODE],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip().splitlines()[-1]
    copied = subprocess.run(
        [str(REPO / "images" / "build"), "--only", "dataprep", "--engine", url],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert copied.returncode == 0, copied.stdout[-2000:] + copied.stderr[-2000:]
    try:
        yield url
    finally:
        stopped = subprocess.run(
            [str(REPO / "scripts" / "engine"), "stop-node", NODE],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stopped.returncode == 0, stopped.stderr


TLS_NODE = "bhtls"
"""The TLS node's engine name (scripts/engine tls-node NAME): network namespace bh-bhtls."""


@pytest.fixture(scope="session")
def tls_node(
    engine: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsNode]:
    """A second host: a dockerd in its own network namespace, reached over tcp:// with
    TLS (certificates made here), holding the session images; purged at the end
    (namespace, veth, dockerd and its processes, data). Skipped only where this machine
    cannot make network namespaces."""
    try:
        node = start_tls_node(TLS_NODE, tmp_path_factory.mktemp("tls-node-certs"))
    except NetnsUnavailable as why:
        pytest.skip(f"no TLS node: {why}")
    try:
        yield node
    finally:
        left = stop_tls_node(node)
        assert not left, f"the TLS node left {left} behind"


@pytest.fixture
def make_hub(
    engine: docker.DockerClient, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Hub]]:
    """Start a Hub; ``make_hub(nodes=[...], teams=[...], groups={...})``."""
    hubs: list[Hub] = []
    hub_name = new_hub_name(request.node.nodeid)
    engines: dict[str | None, dict[str, str] | None] = {}

    def make(
        *,
        nodes: list[dict[str, Any]],
        teams: list[dict[str, Any]] | None = None,
        groups: dict[str, list[str]] | None = None,
        **kwargs: Any,
    ) -> Hub:
        for node in nodes:
            engines[node.get("engine")] = node.get("tls")
        hub = start_hub(
            tmp_path,
            hub_name=hub_name,
            nodes=nodes,
            teams=teams if teams is not None else demo_teams(),
            groups=groups if groups is not None else {"nlp": ["ann", "cy"], "vision": ["bo"]},
            **kwargs,
        )
        hubs.append(hub)
        return hub

    yield make
    try:
        for hub in hubs:
            hub.stop()
    finally:
        killed = any(hub.killed for hub in hubs)
        for url, tls in engines.items():
            remove_containers(hub_name, url, tls, stragglers_s=10.0 if killed else 0.0)


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's, driven by Playwright)."""
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: make test installs it (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()
