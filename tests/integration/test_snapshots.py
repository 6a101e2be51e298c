"""Preemption that loses nothing, end to end: a real Hub, real engines (the local one and
the TLS node in its own network namespace), real kernels in the session image.

A session's home is a bind of ``{home_root}/{hub}/{user}`` (shared storage: here a
directory both engines see), its kernels checkpoint after each cell, and a preemption
snapshots it; the next start restores it on whichever node has room. Also: an agent
that never answers, a snapshot store that is full or read-only, another user asking
for the snapshot through every route, forged restore options, and 20 cycles in a row.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import pytest
import requests

from harness.browser import log_in
from harness.hub import Hub, containers, wait_for
from harness.kernels import Kernel, Server, toy_wheel
from harness.nodes import local_gpu_node
from harness.tlsnode import TlsNode
from scheduler_core.store import SnapshotRecord, Store

IMAGE = "budgethub/dataprep:latest"
"""The session image with pandas and numpy (the extension is in every image)."""

PROFILES = [
    {
        "slug": "notebook",
        "display_name": "Notebook",
        "description": "a GPU notebook",
        "class": "interactive",
        "pool": "gpu",
        "image": IMAGE,
        "gpus": [1, 2],
        "cpus": 1,
        "memory_gib": 2,
        "min_runtime": "1h",
        "max_min_runtime": "8h",
    }
]
ONE = {"profile": "notebook", "gpus": 1}
TWO = {"profile": "notebook", "gpus": 2}
TEAMS = [
    {"name": "nlp", "share": {"gpu": 1.0, "cpu": 1.0}},
    {"name": "guests", "share": {"gpu": 0.0, "cpu": 0.0}},
]
GROUPS = {"nlp": ["ann", "cy"], "guests": ["gus", "bo"]}

CELLS_A = """
n = 42
x = 3.25
s = "héllo, snapshots"
nested = {"a": [1, (2, 3), {4, 5}], "b": {"c": None, "d": b"bytes"}}
import numpy as np
arr = (np.arange(12).reshape(3, 4) * 1.5).astype("float32")
import pandas as pd
df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x * self.x + self.y * self.y
p = Point(3, 4)
square = lambda v: v * v
import socket
sock = socket.socket()
"""
CHECK_A = (
    '{"n": n, "x": x, "s": s, "nested": repr(sorted(nested)) + repr(nested["a"][:2]) '
    '+ repr(sorted(nested["a"][2])) + repr(nested["b"]), "arr": arr.tolist(), '
    '"dtype": str(arr.dtype), "df": df.to_dict("list"), '
    '"p": [type(p).__name__, p.x, p.y, p.norm2()], "square": square(7), "toy": toy, '
    '"m_here": "m" in globals()}'
)
CELLS_B = 'm = "only in train"\ntotal = sum(range(100))\n'
CHECK_B = '{"m": m, "total": total, "n_here": "n" in globals()}'


# -- helpers ----------------------------------------------------------------------


def snapshot_hub(
    make_hub: Any, tmp_path: Path, nodes: list[dict[str, Any]], *, extra: str = "", **traits: Any
) -> Hub:
    settings = {
        "home_root": str(tmp_path / "homes"),
        "snapshot_root": str(tmp_path / "snapshots"),
        "snapshot_grace": 15.0,
        "unallocated_grace": 1.0,
        "idle_poll": 0.0,
    }
    settings.update(traits)
    lines = "".join(f"c.BudgetScheduler.{k} = {v!r}\n" for k, v in settings.items())
    return make_hub(nodes=nodes, teams=TEAMS, groups=GROUPS, profiles=PROFILES, extra=lines + extra)


def store_of(hub: Hub) -> Store:
    return Store.create(f"sqlite:///{hub.directory}/budgethub.sqlite", migrate_schema=False)


def snapshots(hub: Hub, user: str, server: str = "") -> list[SnapshotRecord]:
    store = store_of(hub)
    try:
        return store.list_snapshots(user=user, server=server)
    finally:
        store.engine.dispose()


def start(hub: Hub, user: str, options: dict[str, Any] | None = None) -> None:
    response = hub.spawn(user, options or ONE)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user, timeout=120)


def preempt(hub: Hub, victim: str = "gus", by: str = "ann", options: Any = None) -> SnapshotRecord:
    """A funded request that needs the victim's slices; the snapshot it left."""
    before = {s.key for s in snapshots(hub, victim)}
    time.sleep(1.2)  # past the unallocated grace
    start(hub, by, options)
    hub.wait_stopped(victim)
    wait_for(
        lambda: any(s.key not in before for s in snapshots(hub, victim)),
        60,
        "the snapshot to be recorded",
    )
    return snapshots(hub, victim)[-1]


