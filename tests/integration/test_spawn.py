"""A session's life through the Hub's REST API, on a real engine."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from harness.hub import containers
from harness.nodes import local_gpu_node
from spawner.runtime.dockernodes import parse_cpuset


def active_slices(directory: Path) -> int:
    with sqlite3.connect(directory / "budgethub.sqlite") as db:
        return int(db.execute("select count(*) from booked_slices").fetchone()[0])


def test_spawn_answers_through_the_proxy_and_stop_frees_everything(make_hub, tmp_path):
    hub = make_hub(nodes=[local_gpu_node(gpus=2)])
    response = hub.spawn("ann", {"profile": "gpu-notebook", "gpus": 1})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("ann")

    answer = hub.through_proxy("ann", "api")
    assert answer.status_code == 200, answer.text
    assert "version" in answer.json()

    [container] = containers(hub.hub_name)
    labels = container.labels
    assert labels["org.budgethub.user"] == "ann"
    assert labels["org.budgethub.team"] == "nlp"
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    granted = labels["org.budgethub.gpus"].split(",")
    assert len(granted) == 1
    assert env["NVIDIA_VISIBLE_DEVICES"] == granted[0]
    assert env["CUDA_VISIBLE_DEVICES"] == granted[0]
    assert json.loads(env["BUDGETHUB_GPU_SLICES"])[0]["uuid"] == granted[0]
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == "host"
    assert not host["Privileged"]
    assert container.attrs["Config"]["User"] == "1000:100"
    assert host["NanoCpus"] == 2 * 10**9
    binds = [m["Source"] for m in container.attrs["Mounts"]]
    assert not any("docker.sock" in source for source in binds)
    assert active_slices(tmp_path) == 1

    hub.stop_server("ann")
    assert containers(hub.hub_name) == []
    assert active_slices(tmp_path) == 0


def test_a_one_cpu_session_says_it_has_one_cpu(make_hub):
    """``nproc`` said 2 inside a 1-CPU session (issue 50): a session is pinned to as many
    of the node's CPUs as it was granted, so nproc and os.sched_getaffinity say 1, and
    the CFS quota still holds it to 1 CPU of time."""
    hub = make_hub(nodes=[local_gpu_node(gpus=2)])
    response = hub.spawn("ann", {"profile": "debug", "slices": "gpu-250m"})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("ann")
    [container] = containers(hub.hub_name)
    host = container.attrs["HostConfig"]
    assert host["NanoCpus"] == 10**9
    if (os.cpu_count() or 1) > 1:
        assert len(parse_cpuset(host["CpusetCpus"])) == 1, host["CpusetCpus"]
    code, out = container.exec_run(
        ["sh", "-c", "nproc; python -c 'import os; print(len(os.sched_getaffinity(0)))'"],
        user="1000:100",
    )
    assert code == 0, out
    assert out.decode().split() == ["1", "1"], out
    hub.stop_server("ann")
