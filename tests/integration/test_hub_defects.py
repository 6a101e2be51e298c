"""Issue 41, a new user's defects, through a real Hub (and a real Chromium for the page).

A refused spawn's options are not replayed by the next spawn with no options; "Leave
the queue" on the home page takes the queued badge away and says so; a refused spawn
is one short WARNING line in the Hub's log, not an ERROR carrying a 5,000-character
value; an option of the wrong type is a 400 naming the field, not Python's words; an
administrator in no team is told what to change, not to ask an administrator.

Issue 50: a team with no share of the GPU pool reads right on My budget, Teams and My
sessions; the Hub's admin queue gives the estimated start; the home page's banner follows
a Stop.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import requests

from harness.browser import ADMIN, ADMIN_PASSWORD, open_hub, shot
from harness.hub import Hub, wait_for
from harness.nodes import FUNDED_AND_GUESTS, ONE_GPU, local_gpu_node


def _spawn_raw(hub: Hub, user: str, data: str | None) -> requests.Response:
    """A spawn POST with exactly this body: None for no body (the admin page's "Start
    Server"), "null" for JSON null."""
    hub.http.post(f"{hub.api}/users/{user}", timeout=10)  # create if missing
    headers = {"Content-Type": "application/json"} if data is not None else {}
    return hub.http.post(hub.server_path(user), data=data, headers=headers, timeout=30)


def _refused(hub: Hub, user: str, options: dict[str, Any], words: str) -> None:
    response = hub.spawn(user, options)
    assert response.status_code == 400, (options, response.status_code, response.text)
    assert words in response.json()["message"], (options, response.json())
    wait_for(lambda: hub.server_model(user) is None, 10, "the refused server to clear")


def test_a_refused_spawns_options_are_not_replayed_by_a_spawn_with_no_options(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    # Refused, then a spawn with no body: the defaults (one GPU notebook), not a replay.
    _refused(hub, "ann", {"gpus": 9999}, "does not offer 9999 GPUs")
    started = _spawn_raw(hub, "ann", None)
    assert started.status_code in (201, 202), started.text
    hub.wait_ready("ann")
    hub.stop_server("ann")
    # Refused, then a body of null: the same.
    _refused(hub, "ann", {"fresh": {"a": 1}}, "fresh: must be on or off")
    started = _spawn_raw(hub, "ann", "null")
    assert started.status_code in (201, 202), started.text
    hub.wait_ready("ann")
    hub.stop_server("ann")
    # After an accepted debug session, a refusal, then no body: the accepted options
    # (the form's defaults) again, never the refused ones.
    debug = {"profile": "debug", "slices": "gpu-250m"}
    assert hub.spawn("ann", debug).status_code in (201, 202)
    hub.wait_ready("ann")
    hub.stop_server("ann")
    _refused(hub, "ann", {"profile": "gpu-notebook", "gpus": 9999}, "does not offer 9999")
    started = _spawn_raw(hub, "ann", None)
    assert started.status_code in (201, 202), started.text
    model = hub.wait_ready("ann")
    assert model["user_options"] == debug, model
    hub.stop_server("ann")


def test_leaving_the_queue_from_the_home_page_takes_the_badge_away_and_says_so(
    make_hub, browser, tmp_path
):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")
    assert hub.spawn("bo", ONE_GPU).status_code == 202
    assert hub.spawn("bo", ONE_GPU, server="second").status_code == 202
    bo = open_hub(browser, hub, "bo")
    bo.goto(f"{hub.url}/hub/home")
    badge = bo.locator("#budgethub-queued-default")
    badge.wait_for(timeout=30_000)
    assert "queued, position 1 of 2" in badge.inner_text()
    row = bo.locator(".home-server-row[data-server-name=second]")
    assert "queued, position 2 of 2" in row.inner_text()

    bo.click("#stop")  # "Leave the queue"
    left = bo.locator("#budgethub-left-queue-default")
    left.wait_for(state="visible", timeout=30_000)
    assert "You left the queue (you were at position 1 of 2)" in " ".join(left.inner_text().split())
    assert bo.locator("#budgethub-queued-default").count() == 0
    assert "Start My Server" in bo.inner_text("#start")
    wait_for(lambda: hub.server_model("bo") is None, 20, "bo's default server to go")

    row.locator(".stop-server").click()  # a named server's "leave queue"
    row.locator(".budgethub-left-queue").wait_for(timeout=30_000)
    assert "queued, position" not in row.inner_text()
    assert "left the queue" in row.inner_text()
    shot(bo, "home-left-queue.png", tmp_path)
    wait_for(lambda: hub.server_model("bo", "second") is None, 20, "bo's second server to go")
    hub.stop_server("ann")


def test_a_refused_spawn_is_one_short_warning_line_in_the_hubs_log(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    name = "long-profile-" + "x" * 5000
    before = hub.log_path.stat().st_size
    response = hub.spawn("ann", {"profile": name})
    assert response.status_code == 400, response.text
    wait_for(lambda: hub.server_model("ann") is None, 10, "the refused server to clear")

    def new_lines() -> list[str]:
        with hub.log_path.open("rb") as log:
            log.seek(before)
            return log.read().decode(errors="replace").splitlines()

    wait_for(lambda: any("400 POST" in line for line in new_lines()), 10, "the request's log line")
    time.sleep(0.5)
    lines = new_lines()
    about = [line for line in lines if "long-profile-" in line]
    assert not [line for line in lines if line.startswith("[E ")], lines
    warnings = [line for line in about if line.startswith("[W ")]
    assert len(warnings) == 1, warnings
    assert "Spawn refused (400, form) for ann's server" in warnings[0], warnings
    assert all(len(line) < 300 for line in about), [len(line) for line in about]
    assert "Traceback" not in "\n".join(lines)
    # The user is told the same, the name cut short too.
    message = response.json()["message"]
    assert message.startswith("Cannot start: profile: unknown profile 'long-profile-xxx")
    assert "(5013 characters)" in message and len(message) < 300, message


WRONG_TYPES = [
    ({"profile": {"a": 1}}, "Cannot start: profile: must be a string, not a mapping."),
    ({"slices": {"x": 1}}, "Cannot start: slices: must be a string, not a mapping."),
    ({"team": ["nlp", "vision"]}, "Cannot start: team: expected one value, got 2."),
    ({"min_runtime": {"a": 1}}, "Cannot start: min_runtime: must be a duration"),
    ({"gpus": True}, "Cannot start: gpus: must be a whole number, not a boolean (true)."),
    ({"priority": [[1]]}, "Cannot start: priority: must be a whole number, not a list."),
    ({"restore": 7}, "Cannot start: restore: must be a string (a snapshot key), not a number"),
]


def test_options_of_the_wrong_type_are_a_400_naming_the_field(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    for options, words in WRONG_TYPES:
        response = hub.spawn("ann", options)
        assert response.status_code == 400, (options, response.status_code, response.text)
        message = response.json()["message"]
        assert message.startswith(words), (options, message)
        assert "expected string" not in message and "bytes-like" not in message
        wait_for(lambda: hub.server_model("ann") is None, 10, "the refused server to clear")
    assert "Traceback" not in hub.log_tail(2000)


def test_an_administrator_in_no_team_is_told_what_to_change(make_hub, browser, tmp_path):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)], extra=ADMIN)
    admin = open_hub(browser, hub, "admin", ADMIN_PASSWORD)
    admin.goto(f"{hub.url}/hub/spawn")
    text = " ".join(admin.inner_text("main, body").split())
    assert "You are in no team, so no session can start for you." in text
    assert "ask an administrator" not in text, text
    assert "as an administrator, add yourself to a team's group on the admin page" in text
    assert "/hub/admin#/groups" in text and "c.BudgetScheduler.teams" in text
    shot(admin, "admin-no-team.png", tmp_path)
    refused = hub.spawn("admin", ONE_GPU)
    assert refused.status_code == 400, refused.text
    message = refused.json()["message"]
    assert "ask an administrator" not in message, message
    assert "as an administrator, add yourself to a team's group" in message, message


# -- issue 50: a team with no share, the admin queue's estimate, the banner after Stop ----

NO_SHARE_GROUPS = {"nlp": ["ann", "bo"], "guests": ["gus"]}


def _words(locator: Any) -> str:
    """A locator's text as one line."""
    return " ".join(locator.inner_text().split())


def _both_themes(page: Any, name: str, directory: Path, ready: str) -> None:
    """A screenshot of the page in light and in dark (the Hub's toggle keeps the choice in
    localStorage, and the budget service follows it)."""
    shot(page, f"{name}.png", directory)
    page.evaluate("localStorage.setItem('jupyterhub-bs-theme', 'dark')")
    page.reload()
    page.wait_for_selector(ready)
    assert page.get_attribute("html", "data-bs-theme") == "dark"
    shot(page, f"{name}-dark.png", directory)
    page.evaluate("localStorage.setItem('jupyterhub-bs-theme', 'light')")
    page.reload()
    page.wait_for_selector(ready)


def test_a_team_with_no_share_and_its_unallocated_session_read_right_everywhere(
    make_hub, browser, tmp_path
):
    """Issue 50, items 3-5 in a real Chromium. guests have no share of the GPU pool; gus
    runs a notebook on a GPU unallocated while ann's nlp notebook is funded, and bo's waits.
    gus's My budget ranks guests among both teams ("of 2"), says what it holds with its
    unit, and says nothing is owed rather than "no usage yet"; the Teams page keeps guests
    on the ratio chart and in the delivered chart's legend; his session shows no "protected
    until" (My sessions, My budget); the Hub's admin queue gives bo's estimated start, the
    spawn page's own; the home page's banner drops "holds 1 GPU funded" after Stop."""
    shots = Path(os.environ.get("BUDGETHUB_SHOTS") or tmp_path)
    hub = make_hub(
        nodes=[local_gpu_node(gpus=2)],
        teams=FUNDED_AND_GUESTS,
        groups=NO_SHARE_GROUPS,
        extra=ADMIN + "c.BudgetScheduler.unallocated_grace = 3600.0\n",
    )
    assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")
    assert hub.spawn("gus", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("gus")
    assert hub.spawn("bo", ONE_GPU).status_code == 202  # both GPUs held: bo waits

    gus = open_hub(browser, hub, "gus")
    gus.goto(f"{hub.url}/services/budget/my")
    pool = gus.locator(".budget-team[data-team=guests] .budget-pool[data-pool=gpu]")
    pool.wait_for(timeout=30_000)
    text = _words(pool)
    assert "1 GPU unallocated" in pool.locator(".holds").inner_text(), text
    assert "(rank 2 of 2," in text, text
    assert "no usage yet" not in text and "nothing is owed" in text, text
    assert "would run unallocated (preemptible): the team has no share of this pool." in text
    sessions = _words(gus.locator("#my-sessions"))
    assert "unallocated" in sessions and "not protected" in sessions, sessions
    assert not re.search(r"\b\d\d:\d\d\b", sessions), sessions  # no "protected until" clock
    _both_themes(gus, "my-budget-no-share", shots, ".budget-team")

    def teams_drawn() -> bool:  # ann's funded use shows once it passes the axis' 0.01
        gus.goto(f"{hub.url}/services/budget/teams")
        # Its lines, not the svg: before that the chart is an svg saying "no usage yet".
        lines = gus.locator(".budget-pool[data-pool=gpu] svg.usage-lines polyline.usage")
        return lines.count() > 0

    wait_for(teams_drawn, 120, "the Teams page's delivered chart")
    gpu = gus.locator(".budget-pool[data-pool=gpu]")
    ratio = gpu.locator("svg.ratio-bars").inner_html()
    assert "guests" in ratio and "nlp" in ratio, ratio
    legend = gpu.locator("svg.usage-lines").inner_html()
    assert "guests (no share)" in legend and ">nlp<" in legend, legend
    row = _words(gpu.locator("tr[data-team=guests]"))
    assert "1 GPU" in row, row
    _both_themes(gus, "teams-no-share", shots, ".budget-pool")

    gus.goto(f"{hub.url}/hub/budgethub/sessions")
    mine = gus.locator("tr.budgethub-session[data-server='']")
    mine.wait_for(timeout=30_000)
    assert _words(mine.locator("td.budgethub-protected")) == "not protected"

    admin = open_hub(browser, hub, "admin", ADMIN_PASSWORD)
    admin.goto(f"{hub.url}/hub/admin")
    queued = admin.locator("#budgethub-queue tr.budgethub-queue-row[data-user=bo]")
    queued.wait_for(timeout=30_000)
    estimate = _words(queued.locator("td.budgethub-estimate"))
    said = next(e["message"] for e in hub.progress("bo") if "queue" in e)
    assert estimate.startswith("estimated start about ") or estimate.startswith("no "), estimate
    clock = re.search(r"\d\d:\d\d", estimate)
    assert clock is None or clock.group(0) in said, (estimate, said)
    assert estimate.split(",")[0] in said, (estimate, said)
    admin.locator("#budgethub-queue").scroll_into_view_if_needed()
    _both_themes(admin, "hub-admin-queue-estimate", shots, "#budgethub-queue")
    hub.stop_server("bo")  # out of the queue: nothing of nlp's starts when ann stops
    wait_for(lambda: hub.server_model("bo") is None, 30, "bo to leave the queue")

    ann = open_hub(browser, hub, "ann")
    ann.goto(f"{hub.url}/hub/home")
    banner = ann.locator(".budgethub-status")
    assert "gpu: holds 1 GPU funded" in banner.inner_text()
    ann.click("#stop")
    wait_for(lambda: hub.server_model("ann") is None, 60, "ann's server to stop")
    ann.wait_for_function(
        "!document.querySelector('.budgethub-status').innerText.includes('holds 1 GPU funded')"
        " && !document.querySelector('.budgethub-stopping')",
        timeout=30_000,
    )
    assert "gpu: holds 0 GPU funded" in banner.inner_text(), banner.inner_text()
    for context in (gus.context, admin.context, ann.context):
        context.close()
    hub.stop_server("gus")