def gus_ran(hub: Hub, cell: str) -> None:
    """gus's session started, with notes/keep.txt in his home and ``cell`` run in a.ipynb."""
    start(hub, "gus")
    server = Server(hub, "gus")
    server.put_file("notes/keep.txt", b"kept\n")
    server.put_notebook("a.ipynb")
    kernel = server.open("a.ipynb")
    assert kernel.run(cell).error is None
    kernel.close()


def on_tls(tls_node: TlsNode, hub: Hub, user: str) -> bool:
    return any(c.labels["org.budgethub.user"] == user for c in tls_node.containers(hub.hub_name))


def server_pid(container: Any) -> int:
    """The host pid of the session's Jupyter server (the agent lives in it)."""
    container.reload()
    top = int(container.attrs["State"]["Pid"])
    for pid in [top] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid")))
        if cmdline.startswith(b"tini"):
            continue  # the image's init, whose child the server is
        if b"jupyterhub-singleuser" in cmdline and (pid == top or ppid == top):
            return pid
    raise AssertionError("no jupyterhub-singleuser process in the container")


def assert_private(path: Path) -> None:
    """Everything under ``path`` belongs to the session's uid and nobody else reads it."""
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files, "."]:
            info = os.lstat(os.path.join(root, name))
            assert info.st_uid == 1000, (root, name, info.st_uid)
            assert stat.S_IMODE(info.st_mode) & 0o077 == 0, (root, name, oct(info.st_mode))


def fill_session(server: Server, tmp_path: Path) -> tuple[Kernel, Kernel]:
    """Files in the home, a wheel installed with %pip, state in two notebooks."""
    server.put_file("notes/data.txt", b"measurements\n" * 1000)
    server.put_file("work/blob.bin", os.urandom(256 * 1024))
    wheel = toy_wheel(tmp_path)
    server.put_file(wheel.name, wheel.read_bytes())
    server.put_notebook("analysis.ipynb")
    server.put_notebook("work/train.ipynb")
    a = server.open("analysis.ipynb")
    b = server.open("work/train.ipynb")
    installed = a.run(f"%pip install --no-index --no-deps ~/{wheel.name}")
    assert installed.error is None, installed
    for kernel, cells in ((a, "import bhtoy\ntoy = bhtoy.VALUE\n" + CELLS_A), (b, CELLS_B)):
        result = kernel.run(cells)
        assert result.error is None, result
    return a, b


