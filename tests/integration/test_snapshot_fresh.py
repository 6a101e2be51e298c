"""The snapshot notice on the Hub's home page, and "Start fresh".

After a preemption the home page names the snapshot; a start with ``fresh`` set gets no
restore directory and no kernel state, but keeps the files in the home.
"""

from __future__ import annotations

from pathlib import Path

from snapshot_fixtures import ONE, gus_ran, preempt, snapshot_hub, start

from harness.hub import containers
from harness.kernels import Server
from harness.nodes import local_gpu_node


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
