"""When a snapshot cannot be taken, the slices are still freed and the home is kept.

An agent frozen with SIGSTOP (it never answers within ``snapshot_grace``): the report
says why, the spawn form says the kernel state was not saved, and the files and the
``%pip``-installed package come back. A snapshot store that is full, then read-only (a
small tmpfs): the preemptor still starts, the report names the trouble, an earlier
snapshot is never deleted by a failed one, and the home is whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import docker
import pytest
from snapshot_fixtures import (
    gus_ran,
    preempt,
    server_pid,
    small_filesystem,
    snapshot_hub,
    start,
)

from harness.hub import containers
from harness.kernels import Server, toy_wheel
from harness.nodes import local_gpu_node


@pytest.mark.slow
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


@pytest.mark.slow
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