@contextmanager
def small_filesystem(path: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (the snapshot store), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0711", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# -- the round trip -----------------------------------------------------------------


def test_a_preempted_session_comes_back_whole_on_the_other_engine_while_its_node_is_down(
    make_hub, tls_node: TlsNode, tmp_path: Path
):
    tls_node.copy_images((IMAGE,))
    local = local_gpu_node(gpus=2)
    hub = snapshot_hub(make_hub, tmp_path, [local, tls_node.node()], extra=tls_node.hub_extra)
    start(hub, "gus")  # alone, best fit: the one-GPU TLS node
    assert on_tls(tls_node, hub, "gus")
    start(hub, "cy", TWO)  # cy's funded session takes the local node
    server = Server(hub, "gus")
    a, b = fill_session(server, tmp_path)
    expected_a, expected_b = a.value(CHECK_A), b.value(CHECK_B)
    assert expected_a["toy"] == "toy-42" and not expected_a["m_here"]
    assert not expected_b["n_here"]
    a.close()
    b.close()

    snapshot = preempt(hub)  # ann's funded request needs gus's GPU
    assert on_tls(tls_node, hub, "ann")
    report = snapshot.report
    assert report["kernel_state"] == "saved", report
    assert snapshot.node == "gpu-b" and snapshot.server == ""
    assert "analysis.ipynb:sock" in snapshot.unsaved, snapshot.unsaved
    assert "socket" in snapshot.unsaved["analysis.ipynb:sock"]
    saved = set(snapshot.saved)
    for name in ("n", "x", "s", "nested", "arr", "df", "p", "square", "toy"):
        assert f"analysis.ipynb:{name}" in saved, (name, sorted(saved))
    assert {"work/train.ipynb:m", "work/train.ipynb:total"} <= saved
    assert snapshot.sizes["kernels"] > 0 and snapshot.sizes["home"] > 256 * 1024
    directory = tmp_path / "snapshots" / hub.hub_name / "gus" / "default" / snapshot.key
    assert (directory / "report.json").is_file() and (directory / "kernels").is_dir()
    assert_private(tmp_path / "snapshots" / hub.hub_name / "gus")

    # The node it was taken on goes down; cy's session ends; gus restores on the local node.
    tls_node.kill()
    try:
        wait_for(lambda: hub.server_model("ann") is None, 60, "ann's session to end with its node")
        hub.stop_server("cy")
        with hub.login("gus") as web:
            page = web.get(f"{hub.url}/hub/spawn", timeout=30)
        assert snapshot.key in page.text and "Start fresh" in page.text
        assert "sock (" in page.text  # what was not kept
        start(hub, "gus")
        [restored] = containers(hub.hub_name)
        assert restored.labels["org.budgethub.user"] == "gus"  # on the other engine
        env = restored.attrs["Config"]["Env"]
        assert "BUDGETHUB_RESTORE_DIR=/var/lib/budgethub/restore" in env
        server = Server(hub, "gus")
        assert server.get_file("notes/data.txt") == b"measurements\n" * 1000
        a = server.open("analysis.ipynb")
        b = server.open("work/train.ipynb")
        first = a.run("1")
        assert "budgethub: restored" in first.stdout + str(first.outputs), first
        assert "sock" in first.stdout + str(first.outputs)  # named as not restored
        assert a.value(CHECK_A) == expected_a
        assert b.value(CHECK_B) == expected_b
        assert a.value("'sock' in globals()") is False
        fresh = a.run("import importlib, bhtoy; importlib.reload(bhtoy); print(bhtoy.VALUE)")
        assert fresh.stdout.strip() == "toy-42"  # the %pip package imports from the home
        a.close()
        b.close()
        hub.stop_server("gus")
    finally:
        tls_node.start()


def test_twenty_cycles_lose_nothing_and_keep_the_newest_snapshots(make_hub, tmp_path: Path):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)], snapshot_keep=3)
    start(hub, "gus")
    server = Server(hub, "gus")
    server.put_notebook("cycles.ipynb")
    kernel = server.open("cycles.ipynb")
    assert kernel.run("history = []").error is None
    keys = []
    for i in range(20):
        assert (
            kernel.run(f"history.append({i})\nv{i} = {{'cycle': {i}, 'square': {i * i}}}").error
            is None
        )
        server.put_file(f"cycles/{i}.txt", f"cycle {i}\n".encode())
        kernel.close()
        snapshot = preempt(hub)
        assert snapshot.report["kernel_state"] == "saved", (i, snapshot.report)
        keys.append(snapshot.key)
        hub.stop_server("ann")
        start(hub, "gus")
        server = Server(hub, "gus")
        kernel = server.open("cycles.ipynb")
        assert kernel.value("history") == list(range(i + 1)), i
        squares = "[" + ", ".join(f"v{j}['square']" for j in range(i + 1)) + "]"
        assert kernel.value(squares) == [j * j for j in range(i + 1)], i
        assert [server.get_file(f"cycles/{j}.txt") for j in range(i + 1)] == [
            f"cycle {j}\n".encode() for j in range(i + 1)
        ]
    kernel.close()
    hub.stop_server("gus")
    kept = snapshots(hub, "gus")
    assert [s.key for s in kept] == keys[-3:]
    on_disk = tmp_path / "snapshots" / hub.hub_name / "gus" / "default"
    assert sorted(p.name for p in on_disk.iterdir()) == sorted(keys[-3:])


# -- failures ---------------------------------------------------------------------


