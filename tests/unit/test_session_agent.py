"""The session agent (budgethub_session.agent) in a real Jupyter Server with real
kernels: who may ask, status and activity, and a kernel busy past the deadline."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("jupyter_server")

from budgethub_session.localserver import LocalKernel, LocalServer  # noqa: E402

SECRET = "s3cret-for-this-session"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    with LocalServer(tmp_path / "root", home=tmp_path / "home", secret=SECRET) as s:
        yield s


def test_refuses_without_the_secret_with_a_wrong_one_and_through_a_proxy(
    server: LocalServer,
) -> None:
    for route, method, body in (("status", "GET", None), ("checkpoint", "POST", {"within": 5})):
        assert server.agent(method, route, body, secret=None)[0] == 403
        assert server.agent(method, route, body, secret="wrong")[0] == 403
        assert server.agent(method, route, body, secret=SECRET[:-1])[0] == 403
        # The right secret, but the request came through the Hub's proxy.
        status, body_ = server.agent(
            method, route, body, secret=SECRET, headers={"X-Forwarded-For": "10.0.0.1"}
        )
        assert status == 403 and "proxied" in body_["error"]
        status, _ = server.agent(method, route, body, secret=SECRET, headers={"Forwarded": "for=x"})
        assert status == 403
        # Jupyter's own token is not the agent's secret.
        status, _ = server.request(
            method,
            f"/budgethub-agent/{route}",
            body,
            {"Authorization": f"token {server.token}"},
        )
        assert status == 403
        assert server.agent(method, route, body, secret=SECRET)[0] == 200


def test_bad_within_is_a_clear_400(server: LocalServer) -> None:
    for body, word in (({"within": "soon"}, "within"), ({"within": 0}, "within"), ([1], "body")):
        status, reply = server.agent("POST", "checkpoint", body)
        assert status == 400 and reply["error"].startswith(word), reply


def test_without_a_secret_the_agent_answers_503(tmp_path: Path) -> None:
    with LocalServer(tmp_path / "root", home=tmp_path / "home", secret=None) as s:
        status, reply = s.agent("GET", "status", secret="anything")
        assert status == 503 and "BUDGETHUB_AGENT_SECRET" in reply["error"]


def test_kernels_do_not_see_the_secret(server: LocalServer) -> None:
    k = server.open_notebook("n.ipynb")
    assert k.value("__import__('os').environ.get('BUDGETHUB_AGENT_SECRET')") is None


def test_a_kernel_busy_past_the_deadline_is_reported_busy(server: LocalServer) -> None:
    quick = server.open_notebook("quick.ipynb")
    slow = server.open_notebook("slow.ipynb")
    quick.ok("a = 1")
    slow.ok("before = 'kept'")
    status, idle = server.agent("GET", "status")
    assert status == 200 and idle["busy"] is False
    msg_id = slow.send("import time\ntime.sleep(12)\nafter = 'too late'")
    deadline = time.monotonic() + 30
    while True:  # the server has seen the cell start
        status, report = server.agent("GET", "status")
        if report["busy"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert report["busy"] is True
    states = {k["notebook"]: k["execution_state"] for k in report["kernels"]}
    assert states == {"quick.ipynb": "idle", "slow.ipynb": "busy"}

    t0 = time.monotonic()
    status, report = server.agent("POST", "checkpoint", {"within": 2})
    took = time.monotonic() - t0
    assert status == 200
    by = {k["notebook"]: k for k in report["kernels"]}
    assert by["slow.ipynb"]["state"] == "busy" and "within 2 s" in by["slow.ipynb"]["error"]
    assert by["quick.ipynb"]["state"] == "saved" and by["quick.ipynb"]["saved"] == ["a"]
    assert took < 10, took  # liveness: the deadline is kept, not the 12 s cell
    # What the slow kernel had after its last finished cell is on disk already.
    from budgethub_session import notebook_key
    from budgethub_session.checkpoint import load_manifest

    manifest = load_manifest(server.state_dir / notebook_key("slow.ipynb"))
    assert manifest is not None and set(manifest["variables"]) == {"before"}
    slow.wait(msg_id, 60)


def test_a_kernel_without_the_extension_is_reported_failed(tmp_path: Path) -> None:
    with LocalServer(tmp_path / "root", home=tmp_path / "home", checkpoint=False) as s:
        k = s.open_notebook("off.ipynb")
        k.ok("x = 1")
        status, report = s.agent("POST", "checkpoint", {"within": 10})
        assert status == 200
        (kernel,) = report["kernels"]
        assert kernel["state"] == "failed" and "BUDGETHUB_CHECKPOINT=0" in kernel["error"]


def test_status_reports_activity(server: LocalServer) -> None:
    status, first = server.agent("GET", "status")
    k = server.open_notebook("act.ipynb")
    k.ok("x = 1")
    status, second = server.agent("GET", "status")
    assert second["last_activity"] > first["last_activity"]
    (kernel,) = second["kernels"]
    assert kernel["notebook"] == "act.ipynb" and kernel["execution_state"] == "idle"
    assert kernel["last_activity"] <= second["last_activity"]
    # Asking for the status is not activity.
    time.sleep(0.05)
    assert server.agent("GET", "status")[1]["last_activity"] == second["last_activity"]


def _open_named(server: LocalServer, path: str, name: str) -> tuple[LocalKernel, str]:
    """A session for ``path`` whose client names it ``name``; its kernel and id."""
    status, model = server.api(
        "POST",
        "/api/sessions",
        {"path": path, "name": name, "type": "notebook", "kernel": {"name": "python3"}},
    )
    assert status == 201, model
    kernel = LocalKernel(server, model["kernel"]["id"], path)
    server.kernels.append(kernel)
    return kernel, model["id"]


def test_one_key_per_notebook_whatever_name_the_client_sends(tmp_path: Path) -> None:
    """Issue 42, defect 4: a client naming its session by the full path made the kernel
    key its state by ``work/work/nb1.ipynb`` and the agent by ``work/nb1.ipynb``: a
    phantom third notebook in the report, and variables missing when reopened."""
    from budgethub_session import notebook_key
    from budgethub_session.checkpoint import load_manifest

    root, home = tmp_path / "root", tmp_path / "home"
    (root / "work").mkdir(parents=True)
    with LocalServer(root, home=home, secret=SECRET) as first:
        for name in ("nb1.ipynb", "nb2.ipynb", "nb3.ipynb", "top.ipynb"):
            parent = root / ("" if name == "top.ipynb" else "work")
            (parent / name).write_text(
                '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
            )
        full, _ = _open_named(first, "work/nb1.ipynb", "work/nb1.ipynb")
        absolute, _ = _open_named(first, "work/nb2.ipynb", str(root / "work" / "nb2.ipynb"))
        # JupyterLab 4: the kernel starts for <directory>/<uuid> named by the file's name,
        # then the session moves to the notebook's path.
        lab, session_id = _open_named(first, f"work/{uuid.uuid4()}", "nb3.ipynb")
        status, _ = first.api("PATCH", f"/api/sessions/{session_id}", {"path": "work/nb3.ipynb"})
        assert status == 200
        plain = first.open_notebook("top.ipynb")
        full.ok("a = 1")
        absolute.ok("b = 2")
        lab.ok("d = 4")
        plain.ok("c = 3")
        status, report = first.agent("POST", "checkpoint", {"within": 30})
        assert status == 200, report
        by = {k["notebook"]: k["saved"] for k in report["kernels"]}
        assert by == {
            "work/nb1.ipynb": ["a"],
            "work/nb2.ipynb": ["b"],
            "work/nb3.ipynb": ["d"],
            "top.ipynb": ["c"],
        }
        keys = sorted(p.name for p in first.state_dir.iterdir() if p.is_dir())
        expected = ["top.ipynb", "work/nb1.ipynb", "work/nb2.ipynb", "work/nb3.ipynb"]
        assert keys == sorted(notebook_key(p) for p in expected)
        for path in expected:
            manifest = load_manifest(first.state_dir / notebook_key(path))
            assert manifest is not None and manifest["notebook"] == path
        assert full.value("__import__('os').environ['BUDGETHUB_NOTEBOOK']") == "work/nb1.ipynb"
        snapshot = tmp_path / "snapshot"
        shutil.copytree(first.state_dir, snapshot)
    # Reopened as JupyterLab names sessions (the file's name): the variables come back.
    with LocalServer(root, home=home, secret=SECRET, restore_dir=snapshot) as second:
        again = second.open_notebook("work/nb1.ipynb")
        assert "budgethub: restored 1 variable (a)" in again.ok("a").stdout
        assert again.value("a") == 1
