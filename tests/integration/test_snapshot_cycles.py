"""Twenty preempt/restore cycles in a row lose nothing, and the store keeps the newest.

One engine, one GPU: gus's kernel state and home files grow each cycle, ann's funded
request preempts him, and his restart restores everything so far. At the end the store
(its rows and its directories on disk) holds only the newest ``snapshot_keep`` (3).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from snapshot_fixtures import preempt, snapshot_hub, snapshots, start

from harness.kernels import Server
from harness.nodes import local_gpu_node


@pytest.mark.slow
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