def test_an_agent_that_never_answers_still_keeps_the_files_and_packages(
    make_hub, engine: docker.DockerClient, tmp_path: Path
):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)], snapshot_grace=2.0)
    start(hub, "gus")
    server = Server(hub, "gus")
    server.put_file("notes/keep.txt", b"kept\n")
    wheel = toy_wheel(tmp_path)
    server.put_file(wheel.name, wheel.read_bytes())
    server.put_notebook("a.ipynb")
    kernel = server.open("a.ipynb")
    assert kernel.run(f"%pip install --no-index --no-deps ~/{wheel.name}").error is None
    kernel.close()
    [container] = containers(hub.hub_name)
    os.kill(server_pid(engine.containers.get(container.id)), signal.SIGSTOP)  # agent frozen

    snapshot = preempt(hub)
    report = snapshot.report
    assert report["kernel_state"] == "not saved"
    assert "did not answer within 2 s" in report["why"], report
    assert snapshot.unsaved["kernel state"] == report["why"]
    hub.stop_server("ann")
    with hub.login("gus") as web:
        page = web.get(f"{hub.url}/hub/spawn", timeout=30)
    assert "kernel state was not saved" in page.text
    start(hub, "gus")
    server = Server(hub, "gus")
    assert server.get_file("notes/keep.txt") == b"kept\n"
    kernel = server.open("a.ipynb")
    imported = kernel.run("import bhtoy; print(bhtoy.VALUE)")
    assert imported.stdout.strip().splitlines()[-1] == "toy-42", imported
    kernel.close()
    hub.stop_server("gus")


def test_a_full_or_read_only_snapshot_store_still_frees_the_slices_and_says_why(
    make_hub, tmp_path: Path
):
    with small_filesystem(tmp_path / "snapshots") as store_root:
        hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)])
        gus_ran(hub, "first = 'first'")
        earlier = preempt(hub)
        assert earlier.report["kernel_state"] == "saved"
        earlier_dir = store_root / hub.hub_name / "gus" / "default" / earlier.key
        assert earlier_dir.is_dir()
        hub.stop_server("ann")

        for trouble in ("full", "read-only"):
            start(hub, "gus")
            kernel = Server(hub, "gus").open("a.ipynb")
            # From the earlier snapshot; after a failed one only the home comes back.
            assert kernel.value("'first' in globals()") is (trouble == "full")
            assert kernel.run(f"second = {trouble!r}").error is None
            kernel.close()
            if trouble == "full":
                with (store_root / "filler").open("wb") as filler:
                    try:
                        while True:
                            filler.write(b"\0" * (1 << 20))
                    except OSError:
                        pass
            else:
                (store_root / "filler").unlink()
                subprocess.run(["mount", "-o", "remount,ro", str(store_root)], check=True)
            snapshot = preempt(hub)  # ann still starts: the slices were freed
            assert snapshot.report["kernel_state"] == "not saved"
            assert f"the snapshot store is {trouble}" in snapshot.report["why"], snapshot.report
            assert earlier_dir.is_dir()  # a failed snapshot never deletes an earlier one
            hub.stop_server("ann")
        start(hub, "gus")
        assert Server(hub, "gus").get_file("notes/keep.txt") == b"kept\n"  # the home is whole
        hub.stop_server("gus")


# -- security ---------------------------------------------------------------------


