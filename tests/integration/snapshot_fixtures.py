"""Shared set-up for the snapshot tests (tests/integration/test_snapshot_*.py).

Preemption that loses nothing, end to end: a real Hub, real engines (the local one and
the TLS node in its own network namespace), real kernels in the session image. A
session's home is a bind of ``{home_root}/{hub}/{user}`` (shared storage: here a
directory both engines see), its kernels checkpoint after each cell, and a preemption
snapshots it; the next start restores it on whichever node has room.

Here: the profile, teams and groups every snapshot Hub uses, the cells whose state a
restore must bring back (and the expressions that read it), and the helpers that start a
snapshot Hub, start and preempt sessions, read the store, and set up the troubles
(a frozen agent's pid, a small tmpfs for the store).
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.hub import Hub, scheduler_lines, wait_for
from harness.kernels import Kernel, Server, toy_wheel
from harness.nodes import FUNDED_AND_GUESTS, notebook_profile
from harness.tlsnode import TlsNode
from scheduler_core.store import SnapshotRecord, Store

IMAGE = "budgethub/dataprep:latest"
"""The session image with pandas and numpy (the extension is in every image)."""

PROFILES = [notebook_profile(IMAGE)]
ONE = {"profile": "notebook", "gpus": 1}
TWO = {"profile": "notebook", "gpus": 2}
TEAMS = FUNDED_AND_GUESTS
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
    lines = scheduler_lines(settings)
    return make_hub(nodes=nodes, teams=TEAMS, groups=GROUPS, profiles=PROFILES, extra=lines + extra)


def store_of(hub: Hub) -> Store:
    return Store.create(f"sqlite:///{hub.directory}/budgethub.sqlite", migrate_schema=False)


def snapshots(hub: Hub, user: str, server: str = "") -> list[SnapshotRecord]:
    store = store_of(hub)
    try:
        return store.list_snapshots(user=user, server=server)
    finally:
        store.engine.dispose()


READY: dict[tuple[str, str], float] = {}
"""(Hub, user) → when `start` saw the user's server ready (time.monotonic)."""


def start(hub: Hub, user: str, options: dict[str, Any] | None = None) -> None:
    response = hub.spawn(user, options or ONE)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user, timeout=120)
    READY[(hub.hub_name, user)] = time.monotonic()


def preempt(hub: Hub, victim: str = "gus", by: str = "ann", options: Any = None) -> SnapshotRecord:
    """A funded request that needs the victim's slices; the snapshot it left."""
    before = {s.key for s in snapshots(hub, victim)}
    # Past the unallocated grace (1 s) since the victim was ready, whatever ran since.
    since = time.monotonic() - READY.get((hub.hub_name, victim), time.monotonic())
    time.sleep(max(0.0, 1.2 - since))
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


def activity(hub: Hub) -> dict[str, dict[str, Any]]:
    """The last activity the Hub recorded per request."""
    store = store_of(hub)
    try:
        return {e.payload["request"]: dict(e.payload) for e in store.list_events(kind="activity")}
    finally:
        store.engine.dispose()
