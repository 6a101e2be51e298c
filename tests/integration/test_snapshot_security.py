"""Nobody but its owner restores, reads or lists a snapshot; forged options are refused.

The session's agent answers only the spawner, with the secret, straight to the port
(not without it, not with a wrong one or a forwarded one, not through the proxy). Another
user (bo) sees no snapshot on his spawn form, and is refused gus's key through the
form, the spawn REST API (his own server and gus's) and the snapshot REST route, as is
the admin service. Forged restore options (paths, an unknown key, a bad "fresh") are
refused. gus's own start restores it; bo's session mounts nothing of it; deleting gus
deletes his snapshots' rows and files.
"""

from __future__ import annotations

from pathlib import Path

import requests
from snapshot_fixtures import ONE, preempt, snapshot_hub, snapshots, start

from harness.hub import containers, wait_for
from harness.kernels import Server
from harness.nodes import local_gpu_node


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