def test_nobody_else_can_restore_read_or_list_a_snapshot_and_forged_options_are_refused(
    make_hub, tmp_path: Path
):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)])
    start(hub, "gus")
    server = Server(hub, "gus")
    server.put_notebook("a.ipynb")
    kernel = server.open("a.ipynb")
    assert kernel.run("secret_value = 'gus only'").error is None
    kernel.close()
    [container] = containers(hub.hub_name)
    port = int(container.labels["org.budgethub.port"])
    secret = next(
        e.split("=", 1)[1]
        for e in container.attrs["Config"]["Env"]
        if e.startswith("BUDGETHUB_AGENT_SECRET=")
    )
    agent = f"http://127.0.0.1:{port}/user/gus/budgethub-agent/status"
    # The agent: only the spawner, with the secret, straight to the port.
    assert requests.get(agent, timeout=10).status_code == 403
    assert (
        requests.get(agent, headers={"X-Budgethub-Agent": "wrong"}, timeout=10).status_code == 403
    )
    forwarded = {"X-Budgethub-Agent": secret, "X-Forwarded-For": "10.0.0.1"}
    assert requests.get(agent, headers=forwarded, timeout=10).status_code == 403
    assert requests.get(agent, headers={"X-Budgethub-Agent": secret}, timeout=10).status_code == 200
    bo = hub.login("bo")
    through_proxy = bo.get(
        f"{hub.url}/user/gus/budgethub-agent/status",
        headers={"X-Budgethub-Agent": secret},
        timeout=10,
        allow_redirects=False,
    )
    assert through_proxy.status_code in (302, 403), through_proxy.status_code
    assert "gus only" not in through_proxy.text

    snapshot = preempt(hub)
    hub.stop_server("ann")
    key = snapshot.key
    # The form: bo's spawn page shows no snapshot; posting gus's key is refused.
    page = bo.get(f"{hub.url}/hub/spawn", timeout=30)
    assert key not in page.text and "Start fresh" not in page.text
    posted = bo.post(
        f"{hub.url}/hub/spawn/bo",
        data={
            "profile": "notebook",
            "gpus": "1",
            "restore": key,
            "_xsrf": bo.cookies.get("_xsrf", ""),
        },
        timeout=60,
    )
    assert f"restore: there is no snapshot {key} of this server" in posted.text
    assert hub.server_model("bo") is None
    # The REST API: bo's own server with gus's key, and gus's server with bo's token.
    refused = hub.spawn("bo", {**ONE, "restore": key})
    assert refused.status_code == 400, refused.text
    assert f"there is no snapshot {key} of this server" in refused.json()["message"]
    token = hub.http.post(f"{hub.api}/users/bo/tokens", json={}, timeout=10).json()["token"]
    as_bo = requests.post(
        f"{hub.api}/users/gus/server",
        json={**ONE, "restore": key},
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert as_bo.status_code in (403, 404), as_bo.status_code
    # The snapshot REST route: gus lists and reads his own; nobody else, admins included.
    gus_token = hub.http.post(f"{hub.api}/users/gus/tokens", json={}, timeout=10).json()["token"]
    listing = f"{hub.api}/budgethub/users/gus/snapshots"

    def as_user(token: str, url: str) -> requests.Response:
        return requests.get(url, headers={"Authorization": f"token {token}"}, timeout=10)

    own = as_user(gus_token, listing)
    assert own.status_code == 200 and [s["key"] for s in own.json()] == [key]
    report = as_user(gus_token, f"{listing}/{key}")
    assert report.status_code == 200 and report.json()["report"]["key"] == key
    assert as_user(token, listing).status_code in (403, 404)
    assert as_user(token, f"{listing}/{key}").status_code in (403, 404)
    assert as_user(token, f"{hub.api}/budgethub/users/bo/snapshots").json() == []
    assert as_user(token, f"{hub.api}/budgethub/users/bo/snapshots/{key}").status_code == 404
    assert hub.http.get(listing, timeout=10).status_code == 404  # the admin service's token
    # Forged options: a path, a key of nobody, a bad "fresh".
    for forged, field in (
        ({"restore": "../../etc"}, "restore"),
        ({"restore": "20200101T000000-deadbeef"}, "restore"),
        ({"restore": key + "/../x"}, "restore"),
        ({"fresh": "sometimes"}, "fresh"),
    ):
        answer = hub.spawn("gus", {**ONE, **forged})
        assert answer.status_code == 400, (forged, answer.text)
        assert f"Cannot start: {field}:" in answer.json()["message"], answer.text
        wait_for(lambda: hub.server_model("gus") is None, 10, "the refused server to clear")
    assert hub.server_model("gus") is None

    # gus's own start restores it; bo's session sees none of it.
    start(hub, "gus")
    with Server(hub, "gus").open("a.ipynb") as kernel:
        assert kernel.value("secret_value") == "gus only"
    hub.stop_server("gus")
    start(hub, "bo")
    [bo_container] = containers(hub.hub_name)
    mounts = {m["Destination"]: m["Source"] for m in bo_container.attrs["Mounts"]}
    assert "/var/lib/budgethub/restore" not in mounts
    assert mounts["/home/jovyan"].endswith("/bo")
    hub.stop_server("bo")
    bo.close()

    # Deleting gus deletes his snapshots, rows and files.
    assert hub.http.delete(f"{hub.api}/users/gus", timeout=60).status_code == 204
    wait_for(lambda: snapshots(hub, "gus") == [], 30, "gus's snapshots to go")
    assert not (tmp_path / "snapshots" / hub.hub_name / "gus" / "default").exists()


def test_start_fresh_ignores_the_snapshot_and_keeps_the_files(make_hub, tmp_path: Path):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)])
    gus_ran(hub, "was_here = 1")
    snapshot = preempt(hub)
    hub.stop_server("ann")
    with hub.login("gus") as web:  # the Hub's home page says so too
        home = web.get(f"{hub.url}/hub/home", timeout=30).text
    assert "budgethub-snapshot-notice" in home and snapshot.key in home
    start(hub, "gus", {**ONE, "fresh": "on"})
    [container] = containers(hub.hub_name)
    assert not any(e.startswith("BUDGETHUB_RESTORE_DIR=") for e in container.attrs["Config"]["Env"])
    server = Server(hub, "gus")
    assert server.get_file("notes/keep.txt") == b"kept\n"
    with server.open("a.ipynb") as kernel:
        assert kernel.value("'was_here' in globals()") is False
    hub.stop_server("gus")


