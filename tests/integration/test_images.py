"""The session images (images/build) and the node engines (scripts/engine), for real.

These tests talk to a real Docker engine (the default one, or $DOCKER_HOST); start
it with ``scripts/engine up``. Without an answering engine they FAIL with a message
saying so, unless BUDGETHUB_NO_DOCKER=1 is set, in which case they are skipped.

They run ``images/build`` themselves (a no-op taking a second or two once the images
exist; a cold build takes a few minutes, bounded by BUDGETHUB_IMAGE_BUILD_TIMEOUT,
default 2400 s), and start node engines t1 and t2 with ``scripts/engine node``
(those they start are stopped again at the end; their images are kept).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import jupyterhub
import pytest

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "scripts" / "engine"
BUILD = ROOT / "images" / "build"
IMAGES = {
    "base": "budgethub/base:latest",
    "gpu": "budgethub/gpu:latest",
    "dataprep": "budgethub/dataprep:latest",
}
BUILD_TIMEOUT = int(os.environ.get("BUDGETHUB_IMAGE_BUILD_TIMEOUT", "2400"))
RUN_TIMEOUT = 120  # one `docker run --rm` of a session image
NODE_TIMEOUT = 150  # `scripts/engine node` waits at most 60 s itself


def run(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command with a hard time limit; a timeout fails the test, never hangs it."""
    try:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)!r} did not finish within {timeout}s: {exc.stderr!r}")


def ok(cmd: list[str], timeout: float = RUN_TIMEOUT) -> str:
    """Run a command that must succeed; return its stdout, stripped."""
    proc = run(cmd, timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)!r} exited {proc.returncode}\n"
        f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-3000:]}"
    )
    return proc.stdout.strip()


@functools.cache
def _docker_state() -> tuple[str | None, str]:
    """(path of the docker CLI, "") when an engine answers, else (None, why not)."""
    docker = shutil.which("docker")
    if docker is None:
        return None, "no docker CLI on PATH"
    try:
        proc = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, "'docker info' did not answer within 30 s"
    if proc.returncode != 0:
        return None, f"'docker info' failed: {proc.stderr.strip()[-500:]}"
    return docker, ""


def need_docker() -> str:
    """The docker CLI; fails the test (or skips it with BUDGETHUB_NO_DOCKER=1)."""
    if os.environ.get("BUDGETHUB_NO_DOCKER") == "1":
        pytest.skip("BUDGETHUB_NO_DOCKER=1: Docker tests are switched off")
    docker, why = _docker_state()
    if docker is None:
        engine = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        pytest.fail(
            f"No Docker engine at {engine}: {why}. Start one with `scripts/engine up` "
            "(as root), or set BUDGETHUB_NO_DOCKER=1 to skip the Docker tests.",
            pytrace=False,
        )
    return docker


@functools.cache
def _build() -> subprocess.CompletedProcess[str]:
    return run([str(BUILD)], BUILD_TIMEOUT)


def need_images() -> str:
    """Run images/build (fast when the images exist); return the docker CLI."""
    docker = need_docker()
    proc = _build()
    assert proc.returncode == 0, (
        f"images/build exited {proc.returncode}:\n{proc.stderr[-4000:]}\n{proc.stdout[-1000:]}"
    )
    return docker


def inspect(docker: str, image: str, fmt: str, host: str | None = None) -> str:
    prefix = [docker] if host is None else [docker, "-H", host]
    return ok([*prefix, "image", "inspect", "--format", fmt, image], 30)


def test_build_prints_a_summary_and_labels_the_images() -> None:
    docker = need_images()
    summary = _build().stdout.strip().splitlines()
    assert summary and summary[-1].startswith("images/build:"), summary
    assert "total" in summary[-1]
    for name, image in IMAGES.items():
        assert inspect(docker, image, '{{index .Config.Labels "org.budgethub.image"}}') == name
        assert (
            inspect(docker, image, '{{index .Config.Labels "org.budgethub.built-by"}}')
            == "images/build"
        )


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_runs_as_jovyan_not_root(name: str) -> None:
    docker = need_images()
    image = IMAGES[name]
    assert inspect(docker, image, "{{.Config.User}}") == "jovyan"
    out = ok(
        [
            docker,
            "run",
            "--rm",
            "--network",
            "none",
            image,
            "sh",
            "-c",
            'id -u; id -g; echo "$HOME"; test -d "$HOME/work" && test -w "$HOME/work" && echo w',
        ]
    )
    assert out.splitlines() == ["1000", "100", "/home/jovyan", "w"]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_singleuser_is_the_hubs_version(name: str) -> None:
    docker = need_images()
    image = IMAGES[name]
    out = ok(
        [docker, "run", "--rm", "--network", "none", image, "jupyterhub-singleuser", "--version"]
    )
    assert out.splitlines()[-1] == jupyterhub.__version__
    # The default command is the single-user server, under tini.
    assert inspect(docker, image, "{{json .Config.Cmd}}") == '["jupyterhub-singleuser"]'
    assert inspect(docker, image, "{{json .Config.Entrypoint}}") == '["tini","-g","--"]'


