"""Two researchers in a real headless Chromium: one gets a notebook, one watches the queue.

This is `make demo`'s story end to end: the login form, the budget-aware spawn
form, the spawn-pending page fed by the progress stream through the proxy, and
the queued session starting when the first one stops.
"""

from __future__ import annotations

from harness.browser import log_in
from harness.nodes import local_gpu_node


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
