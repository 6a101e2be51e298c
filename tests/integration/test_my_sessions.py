"""Issue 41: My sessions, walked in a real headless Chromium on a real Hub.

gus has a snapshotted default server (preempted), a running server and a queued one. From
the Hub's nav bar, My sessions lists all three with their state, node, what they hold,
funded or unallocated, protection and the estimated start, and no other user's name;
its buttons leave the queue, stop, start from the snapshot, start fresh and delete it. Issue
50: once the restored session has been worked in and stopped, the old snapshot is only kept
(no Start, no form or home page offer, a plain start does not restore it); a new
preemption's snapshot is offered again, and a fresh start's stop ends that offer too.
Screenshots (light and dark) go to the test's folder, or to $BUDGETHUB_SHOTS when set.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from snapshot_fixtures import ONE, TWO, preempt, snapshot_hub, snapshots, start

from harness.browser import open_hub, shot
from harness.hub import containers, wait_for
from harness.kernels import Server
from harness.nodes import local_gpu_node


def _rows(page: object) -> dict[str, str]:
    """Server name → its row's state, as the page shows them now."""
    found = page.eval_on_selector_all(  # type: ignore[attr-defined]
        "tr.budgethub-session", "rows => rows.map(r => [r.dataset.server, r.dataset.state])"
    )
    return {server: state for server, state in found}


def _line(page: object) -> str:
    """The snapshot line under the default server's row, as one line."""
    found = page.inner_text("tr.budgethub-snapshot-line[data-server='']")  # type: ignore[attr-defined]
    return " ".join(found.split())


def _dark(page: object, on: bool) -> None:
    page.evaluate(  # type: ignore[attr-defined]
        f"localStorage.setItem('jupyterhub-bs-theme', '{'dark' if on else 'light'}')"
    )
    page.reload()  # type: ignore[attr-defined]
    page.wait_for_selector("#budgethub-sessions-table")  # type: ignore[attr-defined]


