"""The spawn flow as a new user meets it, in a real Hub and a real headless Chromium.

The Hub's own pages with budgethub's template overrides (the home page's budget
banner and queued servers, the spawn form's per-profile outlook, the admin page's
queue), leaving the queue from the spawn page, an estimate that says what it rests
on and moves with the queue, refusals in plain words that keep what was typed, a
user in no team, and a Hub log without tracebacks, false "ready"s, proxy 404s,
unhandled-options warnings or xsrf values.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

from harness.browser import ADMIN, ADMIN_PASSWORD, open_hub, shot
from harness.hub import queue_events, wait_for
from harness.nodes import ONE_GPU, cpu_node, local_gpu_node
from scheduler_core.verdict import NO_VICTIMS, SHARE
from spawner.readmodel.status import verdict_words


def test_home_banner_form_outlook_and_admin_queue(make_hub, browser, tmp_path):
    # Unallocated sessions are not displaced during this test.
    hub = make_hub(
        nodes=[local_gpu_node(gpus=2), cpu_node(str(tmp_path))],
        extra=ADMIN + "c.BudgetScheduler.unallocated_grace = 3600",
    )
    # ann (nlp) holds one GPU, funded: nlp's share of two GPUs is one.
    assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")

    cy = open_hub(browser, hub, "cy")  # nlp too
    cy.goto(f"{hub.url}/hub/home")
    banner = cy.inner_text(".budgethub-banner")
    assert "nlp" in banner
    assert "gpu: holds 1 GPU funded of a 1 GPU share (bursts to 1.25 GPU)" in banner
    assert "of its 7-day budget used" in banner
    link = cy.get_attribute("#budgethub-my-budget", "href")
    assert link == "/services/budget/"
    shot(cy, "home-banner.png", tmp_path)

    cy.goto(f"{hub.url}/hub/spawn")
    form = cy.inner_text("#spawn_form")
    # The budget line shows what the team holds now against share and burst.
    assert "nlp gpu: holds 1 GPU funded of a 1 GPU share" in form
    # Per profile and team: funded or not, and the wait, as the queue messages say it.
    notebook = cy.inner_text(".budgethub-profile[data-profile=gpu-notebook]")
    assert "would run unallocated, preemptible: beyond the team's burst limit next to its " in (
        notebook  # the policy's verdict (OVER_BURST), with the team's figures
    )
    assert "starts within a minute" not in notebook  # unallocated: no promise
    debug = cy.inner_text(".budgethub-profile[data-profile=debug]")
    assert "would be funded, protected for 15 min; starts now" in debug  # a dry run of decide
    # Free capacity per choice, and the polish: "1 CPU", the default minimum runtime.
    assert "1 GPU (1 free now)" in form and "2 GPUs (none free now)" in form
    assert "0.25 of a GPU (4 free now)" in cy.content()
    assert "1 CPU, 2 GiB; protected 15 min by default" in debug
    assert "2 CPUs, 4 GiB; protected 1 h by default, at most 8 h" in notebook
    assert "1 CPUs" not in form and "protected up to" not in form
    assert cy.is_visible("#spawn_form button[type=submit]")
    shot(cy, "spawn-form.png", tmp_path)

    # bo (vision) queues behind a full node: his home page says queued, not running.
    assert hub.spawn("cy", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("cy")
    assert hub.spawn("bo", ONE_GPU).status_code == 202
    bo = open_hub(browser, hub, "bo")
    bo.goto(f"{hub.url}/hub/home")
    queued = bo.inner_text("#budgethub-queued-default")
    assert "queued, position 1 of 1" in queued
    assert "estimated start about" in queued
    assert "Stop My Server" not in bo.inner_text("main, body")
    assert bo.inner_text("#stop") == "Leave the queue"
    shot(bo, "home-queued.png", tmp_path)
    bo.goto(f"{hub.url}/hub/spawn-pending/bo")
    bo.wait_for_function(
        "document.body.innerText.includes('Queued: position 1 of 1')", timeout=30_000
    )
    assert bo.inner_text("#budgethub-pending-title") == "Your session is waiting in the queue"
    assert "starting up" not in bo.inner_text("h1, #budgethub-pending-hint")

    admin = open_hub(browser, hub, "admin", ADMIN_PASSWORD)
    admin.goto(f"{hub.url}/hub/admin")
    table = admin.inner_text(".budgethub-admin-queue")
    assert re.search(
        r"1 of 1\s+pool gpu\s+bo\s+\(default\)\s+vision\s+1 of 1 in team\s+gpu-notebook", table
    ), table
    # Why it waits: the verdict's codes in the one map's words (bo's team is under its
    # share; both GPUs are funded work, so nothing can be preempted for him).
    assert verdict_words(NO_VICTIMS, SHARE) in table
    shot(admin, "admin-queue.png", tmp_path)
    hub.stop_server("bo")
    hub.stop_server("cy")
    hub.stop_server("ann")


def test_leaving_the_queue_from_the_spawn_page_lands_on_the_form_saying_so(
    make_hub,
    browser,
    tmp_path,
):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    hub.spawn("ann", ONE_GPU)
    hub.wait_ready("ann")
    bo = open_hub(browser, hub, "bo")
    bo.wait_for_url("**/hub/spawn**", timeout=30_000)
    bo.click("#spawn_form button[type=submit]")
    bo.wait_for_url("**/spawn-pending/bo**", timeout=30_000)
    bo.wait_for_function(
        "document.body.innerText.includes('Queued: position 1 of 1')", timeout=30_000
    )
    # A second progress stream open on the same spawn (another tab).
    other = bo.context.new_page()
    other.goto(f"{hub.url}/hub/spawn-pending/bo")
    other.wait_for_function(
        "document.body.innerText.includes('Queued: position 1 of 1')", timeout=30_000
    )
    assert bo.inner_text("#stop-server-btn") == "Leave the queue"
    mark = len(hub.log_path.read_text(errors="replace"))
    bo.click("#stop-server-btn")
    bo.wait_for_url("**/hub/spawn/bo", timeout=30_000)
    bo.wait_for_load_state()
    notice = bo.inner_text(".budgethub-notice")
    assert "You left the queue at" in notice and "position 1 of 1" in notice
    shot(bo, "left-queue.png", tmp_path)
    other.wait_for_url("**/hub/spawn/bo", timeout=30_000)  # the other tab follows
    assert "You left the queue" in other.inner_text("body")
    wait_for(lambda: hub.server_model("bo") is None, 20, "bo's server to clear")
    time.sleep(1.5)  # any late redirect or log line
    log = hub.log_path.read_text(errors="replace")[mark:]
    assert "left the queue" in log
    assert "Server bo is ready" not in log
    assert "api_request to proxy failed" not in log
    assert "Redirect loop" not in log and "redirect loop" not in bo.content().lower()
    assert " 424 " not in log
    hub.stop_server("ann")


@pytest.mark.slow
def test_the_estimate_says_what_it_rests_on_and_moves_with_the_queue(make_hub):
    # Two GPUs: ann holds one protected for 1 h, bo one for 2 h. cy and dan wait; when
    # the one ahead leaves the queue, the other's estimate moves to the earlier end.
    hub = make_hub(
        nodes=[local_gpu_node(gpus=2)],
        teams=[
            {"name": "nlp", "share": {"gpu": 0.25, "cpu": 0.25}},
            {"name": "vision", "share": {"gpu": 0.25, "cpu": 0.25}},
            {"name": "robotics", "share": {"gpu": 0.5, "cpu": 0.5}},
        ],
        groups={"nlp": ["ann"], "vision": ["bo"], "robotics": ["cy", "dan"]},
    )
    hub.spawn("ann", {**ONE_GPU, "min_runtime": "1h"})
    hub.wait_ready("ann")
    ann_ends = time.time() + 3600
    hub.spawn("bo", {**ONE_GPU, "min_runtime": "2h"})
    hub.wait_ready("bo")
    bo_ends = time.time() + 7200
    stop = threading.Event()
    found: dict[str, list[dict[str, Any]]] = {"cy": [], "dan": []}
    threads = []
    for user in ("cy", "dan"):
        assert hub.spawn(user, ONE_GPU).status_code == 202
        thread = threading.Thread(target=queue_events, args=(hub, user, found[user], stop))
        thread.start()
        threads.append(thread)
        wait_for(lambda u=user: any("queue" in e for e in found[u]), 20, f"{user}'s position")
    wait_for(
        lambda: {found[u][-1].get("queue", {}).get("position") for u in found} == {1, 2},
        20,
        "positions 1 and 2",
    )
    second = next(u for u in found if found[u][-1]["queue"]["position"] == 2)
    first = "cy" if second == "dan" else "dan"
    before = found[second][-1]
    estimate = before["queue"]["estimated_start"]
    assert abs(estimate - bo_ends) < 120, (before, bo_ends)  # the second protection to end
    clock = time.strftime("%H:%M", time.localtime(estimate))
    expected = f"estimated start about {clock}, if running sessions end when their protection"
    assert expected in before["message"], before
    hub.stop_server(first)  # the one ahead leaves the queue
    wait_for(lambda: found[second][-1].get("queue", {}).get("position") == 1, 20, "the move to 1")
    after = found[second][-1]
    estimate = after["queue"]["estimated_start"]
    assert abs(estimate - ann_ends) < 120, (after, ann_ends)  # now the first one to end
    clock = time.strftime("%H:%M", time.localtime(estimate))
    expected = f"estimated start about {clock}, if running sessions end when their protection"
    assert expected in after["message"], after
    stop.set()
    hub.stop_server(second)
    for thread in threads:
        thread.join(timeout=30)
    hub.stop_server("ann")
    hub.stop_server("bo")


def test_a_refused_form_reads_plainly_keeps_what_was_typed_and_logs_one_line(
    make_hub,
    browser,
    tmp_path,
):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    ann = open_hub(browser, hub, "ann")
    ann.wait_for_url("**/hub/spawn**", timeout=30_000)
    ann.fill("#budgethub-min-runtime", "24h")
    ann.fill("#budgethub-priority", "7")
    ann.click("#spawn_form button[type=submit]")
    ann.wait_for_selector(".spawn-error-msg", timeout=30_000)
    error = ann.inner_text(".spawn-error-msg")
    assert error.startswith("Cannot start: min_runtime: 24 h is over the cap of 8 h"), error
    assert "SpawnException" not in error and not error.startswith("Error")
    assert ann.input_value("#budgethub-min-runtime") == "24h"
    assert ann.input_value("#budgethub-priority") == "7"
    shot(ann, "refused.png", tmp_path)
    # Now a good spawn: no "unhandled user_options" warning, and no xsrf value in the log.
    ann.fill("#budgethub-min-runtime", "")
    ann.click("#spawn_form button[type=submit]")
    ann.wait_for_url("**/user/ann/**", timeout=90_000)
    log = hub.log_path.read_text(errors="replace")
    refusals = [line for line in log.splitlines() if "Spawn form refused" in line]
    assert len(refusals) == 1 and "[W " in refusals[0], refusals
    assert "min_runtime: 24 h is over the cap" in refusals[0]
    assert "Traceback" not in log
    assert "Failed to spawn single-user server with form" not in log
    assert "unhandled user_options" not in log
    xsrf = ann.context.cookies()
    values = [c["value"] for c in xsrf if c["name"] == "_xsrf"]
    assert values and all(v not in log for v in values)
    assert re.search(r"_xsrf=(?!\[)", log) is None
    hub.stop_server("ann")


def test_a_user_in_no_team_is_told_whom_to_ask_and_gets_no_start_button(
    make_hub,
    browser,
    tmp_path,
):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)], extra=ADMIN)
    gus = open_hub(browser, hub, "gus")
    gus.wait_for_url("**/hub/spawn**", timeout=30_000)
    text = gus.inner_text("main, body")
    assert "You are in no team, so no session can start for you." in text
    assert "ask an administrator (admin) to add you to one" in text
    assert "teams here: nlp, vision" in text
    assert gus.locator("#spawn_form button[type=submit]").count() == 0
    assert gus.locator("select[name=team]").count() == 0
    shot(gus, "no-team.png", tmp_path)


def test_inside_the_session_a_launcher_card_says_what_was_granted(
    make_hub,
    browser,
    tmp_path,
):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    ann = open_hub(browser, hub, "ann")
    ann.wait_for_url("**/hub/spawn**", timeout=30_000)
    ann.check("#budgethub-profile-debug")
    ann.select_option("select[name=slices][data-profile=debug]", "gpu-250m")
    ann.click("#spawn_form button[type=submit]")
    ann.wait_for_url("**/user/ann/lab**", timeout=90_000)
    title = "Your session: 0.25 of a GPU, virtual · nlp · funded"
    card = ann.locator(".jp-LauncherCard", has_text=title)
    card.wait_for(timeout=60_000)
    shot(ann, "launcher-card.png", tmp_path)
    card.click()
    frame = ann.frame_locator("iframe[src*='budgethub-grant']")
    table = frame.locator("#grant")
    table.wait_for(timeout=60_000)
    text = table.inner_text()
    assert "virtual (declared for this cluster" in text
    assert "funded by your team's budget" in text
    assert "nlp" in text and "gpu-1" in text and "debug" in text
    assert re.search(r"until \d\d:\d\d \(\d+ min from now\)", text), text
    shot(ann, "grant-tab.png", tmp_path)
    hub.stop_server("ann")