# -- through the browser ----------------------------------------------------------


def test_the_preempted_user_sees_the_notice_starts_and_finds_the_restored_notebook(
    make_hub, browser, tmp_path: Path
):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)])
    start(hub, "gus")
    server = Server(hub, "gus")
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "source": "value",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
            }
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    server.api("PUT", "contents/analysis.ipynb", json={"type": "notebook", "content": notebook})
    with server.open("analysis.ipynb") as kernel:
        assert kernel.run("value = 6 * 7\nimport threading\nlock = threading.Lock()").error is None
    snapshot = preempt(hub)
    hub.stop_server("ann")

    page = log_in(browser, hub, "gus")
    text = page.inner_text("body")
    assert "A snapshot was taken" in text and snapshot.key in text, text
    assert "Start fresh" in text and "lock (" in text  # what was not kept
    assert not page.is_checked("#budgethub-fresh")  # restore is the default
    page.screenshot(path=str(tmp_path / "snapshot-notice.png"))
    page.click("form input[type=submit], form button[type=submit]")
    page.wait_for_url("**/user/gus/lab**", timeout=120_000)
    page.goto(f"{hub.url}/user/gus/lab/tree/analysis.ipynb")
    cell = page.locator(".jp-Notebook .jp-Cell").first
    cell.wait_for(timeout=60_000)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    restored = "document.body.innerText.includes('budgethub: restored')"
    try:
        for _attempt in range(3):  # a cell run before the kernel connects is dropped
            page.wait_for_function(
                "document.body.innerText.includes('(ipykernel) | Idle')", timeout=60_000
            )
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            try:
                page.wait_for_function(restored, timeout=20_000)
                break
            except PlaywrightTimeout:
                continue
        page.wait_for_function(restored, timeout=5_000)
    finally:
        page.screenshot(path=str(tmp_path / "notebook.png"))
    output = page.locator(".jp-Notebook .jp-Cell").first.inner_text()
    assert "42" in output and "value" in output, output
    page.screenshot(path=str(tmp_path / "restored-notebook.png"))
    page.context.close()
    hub.stop_server("gus")


# -- idle sessions ----------------------------------------------------------------


def activity(hub: Hub) -> dict[str, dict[str, Any]]:
    """The last activity the Hub recorded per request."""
    store = store_of(hub)
    try:
        return {e.payload["request"]: dict(e.payload) for e in store.list_events(kind="activity")}
    finally:
        store.engine.dispose()


def test_agents_report_idleness_and_the_idle_session_is_the_victim(make_hub, tmp_path: Path):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=2)], idle_poll=1.0)
    start(hub, "gus")  # the older session: more work to lose, but idle
    with Server(hub, "gus").open("idle.ipynb") as idle:
        assert idle.run("x = 1").error is None
    start(hub, "bo")
    busy = Server(hub, "bo").open("busy.ipynb")
    busy.submit("import time\ntime.sleep(600)")
    requests_of = {
        c.labels["org.budgethub.user"]: c.labels["org.budgethub.request"]
        for c in containers(hub.hub_name)
    }

    def reported() -> bool:
        seen = activity(hub)
        gus, bo = seen.get(requests_of["gus"]), seen.get(requests_of["bo"])
        return bool(gus and not gus["busy"] and gus["idle_since"] and bo and bo["busy"])

    wait_for(reported, 30, "the agents' activity to be recorded")
    snapshot = preempt(hub, victim="gus")  # the idle one goes, not the newer busy one
    assert hub.server_model("bo") is not None
    assert snapshot.report["kernel_state"] == "saved"
    busy.close()
    hub.stop_server("bo")
    hub.stop_server("ann")


def test_after_a_hub_restart_the_preemption_still_checkpoints(make_hub, tmp_path: Path):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)])
    start(hub, "gus")
    with Server(hub, "gus").open("a.ipynb") as kernel:
        assert kernel.run("kept = 'across the restart'").error is None
    hub.stop()  # sessions outlive the Hub (cleanup_servers = False)
    hub.start()
    hub.wait_ready("gus")
    snapshot = preempt(hub)  # the agent's secret came back with the spawner's state
    assert snapshot.report["kernel_state"] == "saved", snapshot.report
    assert "a.ipynb:kept" in snapshot.saved
    hub.stop_server("ann")
