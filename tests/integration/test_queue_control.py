"""Issue 41: an administrator controls the queue from the Hub, through a real Hub.

An admin changes a queued request's priority (it moves inside its own team's queue and
never past another team's request), and cancels a queued request: its spawn ends as a
cancelled one with the admin's reason, which the user's spawn form and My sessions show
without the admin's name, under a heading of its own and not as a failure, until the
user has seen it (issue 50); both actions are in the audit log. A user may do neither; a
forged request id or a value of the wrong type is a 400 naming the field, never a 500.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import requests

from harness.browser import ADMIN, ADMIN_PASSWORD, api_session, open_hub, shot
from harness.hub import PASSWORD, Hub, queue_events, wait_for
from harness.nodes import ONE_GPU, local_gpu_node
from scheduler_core.store import Store
from scheduler_core.store.admin import AdminStore


def _queue_status(hub: Hub, user: str, server: str = "") -> dict[str, Any]:
    """The queue part of the first progress event of a queued spawn."""
    for event in hub.progress(user, server, limit=20):
        if "queue" in event:
            return dict(event["queue"])
    raise AssertionError(f"{user}:{server} sent no queue event")


def _audit(hub: Hub) -> list[Any]:
    store = Store.create(f"sqlite:///{hub.directory}/budgethub.sqlite", migrate_schema=False)
    try:
        return AdminStore(store).audit()
    finally:
        store.engine.dispose()


def _pending_ids(hub: Hub, user: str, server: str = "") -> list[str]:
    store = Store.create(f"sqlite:///{hub.directory}/budgethub.sqlite", migrate_schema=False)
    try:
        return [r.id for r in store.pending_requests() if r.id.startswith(f"{user}/{server}/")]
    finally:
        store.engine.dispose()


def _request_id(hub: Hub, user: str, server: str = "") -> str:
    ids = _pending_ids(hub, user, server)
    assert len(ids) == 1, ids
    return ids[0]


def test_an_admin_moves_a_request_inside_its_team_and_cancels_one_with_a_reason(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)], extra=ADMIN)
    assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")
    for user, server in (("cy", ""), ("ann", "two"), ("bo", "")):
        assert hub.spawn(user, ONE_GPU, server=server).status_code == 202
    wait_for(lambda: _queue_status(hub, "bo")["waiting"] == 3, 20, "three waiting")
    before = _queue_status(hub, "ann", "two")
    assert (before["team_position"], before["team_waiting"]) == (2, 2), before
    bo_before = _queue_status(hub, "bo")["position"]
    admin = api_session(hub, "admin", ADMIN_PASSWORD)

    moved = admin.post(
        f"{hub.url}/hub/api/budgethub/queue/priority",
        json={"request": _request_id(hub, "ann", "two"), "priority": 50},
        timeout=10,
    )
    assert moved.status_code == 200, moved.text
    assert moved.json()["old"] == 0 and moved.json()["new"] == 50
    after = _queue_status(hub, "ann", "two")
    assert after["team_position"] == 1, after  # ahead of cy, its teammate
    assert _queue_status(hub, "cy")["team_position"] == 2
    assert _queue_status(hub, "bo")["position"] == bo_before  # no team reordered

    events: list[dict[str, Any]] = []
    listening = threading.Thread(
        target=queue_events, args=(hub, "cy", events, threading.Event()), daemon=True
    )
    listening.start()
    wait_for(lambda: events, 10, "cy's progress stream")
    cy_id = _request_id(hub, "cy")
    cancelled = admin.post(
        f"{hub.url}/hub/api/budgethub/queue/cancel",
        json={"request": cy_id, "reason": "node maintenance at noon"},
        timeout=10,
    )
    assert cancelled.status_code == 200, cancelled.text
    listening.join(timeout=30)
    # A cancel, not a failure (issue 50): the stream says why, then ends "Spawn cancelled".
    said = [e for e in events if e.get("withdrawn")]
    assert said and "node maintenance at noon" in said[-1]["message"], events
    assert "admin" not in said[-1]["message"].replace("administrator", "")
    failed = [e for e in events if e.get("failed")]
    assert failed and failed[-1]["message"] == "Spawn cancelled", events
    wait_for(lambda: hub.server_model("cy") is None, 30, "cy's cancelled spawn to clear")

    cy = api_session(hub, "cy", PASSWORD)
    mine = cy.get(f"{hub.url}/hub/api/budgethub/users/cy/sessions", timeout=10).json()
    assert [n["message"] for n in mine["notices"] if "node maintenance" in n["message"]], mine
    page = cy.get(f"{hub.url}/hub/budgethub/sessions", timeout=10)
    assert "node maintenance at noon" in page.text
    assert ">admin<" not in page.text  # the admin's name is not shown to cy
    form = cy.get(f"{hub.url}/hub/spawn/cy", timeout=30)
    assert "An administrator took your request out of the queue" in form.text, form.text[:2000]
    assert "node maintenance at noon" in form.text and "Taken out of the queue" in form.text
    # Seen once on the form, the notice is gone: from the form and from My sessions.
    assert "node maintenance" not in cy.get(f"{hub.url}/hub/spawn/cy", timeout=30).text
    mine = cy.get(f"{hub.url}/hub/api/budgethub/users/cy/sessions", timeout=10).json()
    assert not [n for n in mine["notices"] if "node maintenance" in n["message"]], mine

    audit = {(e.target, e.actor): e for e in _audit(hub)}
    assert audit[(f"queue.{cy_id}", "admin")].new == "cancelled: node maintenance at noon"
    entry = audit[(f"queue.{_request_id(hub, 'ann', 'two')}.priority", "admin")]
    assert (entry.old, entry.new) == (0, 50)
    for user, server in (("ann", "two"), ("bo", "")):
        hub.stop_server(user, server)
    hub.stop_server("ann")


def _refused(session: requests.Session, url: str, body: Any, status: int, field: str) -> None:
    if isinstance(body, bytes):
        response = session.post(url, data=body, timeout=10)
    else:
        response = session.post(url, json=body, timeout=10)
    assert response.status_code == status, (body, response.status_code, response.text)
    message = response.json()["message"]
    assert message.startswith(f"{field}: "), (body, message)


def test_bad_input_to_the_queue_routes_is_a_400_or_403_naming_the_field(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)], extra=ADMIN)
    assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")
    assert hub.spawn("bo", ONE_GPU).status_code == 202
    bo_id = _request_id(hub, "bo")
    cancel = f"{hub.url}/hub/api/budgethub/queue/cancel"
    priority = f"{hub.url}/hub/api/budgethub/queue/priority"

    ann = api_session(hub, "ann", PASSWORD)  # not an admin: bo's request is not hers
    _refused(ann, cancel, {"request": bo_id, "reason": "mine now"}, 403, "admin")
    _refused(ann, priority, {"request": bo_id, "priority": 100}, 403, "admin")
    _refused(ann, cancel, {"request": "bo//forged"}, 403, "admin")  # nothing learnt
    assert requests.post(cancel, json={"request": bo_id}, timeout=10).status_code == 403

    admin = api_session(hub, "admin", ADMIN_PASSWORD)
    for body, field in (
        ({"request": "bo//00000000"}, "request"),
        ({"request": bo_id.replace("bo/", "ann/")}, "request"),
        ({"request": 12}, "request"),
        ({"request": None}, "request"),
        ({"request": bo_id, "reason": 5}, "reason"),
        ({"request": bo_id, "reason": "x" * 501}, "reason"),
        ({"request": bo_id, "why": "typo"}, "why"),
        ([bo_id], "body"),
        (b"{not json", "body"),
    ):
        _refused(admin, cancel, body, 400, field)
    for body, field in (
        ({"request": bo_id, "priority": "high"}, "priority"),
        ({"request": bo_id, "priority": 1.5}, "priority"),
        ({"request": bo_id, "priority": True}, "priority"),
        ({"request": bo_id, "priority": -1}, "priority"),
        ({"request": bo_id, "priority": 101}, "priority"),
        ({"request": bo_id}, "priority"),
        ({"request": "x" * 5000, "priority": 1}, "request"),
    ):
        _refused(admin, priority, body, 400, field)
    # JSON has no NaN or Infinity (Python's json reads them): said so, naming where.
    for url, body, field in (
        (cancel, b"NaN", "body"),
        (priority, b'{"request": "%s", "priority": Infinity}' % bo_id.encode(), "priority"),
    ):
        refused = admin.post(url, data=body, timeout=10)
        assert refused.status_code == 400, refused.text
        message = refused.json()["message"]
        assert message.startswith(f"{field}: ") and "no NaN or Infinity" in message, message
    # Nothing above changed bo's place; the forged ids named nobody else's request.
    assert _queue_status(hub, "bo")["position"] == 1

    # My sessions' routes: another user's sessions are not found; wrong types are 400s.
    assert ann.get(f"{hub.url}/hub/api/budgethub/users/bo/sessions", timeout=10).status_code == 404
    delete = f"{hub.url}/hub/api/budgethub/users/ann/sessions/delete-snapshots"
    _refused(ann, delete, {"server": 3}, 400, "server")
    _refused(ann, delete, {"server": "nothing-here"}, 400, "server")
    _refused(ann, delete, {"server": "", "all": True}, 400, "body")
    _refused(ann, delete, "all", 400, "body")
    other = f"{hub.url}/hub/api/budgethub/users/bo/sessions/delete-snapshots"
    assert ann.post(other, json={"server": ""}, timeout=10).status_code == 404
    mine = ann.get(f"{hub.url}/hub/api/budgethub/users/ann/sessions", timeout=10).json()
    assert not re.search(r"\bbo\b", json.dumps(mine)), mine  # no other user's name
    assert "Traceback" not in hub.log_tail(400)
    hub.stop_server("bo")
    hub.stop_server("ann")


def test_the_admin_page_sets_a_priority_cancels_and_cancels_a_pending_spawn(
    make_hub, browser, tmp_path
):
    shots = Path(os.environ.get("BUDGETHUB_SHOTS") or tmp_path)
    hub = make_hub(nodes=[local_gpu_node(gpus=1)], extra=ADMIN)
    assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")
    for user, server in (("cy", ""), ("ann", "two"), ("bo", "")):
        assert hub.spawn(user, ONE_GPU, server=server).status_code == 202
    page = open_hub(browser, hub, "admin", ADMIN_PASSWORD)
    page.goto(f"{hub.url}/hub/admin")
    rows = page.locator(".budgethub-queue-row")
    rows.first.wait_for(timeout=30_000)
    assert rows.count() == 3
    # The Hub's own table: a queued server's disabled "Server is pending" gets a cancel.
    page.locator(".budgethub-cancel-pending").first.wait_for(timeout=30_000)
    assert page.locator(".budgethub-cancel-pending").count() == 3
    shot(page, "admin-queue-control.png", shots)
    page.evaluate("localStorage.setItem('jupyterhub-bs-theme', 'dark')")
    page.reload()
    page.locator(".budgethub-cancel-pending").first.wait_for(timeout=30_000)
    shot(page, "admin-queue-control-dark.png", shots)
    page.evaluate("localStorage.setItem('jupyterhub-bs-theme', 'light')")
    page.reload()

    two = page.locator(".budgethub-queue-row[data-user=ann][data-server=two]")
    two.locator("input[name=priority]").fill("7")
    with page.expect_navigation(timeout=15_000):  # the page says so, then reloads
        two.locator(".budgethub-priority button").click()
        page.locator("#budgethub-queue-status.alert-success").wait_for(timeout=10_000)
        assert "set from 0 to 7" in page.inner_text("#budgethub-queue-status")
    wait_for(lambda: _queue_status(hub, "ann", "two")["team_position"] == 1, 10, "ann/two first")
    two = page.locator(".budgethub-queue-row[data-user=ann][data-server=two]")
    two.wait_for(timeout=10_000)
    assert two.locator("input[name=priority]").input_value() == "7"
    two.locator("input[name=priority]").fill("2.5")  # the API names the field
    two.locator(".budgethub-priority button").click()
    page.locator("#budgethub-queue-status.alert-danger").wait_for(timeout=10_000)
    assert "priority: must be a whole number" in page.inner_text("#budgethub-queue-status")

    cy = page.locator(".budgethub-queue-row[data-user=cy]")
    cy.locator("input[name=reason]").fill("the GPU is reserved for a course today")
    cy.locator(".budgethub-cancel button").click()
    wait_for(lambda: hub.server_model("cy") is None, 30, "cy's spawn to end")

    page.reload()
    page.locator(".budgethub-queue-row").first.wait_for(timeout=30_000)
    bo_button = page.locator("tr.user-row:has([data-testid='user-name-div-bo'])")
    bo_button.locator(".budgethub-cancel-pending").click()
    wait_for(lambda: hub.server_model("bo") is None, 30, "bo's spawn to end")
    entries = [(e.target.split(".")[0], e.new) for e in _audit(hub) if e.actor == "admin"]
    assert ("queue", "cancelled: the GPU is reserved for a course today") in entries, entries
    assert ("queue", "cancelled") in entries and ("queue", 7) in entries, entries
    page.context.close()
    hub.stop_server("ann", "two")
    hub.stop_server("ann")


def _cancel_seen(hub: Any, admin: Any, page: Any, reason: str) -> Any:
    """The admin cancels cy's waiting request with ``reason``; cy's page goes back to the
    form and shows the cancel notice, which is returned."""
    cancelled = admin.post(
        f"{hub.url}/hub/api/budgethub/queue/cancel",
        json={"request": _request_id(hub, "cy"), "reason": reason},
        timeout=30,
    )
    assert cancelled.status_code == 200, cancelled.text
    page.wait_for_url("**/hub/spawn/cy", timeout=30_000)
    page.wait_for_load_state()
    notice = page.locator(".budgethub-cancelled")
    notice.wait_for(timeout=10_000)
    return notice


def test_an_admins_cancel_is_a_notice_on_the_users_page_not_a_failure(make_hub, browser, tmp_path):
    """Issue 50: the user waiting on the spawn page sees the admin's cancel as a notice
    with its own heading (never "Spawn failed" nor "has failed"); the Hub logs it at INFO
    with its reason and no error; seen once, or on a new start, it is gone."""
    shots = Path(os.environ.get("BUDGETHUB_SHOTS") or tmp_path)
    hub = make_hub(nodes=[local_gpu_node(gpus=1)], extra=ADMIN)
    assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")
    cy = open_hub(browser, hub, "cy")
    cy.wait_for_url("**/hub/spawn**", timeout=30_000)
    cy.click("#spawn_form button[type=submit]")
    cy.wait_for_url("**/spawn-pending/cy**", timeout=30_000)
    cy.wait_for_function(
        "document.body.innerText.includes('Queued: position 1 of 1')", timeout=30_000
    )
    mark = len(hub.log_path.read_text(errors="replace"))
    admin = api_session(hub, "admin", ADMIN_PASSWORD)
    notice = _cancel_seen(hub, admin, cy, "the GPU is reserved for a course")
    assert notice.locator("h2").inner_text() == "Taken out of the queue"
    assert "the GPU is reserved for a course" in notice.inner_text()
    body = cy.inner_text("body")
    assert "Spawn failed" not in body and "has failed" not in body, body
    assert cy.locator(".spawn-error-msg").count() == 0
    assert cy.locator("#spawn_form button[type=submit]").is_visible()
    shot(cy, "admin-cancel-notice.png", shots)
    wait_for(lambda: hub.server_model("cy") is None, 30, "cy's cancelled spawn to clear")
    time.sleep(1.0)  # any late log line of the cancel

    log = hub.log_path.read_text(errors="replace")[mark:]
    errors = [line for line in log.splitlines() if line.startswith(("[E ", "[C "))]
    assert not errors, errors
    assert "Previous spawn for cy failed" not in log and "Not starting cy" not in log
    (line,) = [x for x in log.splitlines() if "cancel of cy/" in x]
    assert line.startswith("[I ") and "the GPU is reserved for a course" in line, line

    # Seen: a reload no longer shows it; the server's own page is no failure either.
    cy.reload()
    cy.wait_for_load_state()
    assert cy.locator(".budgethub-cancelled").count() == 0
    assert "reserved for a course" not in cy.inner_text("body")
    cy.goto(f"{hub.url}/hub/spawn-pending/cy")
    assert "Spawn failed" not in cy.inner_text("body")

    # Once more in the dark theme: queued again, cancelled again, the notice again.
    cy.goto(f"{hub.url}/hub/spawn/cy")
    cy.evaluate("localStorage.setItem('jupyterhub-bs-theme', 'dark')")
    cy.reload()
    cy.click("#spawn_form button[type=submit]")
    cy.wait_for_url("**/spawn-pending/cy**", timeout=30_000)
    wait_for(lambda: _pending_ids(hub, "cy"), 20, "cy queued again")
    assert (
        "the course runs late" in _cancel_seen(hub, admin, cy, "the course runs late").inner_text()
    )
    shot(cy, "admin-cancel-notice-dark.png", shots)
    cy.context.close()
    hub.stop_server("ann")
