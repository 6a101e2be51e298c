"""The preempted user, in Chromium: the notice, the start, the restored notebook.

gus is preempted with a variable and an unpicklable lock in a notebook; logged in, the
spawn page shows the snapshot notice, what was not kept, and restore as the default;
submitting it opens JupyterLab, and running the notebook's cell prints the
"budgethub: restored" note and the restored value.
"""

from __future__ import annotations

from pathlib import Path

from snapshot_fixtures import preempt, snapshot_hub, start

from harness.browser import log_in
from harness.kernels import Server
from harness.nodes import local_gpu_node


def test_the_preempted_user_sees_the_notice_starts_and_finds_the_restored_notebook(
    make_hub, browser, tmp_path: Path
):
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=1)])
    start(hub, "gus")
    server = Server(hub, "gus")
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "source": "value",
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
    server.api("PUT", "contents/analysis.ipynb", json={"type": "notebook", "content": notebook})
    with server.open("analysis.ipynb") as kernel:
        assert kernel.run("value = 6 * 7\nimport threading\nlock = threading.Lock()").error is None
    snapshot = preempt(hub)
    hub.stop_server("ann")

    page = log_in(browser, hub, "gus")
    text = page.inner_text("body")
    assert "A snapshot was taken" in text and snapshot.key in text, text
    assert "Start fresh" in text and "lock (" in text  # what was not kept
    assert not page.is_checked("#budgethub-fresh")  # restore is the default
    page.screenshot(path=str(tmp_path / "snapshot-notice.png"))
    page.click("form input[type=submit], form button[type=submit]")
    page.wait_for_url("**/user/gus/lab**", timeout=120_000)
    page.goto(f"{hub.url}/user/gus/lab/tree/analysis.ipynb")
    cell = page.locator(".jp-Notebook .jp-Cell").first
    cell.wait_for(timeout=60_000)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    restored = "document.body.innerText.includes('budgethub: restored')"
    try:
        for _attempt in range(3):  # a cell run before the kernel connects is dropped
            page.wait_for_function(
                "document.body.innerText.includes('(ipykernel) | Idle')", timeout=60_000
            )
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            try:
                page.wait_for_function(restored, timeout=20_000)
                break
            except PlaywrightTimeout:
                continue
        page.wait_for_function(restored, timeout=5_000)
        # The note is a stream output printed before the cell's own result: the cell may
        # still be running ("[*]") when it shows, so its result is waited for in turn.
        expect(cell.locator(".jp-OutputArea")).to_contain_text("42", timeout=30_000)
    finally:
        page.screenshot(path=str(tmp_path / "notebook.png"))
    output = cell.inner_text()
    assert "42" in output and "value" in output, output
    page.screenshot(path=str(tmp_path / "restored-notebook.png"))
    page.context.close()
    hub.stop_server("gus")