def test_dataprep_has_pandas_pyarrow_duckdb() -> None:
    docker = need_images()
    code = (
        "import pandas, pyarrow, duckdb; "
        "print(duckdb.connect().execute('select 41 + 1').fetchall()[0][0])"
    )
    out = ok([docker, "run", "--rm", "--network", "none", IMAGES["dataprep"], "python", "-c", code])
    assert out == "42"


def test_gpu_image_asks_for_no_gpu_by_itself() -> None:
    docker = need_images()
    code = (
        "import os, pynvml; "
        "print(os.environ['NVIDIA_VISIBLE_DEVICES'], os.environ['NVIDIA_DRIVER_CAPABILITIES'])"
    )
    out = ok([docker, "run", "--rm", "--network", "none", IMAGES["gpu"], "python", "-c", code])
    assert out == "void compute,utility"


@pytest.fixture(scope="module")
def nodes() -> Iterator[dict[str, str]]:
    """Node engines t1 and t2 (their DOCKER_HOST urls).

    Those this fixture had to start are stopped again afterwards (not purged: their
    images stay for the next run); ones that were already running are left running.
    """
    docker = need_images()
    urls: dict[str, str] = {}
    started: list[str] = []
    try:
        for name in ("t1", "t2"):
            sock = f"unix:///var/run/budgethub/{name}.sock"
            was_up = run([docker, "-H", sock, "info"], 30).returncode == 0
            urls[name] = ok([str(ENGINE), "node", name], NODE_TIMEOUT)
            if not was_up:
                started.append(name)
        yield urls
    finally:
        for name in started:
            run([str(ENGINE), "stop-node", name], NODE_TIMEOUT)


def test_node_engine_holds_an_image_copied_by_build(nodes: dict[str, str]) -> None:
    docker = need_docker()
    url = nodes["t1"]
    assert url == "unix:///var/run/budgethub/t1.sock"
    # Idempotent: asking again returns the same engine.
    assert ok([str(ENGINE), "node", "t1"], NODE_TIMEOUT) == url
    labels = ok([docker, "-H", url, "info", "--format", "{{json .Labels}}"], 30)
    assert "org.budgethub.node=t1" in labels
    root = ok([docker, "-H", url, "info", "--format", "{{.DockerRootDir}}"], 30)
    assert root == "/var/lib/budgethub/nodes/t1/data"

    ok([str(BUILD), "--only", "base", "--engine", url], BUILD_TIMEOUT)
    here = inspect(docker, IMAGES["base"], "{{.Id}}")
    there = inspect(docker, IMAGES["base"], "{{.Id}}", host=url)
    assert there == here
    # A second copy finds the image there and sends nothing.
    again = ok([str(BUILD), "--only", "base", "--engine", "t1"], BUILD_TIMEOUT)
    assert f"{url} up to date" in again

    out = ok(
        [docker, "-H", url, "run", "--rm", IMAGES["base"], "jupyterhub-singleuser", "--version"]
    )
    assert out.splitlines()[-1] == jupyterhub.__version__


def test_two_nodes_and_the_default_engine_run_containers_at_once(
    nodes: dict[str, str],
) -> None:
    docker = need_docker()
    ok([str(BUILD), "--only", "base", "--engine", "t1", "--engine", "t2"], BUILD_TIMEOUT)
    hosts = {"default": None, **nodes}
    name = f"bh-test-images-{os.getpid()}"
    started: list[list[str]] = []
    try:
        for host in hosts.values():
            prefix = [docker] if host is None else [docker, "-H", host]
            ok([*prefix, "run", "-d", "--name", name, IMAGES["base"], "sleep", "120"], 60)
            started.append(prefix)
        ips = set()
        for prefix in started:
            state = ok([*prefix, "inspect", "--format", "{{.State.Running}}", name], 30)
            assert state == "true"
            ips.add(
                ok([*prefix, "inspect", "--format", "{{.NetworkSettings.IPAddress}}", name], 30)
            )
        # Each engine has its own bridge and subnet: three different addresses.
        assert len(ips) == 3, ips
        # Each node engine has its own containerd, under its own exec root.
        for node in nodes:
            assert Path(f"/var/run/budgethub/{node}/containerd/containerd.sock").is_socket()
        # Starting the nodes left the default engine's bridge alone.
        assert Path("/sys/class/net/docker0").exists()
    finally:
        for prefix in started:
            run([*prefix, "rm", "-f", name], 60)