def test_my_sessions_lists_every_session_of_mine_and_its_buttons_work(
    make_hub, browser, tmp_path: Path
):
    shots = Path(os.environ.get("BUDGETHUB_SHOTS") or tmp_path)
    hub = snapshot_hub(make_hub, tmp_path, [local_gpu_node(gpus=2)])
    start(hub, "gus")
    snapshot = preempt(hub, victim="gus", by="ann", options=TWO)
    hub.stop_server("ann")
    start(hub, "ann", ONE)
    assert hub.spawn("gus", ONE, server="second").status_code in (201, 202)
    hub.wait_ready("gus", "second", timeout=120)
    assert hub.spawn("gus", ONE, server="third").status_code == 202  # no GPU left

    page = open_hub(browser, hub, "gus")
    page.goto(f"{hub.url}/hub/home")
    page.click("#budgethub-my-sessions")  # in the Hub's nav bar
    page.wait_for_url("**/hub/budgethub/sessions")
    assert _rows(page) == {"second": "running", "third": "queued", "": "snapshot"}
    second = " ".join(page.inner_text("tr[data-server=second]").split())
    assert "on gpu-1" in second and "1 GPU, " in second and "unallocated" in second, second
    # Unallocated: its grace is no protection, so no "protected until" (issue 50).
    assert "not protected" in second and not re.search(r"\d\d:\d\d", second), second
    third = " ".join(page.inner_text("tr[data-server=third]").split())
    assert "position 1 of 1" in third and "unallocated" in third, third
    # The estimated start, from the read model the spawn page's queue message uses.
    estimate = page.inner_text("tr[data-server=third] td.budgethub-estimate").strip()
    said = next(e["message"] for e in hub.progress("gus", "third") if "queue" in e)
    assert estimate and estimate != "—", estimate
    clock = re.search(r"\d\d:\d\d", estimate)
    assert clock is None or clock.group(0) in said, (estimate, said)
    snap = " ".join(page.inner_text("tr.budgethub-snapshot-line[data-server='']").split())
    assert "Stopped at" in snap, snap
    body = page.inner_text("body")
    assert not re.search(r"\bann\b", body), body  # no other user's name
    page.locator("tr[data-server=second] a.budgethub-open").wait_for()
    assert page.get_attribute("tr[data-server=second] a.budgethub-open", "href").endswith(
        "/user/gus/second/"
    )
    shot(page, "my-sessions.png", shots)
    _dark(page, True)
    shot(page, "my-sessions-dark.png", shots)
    _dark(page, False)

    page.click("tr[data-server=third] .budgethub-leave")
    wait_for(lambda: hub.server_model("gus", "third") is None, 30, "third to leave the queue")
    page.wait_for_selector("tr[data-server=third]", state="detached", timeout=30_000)
    page.click("tr[data-server=second] .budgethub-stop")
    wait_for(lambda: hub.server_model("gus", "second") is None, 60, "second to stop")
    page.wait_for_selector("tr[data-server=second]", state="detached", timeout=30_000)

    page.click("tr[data-server=''] .budgethub-restore")  # start from the snapshot
    try:
        page.wait_for_url(re.compile(r".*/(spawn-pending|user)/gus.*"), timeout=60_000)
    except Exception:
        raise AssertionError(
            page.inner_text("#budgethub-action-status") + "\n" + hub.log_tail(60)
        ) from None
    model = hub.wait_ready("gus", timeout=120)
    assert model["user_options"]["restore"] == snapshot.key, model
    assert model["user_options"]["gpus"] == 1, model  # the last start's options again
    assert f"restoring snapshot {snapshot.key}" in hub.log_tail(2000)
    # Restored, worked in, stopped by its user: the old snapshot is kept, never offered.
    server = Server(hub, "gus")
    server.put_file("notes/later.txt", b"work done after the restore\n")
    server.put_notebook("later.ipynb")
    with server.open("later.ipynb") as kernel:
        assert kernel.run("later = 41 + 1").error is None
    page.goto(f"{hub.url}/hub/budgethub/sessions")
    assert _rows(page)[""] == "running"
    line = _line(page)
    assert "This session started after it" in line and "come back" not in line, line
    page.click("tr[data-server=''] .budgethub-stop")
    wait_for(lambda: hub.server_model("gus") is None, 60, "gus's server to stop")
    page.wait_for_function(
        "document.querySelector(\"tr.budgethub-session[data-server='']\")"
        " && document.querySelector(\"tr.budgethub-session[data-server='']\").dataset.state"
        " === 'stopped'",
        timeout=30_000,
    )
    row = page.locator("tr.budgethub-session[data-server='']")
    assert row.locator(".budgethub-restore, .budgethub-fresh").count() == 0
    assert row.locator(".budgethub-delete").count() == 1
    assert "older snapshot kept" in row.inner_text()
    line = _line(page)
    assert "An older snapshot, taken at" in line and "a start does not restore it" in line, line
    assert "come back" not in line and "Start fresh" not in line, line
    assert "Start" not in row.inner_text().replace("older snapshot", ""), row.inner_text()
    with hub.login("gus") as web:  # no other page proposes it either
        form = web.get(f"{hub.url}/hub/spawn/gus", timeout=30).text
        home = web.get(f"{hub.url}/hub/home", timeout=30).text
        listed = web.get(f"{hub.api}/budgethub/users/gus/snapshots", timeout=30).json()
        rows = web.get(f"{hub.api}/budgethub/users/gus/sessions", timeout=30).json()
    assert "budgethub-snapshot" not in form and snapshot.key not in form
    assert "budgethub-snapshot-notice" not in home
    assert [s["offered"] for s in listed] == [False], listed
    assert rows["sessions"][0]["state"] == "stopped" and not rows["sessions"][0]["offered"]
    shot(page, "my-sessions-old-snapshot.png", shots)
    _dark(page, True)
    shot(page, "my-sessions-old-snapshot-dark.png", shots)
    _dark(page, False)
    start(hub, "gus")  # a plain start: the later work, no rollback to the snapshot
    model = hub.wait_ready("gus", timeout=120)
    assert "restore" not in model["user_options"], model
    [box] = [c for c in containers(hub.hub_name) if c.labels["org.budgethub.user"] == "gus"]
    assert not any(e.startswith("BUDGETHUB_RESTORE_DIR=") for e in box.attrs["Config"]["Env"])
    assert Server(hub, "gus").get_file("notes/later.txt") == b"work done after the restore\n"

    # Preempted again: that snapshot is the latest state and offered; "Start fresh"
    # ignores it, and its stop ends the offer too.
    hub.stop_server("ann")
    again = preempt(hub, victim="gus", by="ann", options=TWO)
    hub.stop_server("ann")  # both GPUs free again
    page.goto(f"{hub.url}/hub/budgethub/sessions")
    assert _rows(page)[""] == "snapshot"
    line = _line(page)
    assert again.key in line and "Start fresh ignores it" in line, line
    page.click("tr[data-server=''] .budgethub-fresh")  # the snapshot ignored
    page.wait_for_url(re.compile(r".*/(spawn-pending|user)/gus.*"), timeout=60_000)
    model = hub.wait_ready("gus", timeout=120)
    assert model["user_options"]["fresh"] == "on" and "restore" not in model["user_options"]
    hub.stop_server("gus")
    page.goto(f"{hub.url}/hub/budgethub/sessions")
    assert _rows(page)[""] == "stopped"  # kept, not offered: a fresh start ran since
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("tr[data-server=''] .budgethub-delete")
    page.wait_for_selector("#budgethub-no-sessions", timeout=30_000)
    assert snapshots(hub, "gus") == []
    page.context.close()
