"""Two engines standing for two nodes, and a Hub restart with sessions running and queued."""

from __future__ import annotations

import subprocess

import docker

from harness import REPO
from harness.hub import HUB_OWNERS, containers, positions, queue_events, wait_for
from harness.nodes import NODE, ONE_GPU, cpu_node, local_gpu_node


def test_gpu_profile_lands_on_the_gpu_node_and_dataprep_on_the_cpu_node(
    make_hub, second_engine, tmp_path
):
    storage = tmp_path / "weka-a"
    storage.mkdir()
    (storage / "shard-0.csv").write_text("x,y\n1,2\n")
    storage.chmod(0o777)
    hub = make_hub(
        nodes=[
            local_gpu_node(gpus=2),
            cpu_node(str(storage), engine=second_engine),
        ]
    )
    hub.spawn("ann", {"profile": "dataprep"})
    hub.spawn("bo", ONE_GPU)
    hub.wait_ready("ann")
    hub.wait_ready("bo")
    assert hub.through_proxy("ann").status_code == 200

    [on_gpu_node] = containers(hub.hub_name)
    assert on_gpu_node.labels["org.budgethub.user"] == "bo"
    [on_cpu_node] = containers(hub.hub_name, second_engine)
    assert on_cpu_node.labels["org.budgethub.user"] == "ann"
    assert on_cpu_node.labels["org.budgethub.gpus"] == ""
    listing = on_cpu_node.exec_run(["ls", "/mnt/weka-a"]).output.decode()
    assert "shard-0.csv" in listing
    imports = on_cpu_node.exec_run(["python", "-c", "import pandas, pyarrow, duckdb"])
    assert imports.exit_code == 0, imports.output
    hub.stop_server("ann")
    hub.stop_server("bo")
    assert containers(hub.hub_name, second_engine) == []


def test_a_node_whose_engine_stops_answering_is_marked_down(make_hub, second_engine, tmp_path):
    hub = make_hub(nodes=[local_gpu_node(gpus=1), cpu_node(str(tmp_path), engine=second_engine)])
    subprocess.run([str(REPO / "scripts" / "engine"), "stop-node", NODE], check=True, timeout=60)
    try:
        wait_for(lambda: "node prep-1 is now down" in hub.log_tail(400), 30, "prep-1 marked down")
        response = hub.spawn("ann", {"profile": "dataprep"})
        assert response.status_code == 202  # queued: nothing lands on a down node
        wait_for(lambda: hub.server_model("ann") is not None, 10, "ann's pending server")
        assert hub.server_model("ann")["pending"] == "spawn"
        hub.stop_server("ann")
    finally:
        restarted = subprocess.run(
            [str(REPO / "scripts" / "engine"), "node", NODE], capture_output=True, timeout=180
        )
        assert restarted.returncode == 0


def test_hub_restart_finds_running_sessions_and_keeps_the_queue(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    hub.spawn("ann", ONE_GPU)
    hub.wait_ready("ann")
    assert hub.spawn("bo", ONE_GPU).status_code == 202
    wait_for(lambda: hub.server_model("bo") is not None, 10, "bo's pending server")
    [before] = containers(hub.hub_name)

    hub.stop()
    hub.start()

    # ann's session was found again: same container, still answering through the proxy.
    wait_for(lambda: (hub.server_model("ann") or {}).get("ready"), 30, "ann reconnected")
    assert hub.through_proxy("ann").status_code == 200
    [after] = containers(hub.hub_name)
    assert after.id == before.id
    # bo's spawn is queued again, in its old place.
    wait_for(lambda: (hub.server_model("bo") or {}).get("pending") == "spawn", 30, "bo queued")
    events: list[dict] = []
    import threading

    stop = threading.Event()
    watcher = threading.Thread(target=queue_events, args=(hub, "bo", events, stop))
    watcher.start()
    wait_for(lambda: positions(events), 20, "bo's queue position after the restart")
    assert positions(events)[-1] == 1

    hub.stop_server("ann")
    hub.wait_ready("bo")
    stop.set()
    watcher.join(timeout=30)
    hub.stop_server("bo")
    assert containers(hub.hub_name) == []


def test_engine_fixture_sees_no_leftovers(engine: docker.DockerClient):
    """No Hub made so far in this run left a container. Containers of Hubs this run
    did not make (another run on the same engine, or one killed mid-test) are not
    counted: they are not this run's, and another run may still be using them."""
    leftovers = engine.containers.list(all=True, filters={"label": "org.budgethub.hub"})
    found = [
        (
            c.name,
            HUB_OWNERS[c.labels["org.budgethub.hub"]],
            c.attrs["State"]["Status"],
            c.attrs["Created"],
        )
        for c in leftovers
        if c.labels["org.budgethub.hub"] in HUB_OWNERS
    ]
    assert found == [], "containers left behind (name, test, state, created)"
