"""Two researchers in a real headless Chromium: one gets a notebook, one watches the queue.

This is `make demo`'s story end to end: the login form, the budget-aware spawn
form, the spawn-pending page fed by the progress stream through the proxy, and
the queued session starting when the first one stops.
"""

from __future__ import annotations

import json
import time

import requests

from harness.browser import log_in
from harness.nodes import demo_teams, local_gpu_node


def test_a_notebook_then_a_queue_that_moves_in_a_real_browser(make_hub, browser, tmp_path):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])

    ann = log_in(browser, hub, "ann")
    form = ann.content()
    assert "GPU notebook" in form and "Debug session" in form and "Data-prep session" in form
    assert "budget used" in form  # the team's budget, next to the team that pays
    ann.click("form input[type=submit], form button[type=submit]")
    ann.wait_for_url("**/user/ann/lab**", timeout=90_000)

    bo = log_in(browser, hub, "bo")
    bo.click("form input[type=submit], form button[type=submit]")
    bo.wait_for_url("**/spawn-pending/bo**", timeout=30_000)
    bo.wait_for_function(
        "document.body.innerText.includes('Queued: position 1 of 1 in the pool')",
        timeout=30_000,
    )
    assert "funded by your team's budget" in bo.inner_text("body")
    bo.screenshot(path=str(tmp_path / "queued.png"))

    hub.stop_server("ann")
    bo.wait_for_url("**/user/bo/**", timeout=90_000)
    bo.wait_for_load_state()
    assert "/user/bo/" in bo.url
    hub.stop_server("bo")


def test_the_form_states_the_protection_cap_an_admin_set(make_hub, browser):
    """Issue 41: after an admin lowers max_min_runtime in the budget service, the spawn
    form says the new cap, not the configured 8 h, and refuses a runtime above it."""
    groups = {"nlp": ["ann"], "budget-admins": ["boss"]}
    hub = make_hub(nodes=[local_gpu_node(gpus=1)], teams=demo_teams(), groups=groups)
    ann = log_in(browser, hub, "ann")
    assert "protected 1 h by default, at most 8 h" in ann.inner_text("form")
    hub.http.post(f"{hub.api}/users/boss", timeout=10)
    token = hub.http.post(f"{hub.api}/users/boss/tokens", json={}, timeout=10).json()["token"]
    service = f"{hub.url}/services/budget/api/v1/admin"
    headers = {"Authorization": f"token {token}"}
    answer = requests.patch(
        f"{service}/settings", data=json.dumps({"max_min_runtime": "2h"}), headers=headers,
        timeout=20,
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + 30
    while "at most 2 h" not in ann.inner_text("form") and time.monotonic() < deadline:
        time.sleep(0.5)
        ann.reload()
    text = ann.inner_text("form")
    assert "protected 1 h by default, at most 2 h" in text and "at most 8 h" not in text
    ann.fill("#budgethub-min-runtime", "3h")
    ann.click("form input[type=submit], form button[type=submit]")
    ann.wait_for_load_state()
    assert "3 h is over the cap of 2 h" in ann.inner_text("body")
    assert hub.server_model("ann") is None
