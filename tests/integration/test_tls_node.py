"""A remote engine over tcp:// with TLS, as the README documents: the TLS node of
``tls_node`` (a dockerd in its own network namespace, joined to this host by a veth)
next to the local engine, under one real Hub."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import requests

from harness.hub import Hub, containers, wait_for
from harness.nodes import ONE_GPU, local_gpu_node
from harness.tlsnode import TlsNode, make_certificates

LABEL = "org.budgethub"


def two_sessions(hub: Hub, tls_node: TlsNode) -> tuple[str, str]:
    """ann and bo each get one GPU: one lands on each node. (user on the TLS node, other)."""
    for user in ("ann", "bo"):
        assert hub.spawn(user, ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")
    hub.wait_ready("bo")
    [remote] = tls_node.containers(hub.hub_name)
    [local] = containers(hub.hub_name)
    return remote.labels[f"{LABEL}.user"], local.labels[f"{LABEL}.user"]


def connects(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def test_a_session_on_the_tls_node_starts_answers_through_the_proxy_and_stops(
    make_hub, tls_node: TlsNode
):
    hub = make_hub(nodes=[local_gpu_node(gpus=1), tls_node.node()], extra=tls_node.hub_extra)
    user, other = two_sessions(hub, tls_node)
    [remote] = tls_node.containers(hub.hub_name)
    port = int(remote.labels[f"{LABEL}.port"])
    assert f"--ip={tls_node.address}" in remote.attrs["Args"]
    # The server listens in the node's namespace: over the veth, not on this host's loopback.
    assert connects(tls_node.address, port)
    assert not connects("127.0.0.1", port)

    # Through the Hub's proxy (which checks the token with the Hub's API, from the node).
    assert hub.through_proxy(user).status_code == 200
    assert hub.through_proxy(other).status_code == 200
    kernel = hub.http.post(f"{hub.url}/user/{user}/api/kernels", json={}, timeout=60)
    assert kernel.status_code == 201, kernel.text[:300]
    kernels = hub.through_proxy(user, "api/kernels").json()
    assert [k["id"] for k in kernels] == [kernel.json()["id"]]

    hub.stop_server(user)
    assert tls_node.containers(hub.hub_name) == []
    assert not connects(tls_node.address, port)
    hub.stop_server(other)
    assert containers(hub.hub_name) == []


def test_the_tls_node_refuses_a_client_without_its_certificate(tls_node: TlsNode, tmp_path: Path):
    ping = f"https://{tls_node.address}:2376/_ping"
    ca = tls_node.tls["ca"]
    mine = (tls_node.tls["cert"], tls_node.tls["key"])
    assert requests.get(ping, verify=ca, cert=mine, timeout=10).text == "OK"

    with pytest.raises(requests.exceptions.ConnectionError):  # no client certificate
        requests.get(ping, verify=ca, timeout=10)
    make_certificates(tmp_path / "other", tls_node.address)  # a client of another CA
    other = (str(tmp_path / "other" / "cert.pem"), str(tmp_path / "other" / "key.pem"))
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(ping, verify=ca, cert=other, timeout=10)
    plain = requests.get(f"http://{tls_node.address}:2376/_ping", timeout=10)
    assert plain.status_code == 400 and "HTTPS" in plain.text  # no plain HTTP either


def test_a_tls_node_whose_dockerd_is_killed_is_seen_down(make_hub, tls_node: TlsNode):
    hub = make_hub(nodes=[local_gpu_node(gpus=1), tls_node.node()], extra=tls_node.hub_extra)
    user, other = two_sessions(hub, tls_node)
    tls_node.kill()
    try:
        wait_for(lambda: "node gpu-b is now down" in hub.log_tail(600), 30, "gpu-b marked down")
        # Its session's slices are freed and its server ends in the Hub; the other stays.
        hub.wait_stopped(user, timeout=60)
        assert hub.through_proxy(other).status_code == 200
        # Nothing new lands on a down node: a third spawn waits.
        assert hub.spawn("cy", ONE_GPU).status_code == 202
        wait_for(lambda: hub.server_model("cy") is not None, 10, "cy's pending server")
        assert hub.server_model("cy")["pending"] == "spawn"
    finally:
        tls_node.start()
    # Back up: the node is ready again and the waiting spawn lands there.
    wait_for(lambda: "node gpu-b is now ready" in hub.log_tail(600), 60, "gpu-b ready again")
    hub.wait_ready("cy")
    [on_tls] = tls_node.containers(hub.hub_name)
    assert on_tls.labels[f"{LABEL}.user"] == "cy"
    assert hub.through_proxy("cy").status_code == 200
    hub.stop_server("cy")
    hub.stop_server(other)
    assert tls_node.containers(hub.hub_name) == []
