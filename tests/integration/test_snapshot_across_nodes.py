"""A preempted session comes back whole on another engine: the round trip across nodes.

gus's session on the TLS node (a dockerd in its own network namespace) holds files, a
``%pip``-installed wheel and two notebooks' kernels (numbers, strings, nested
containers, a numpy array, a DataFrame, a class instance, a lambda, an open socket). A
funded request preempts it; the snapshot's report, sizes, files and their privacy are
checked; the TLS node is killed, and gus's next start restores on the local engine with
every saveable variable in the right notebook, the package importable, and the socket
named as not kept (on the spawn form and in the first cell's output).
"""

from __future__ import annotations

from pathlib import Path

from snapshot_fixtures import (
    CHECK_A,
    CHECK_B,
    IMAGE,
    TWO,
    assert_private,
    fill_session,
    on_tls,
    preempt,
    snapshot_hub,
    start,
)

from harness.hub import containers, wait_for
from harness.kernels import Server
from harness.nodes import local_gpu_node
from harness.tlsnode import TlsNode


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
