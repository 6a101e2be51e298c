"""The agent's lab route (budgethub_session.labnotice) in a real Jupyter Server with
real kernels: a lab's long poll gets the preemption notice, its saves are waited for
and reported; a lab that does not answer is named; a restored session's notice says
what came back; bad input is a 400 naming the field. The lab here is a REST client
speaking the extension's protocol (tests/integration/test_lab_notice.py drives the
real one in Chromium)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jupyter_server")

from budgethub_session.labnotice import PREEMPTING, restored_notice  # noqa: E402
from budgethub_session.localserver import LocalServer  # noqa: E402

NOTEBOOK = {
    "cells": [],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    with LocalServer(tmp_path / "root", home=tmp_path / "home") as s:
        yield s


def poll(server: LocalServer, client: str, after: int = 0, wait: int = 25) -> dict[str, Any]:
    query = f"client={client}&after={after}&wait={wait}"
    status, body = server.api("GET", f"/budgethub-agent/lab?{query}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def background(fn: Any, *args: Any) -> dict[str, Any]:
    """Run ``fn`` in a thread; the dict gets its result under "value"."""
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(value=fn(*args)), daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def ran_after_save(server: LocalServer, path: str) -> None:
    status, _ = server.api(
        "PUT", f"/api/contents/{path}", {"type": "notebook", "content": NOTEBOOK}
    )
    assert status in (200, 201)
    time.sleep(1.1)  # the kernel's activity is later than the file's mtime
    server.open_notebook(path).ok("x = 1")


def test_a_lab_saves_its_edits_before_the_checkpoint_reports(server: LocalServer) -> None:
    ran_after_save(server, "nb1.ipynb")
    first = poll(server, "lab-1", wait=0)  # the lab is open
    assert first["seq"] == 0 and first["notices"] == []
    waiting = background(poll, server, "lab-1", 0)
    checkpoint = background(server.agent, "POST", "checkpoint", {"within": 20})
    waiting["thread"].join(30)
    (notice,) = waiting["value"]["notices"]
    assert notice["kind"] == "preempting" and notice["message"] == PREEMPTING
    # The lab saves the document with unsaved changes (as JupyterLab does: a PUT), then
    # says so.
    edited = {**NOTEBOOK, "cells": [{"cell_type": "markdown", "metadata": {}, "source": "typed"}]}
    status, _ = server.api(
        "PUT", "/api/contents/nb1.ipynb", {"type": "notebook", "content": edited}
    )
    assert status == 200
    body = {"client": "lab-1", "seq": notice["seq"], "saved": ["nb1.ipynb"], "failed": {}}
    assert server.api("POST", "/budgethub-agent/lab", body)[0] == 204
    checkpoint["thread"].join(30)
    status, report = checkpoint["value"]
    assert status == 200, report
    notebooks = report["notebooks"]
    assert notebooks["edits_saved"] == ["nb1.ipynb"] and notebooks["not_flushed"] == {}
    assert notebooks["saved"] == ["nb1.ipynb"]
    assert notebooks["labs"] == {"asked": 1, "answered": 1}
    assert report["elapsed"] < 10  # it did not wait past the lab's answer


def test_what_a_lab_could_not_save_is_named_with_its_reason(server: LocalServer) -> None:
    ran_after_save(server, "nb2.ipynb")
    poll(server, "lab-2", wait=0)
    waiting = background(poll, server, "lab-2", 0)
    checkpoint = background(
        server.agent, "POST", "checkpoint", {"within": 20, "message": "Stopping: drain."}
    )
    waiting["thread"].join(30)
    (notice,) = waiting["value"]["notices"]
    assert notice["message"] == "Stopping: drain."
    failed = {"nb2.ipynb": "the file is read-only", "notes.txt": "permission denied"}
    body = {"client": "lab-2", "seq": notice["seq"], "saved": [], "failed": failed}
    assert server.api("POST", "/budgethub-agent/lab", body)[0] == 204
    checkpoint["thread"].join(30)
    status, report = checkpoint["value"]
    not_flushed = report["notebooks"]["not_flushed"]
    assert set(not_flushed) == {"nb2.ipynb", "notes.txt"}
    assert "the file is read-only" in not_flushed["nb2.ipynb"]


def test_a_lab_that_does_not_answer_is_waited_for_then_named(server: LocalServer) -> None:
    ran_after_save(server, "nb3.ipynb")
    poll(server, "gone", wait=0)  # polled once, then silent
    t0 = time.monotonic()
    status, report = server.agent("POST", "checkpoint", {"within": 4})
    took = time.monotonic() - t0
    assert status == 200
    assert 1.5 < took < 8, took  # half of within: 2 s
    why = report["notebooks"]["not_flushed"]["nb3.ipynb"]
    assert "1 of 1 open JupyterLab pages did not answer" in why, why
    assert report["notebooks"]["labs"] == {"asked": 1, "answered": 0}


def test_a_labs_polls_are_not_activity(server: LocalServer) -> None:
    """The Hub prefers idle sessions as victims: an open lab's polling must not make a
    session look busy."""
    before = server.agent("GET", "status")[1]["last_activity"]
    time.sleep(0.05)
    poll(server, "lab-idle", wait=0)
    poll(server, "lab-idle", wait=1)
    assert server.agent("GET", "status")[1]["last_activity"] == before


def test_without_a_lab_the_checkpoint_does_not_wait(server: LocalServer) -> None:
    ran_after_save(server, "nb4.ipynb")
    status, report = server.agent("POST", "checkpoint", {"within": 20})
    assert status == 200 and report["elapsed"] < 5
    why = report["notebooks"]["not_flushed"]["nb4.ipynb"]
    assert "no JupyterLab was open" in why


def test_bad_input_is_a_400_naming_the_field_and_strangers_are_refused(server: LocalServer) -> None:
    for query, field in (
        ("client=a%20b&after=0", "client"),
        ("client=ok&after=-1", "after"),
        ("client=ok&after=0&wait=60", "wait"),
    ):
        status, body = server.api("GET", f"/budgethub-agent/lab?{query}")
        assert status == 400 and body["message"].startswith(field), body
    for body, field in (
        ({"client": "x", "seq": "1"}, "seq"),
        ({"client": "x", "seq": 99}, "seq"),
        ({"client": "x", "seq": 1, "saved": "nb.ipynb"}, "saved"),
        ({"client": "x", "seq": 1, "failed": {"a": 1}}, "failed"),
        ([1], "body"),
    ):
        status, reply = server.api("POST", "/budgethub-agent/lab", body)
        assert status == 400 and reply["message"].startswith(field), (body, reply)
    status, reply = server.agent("POST", "checkpoint", {"within": 5, "message": ""})
    assert status == 400 and reply["error"].startswith("message")
    # Without the user's login: no notices, no answers.
    assert server.request("GET", "/budgethub-agent/lab?client=x&after=0")[0] == 403
    assert server.request("POST", "/budgethub-agent/lab", {"client": "x", "seq": 1})[0] == 403


def test_a_restored_session_tells_its_labs_what_came_back(tmp_path: Path) -> None:
    restore = tmp_path / "snapshot" / "kernels"
    restore.mkdir(parents=True)
    summary = {
        "key": "20261206T070000-0a1b2c3d",
        "time": 1796540400.0,
        "kernels": [
            {"notebook": "work/a.ipynb", "variables": ["df", "n"], "unsaved": {}},
            {"notebook": "b.ipynb", "variables": [], "unsaved": {}},
        ],
        "unsaved": {"work/a.ipynb:sock": "socket.socket: cannot pickle 'socket' object"},
        "edits_saved": ["work/a.ipynb"],
        "files": "kept in its volume on gpu-1",
    }
    (restore / "restore-notice.json").write_text(json.dumps(summary))
    with LocalServer(tmp_path / "root", home=tmp_path / "home", restore_dir=restore) as s:
        body = poll(s, "lab-r", wait=0)
    (notice,) = body["notices"]
    assert notice == {**restored_notice(summary), "seq": 1}
    assert notice["message"] == (
        "Restored from the snapshot of 07:00 UTC: your files, packages and 2 variables of "
        "1 notebook; 1 not kept."
    )
    assert "work/a.ipynb: 2 variables (df, n), loaded when its kernel starts" in notice["back"]
    assert "work/a.ipynb: the edits you had not saved" in notice["back"]
    assert notice["back"][0] == "Your files and installed packages (kept in its volume on gpu-1)."
    assert notice["lost"] == ["work/a.ipynb:sock: socket.socket: cannot pickle 'socket' object"]
