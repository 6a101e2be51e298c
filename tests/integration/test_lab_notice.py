"""Inside JupyterLab, in Chromium (issue 42): a preempted user's lab says why the session
is being stopped, saves what they typed but had not saved, and after the restore the
notebook holds the typed text and the lab says what came back.

gus types a line into a notebook cell without saving; a funded request preempts him.
The real budgethub-lab extension in the session image shows the notice and saves the
notebook during the snapshot grace; the snapshot's report names the saved edits. gus
starts again (restoring is the default): the notebook holds the line, its kernel the
variable, and the lab shows the "Restored from the snapshot" notice with its details.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from snapshot_fixtures import preempt, snapshot_hub, start

from harness.browser import open_hub, shot
from harness.hub import Hub
from harness.kernels import Kernel, Server
from harness.nodes import local_gpu_node
from spawner.runtime.snaprecord import snapshot_sentence

TYPED = "typed_but_never_saved = 'kept'"
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "source": "value = 6 * 7",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
        }
    ],
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}


def open_notebook(page: Any, hub: Hub, path: str) -> Any:
    """The notebook open in gus's JupyterLab, its kernel idle; its first cell."""
    page.goto(f"{hub.url}/user/gus/lab/tree/{path}")
    cell = page.locator(".jp-Notebook .jp-Cell").first
    cell.wait_for(timeout=90_000)
    page.wait_for_function("document.body.innerText.includes('(ipykernel) | Idle')", timeout=90_000)
    return cell


def body_has(page: Any, text: str, timeout: float = 30_000) -> None:
    page.wait_for_function(f"document.body.innerText.includes({json.dumps(text)})", timeout=timeout)


def test_the_lab_warns_saves_the_unsaved_edits_and_says_what_came_back(
    make_hub, browser, tmp_path: Path
):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)])
    start(hub, "gus")
    server = Server(hub, "gus")
    server.api("PUT", "contents/draft.ipynb", json={"type": "notebook", "content": NOTEBOOK})
    with server.open("draft.ipynb") as kernel:
        assert kernel.run("value = 6 * 7").error is None
    # A client that names its session by the whole path (as harness.kernels does):
    # still one notebook, work/notes.ipynb (issue 42, defect 4).
    server.put_notebook("work/notes.ipynb")
    with server.open("work/notes.ipynb") as kernel:
        assert kernel.run("w = 'notes'").error is None

    page = open_hub(browser, hub, "gus")
    try:
        cell = open_notebook(page, hub, "draft.ipynb")
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+End")
        page.keyboard.type("\n" + TYPED)
        body_has(page, TYPED)
        on_disk = hub_home(tmp_path, hub) / "draft.ipynb"
        assert TYPED not in on_disk.read_text()  # typed, not saved

        snapshot = preempt(hub)
        body_has(page, "This session is being stopped for a funded request")
        body_has(page, "your variables, files and packages are being saved")
        body_has(page, "Saved your unsaved edits: draft.ipynb")
        shot(page, "lab-preempting.png", tmp_path)
    finally:
        page.context.close()
    # The edits were saved during the grace, and the report says so.
    assert TYPED in json.dumps(json.loads(on_disk.read_text())["cells"])
    report = snapshot.report or {}
    assert report["notebooks"]["edits_saved"] == ["draft.ipynb"], report["notebooks"]
    assert report["notebooks"]["not_flushed"] == {}
    assert not any("unsaved changes" in k for k in report["unsaved"]), report["unsaved"]
    assert [k["notebook"] for k in report["kernels"]] == ["draft.ipynb", "work/notes.ipynb"]
    assert "2 variables of 2 notebooks come back" in snapshot_sentence(report)
    hub.stop_server("ann")

    start(hub, "gus")
    page = open_hub(browser, hub, "gus")
    try:
        cell = open_notebook(page, hub, "draft.ipynb")
        assert TYPED in cell.inner_text()
        body_has(page, "Restored from the snapshot of")
        body_has(page, "and 2 variables of 2 notebooks")
        page.get_by_role("button", name="Details").first.click()
        body_has(page, "draft.ipynb: 1 variable (value), loaded when its kernel starts")
        body_has(page, "draft.ipynb: the edits you had not saved")
        shot(page, "lab-restored.png", tmp_path)
        # The lab's kernel for the notebook came back with its variable.
        server = Server(hub, "gus")
        (session,) = [s for s in server.sessions() if s["path"] == "draft.ipynb"]
        with Kernel(server, session["kernel"]["id"]) as kernel:
            assert kernel.value("value") == 42
    finally:
        page.context.close()
    hub.stop_server("gus")


def hub_home(tmp_path: Path, hub: Hub) -> Path:
    """gus's home on the Hub's shared storage (``home_root``)."""
    homes = tmp_path / "homes"
    (home,) = [p / "gus" for p in homes.iterdir() if (p / "gus").is_dir()]
    return home
