"""Forecasts through a real Hub (issue 40): what the spawn form and the admin's queue
say is the policy's own dry run, and what then happens agrees with it.

Each test failed before: the form's funding came from a second `funds()` call that
knew nothing of day slices (S5), its order from a loop of its own without the debug
lane (S1), and the budget service's Queue page gave an admin no estimate at all.
"""

from __future__ import annotations

import html
import re
import time
from typing import Any

import requests

from harness.hub import Hub
from harness.nodes import ONE_GPU, local_gpu_node

PREFIX = "/services/budget/"


def form_line(hub: Hub, user: str, profile: str, team: str) -> str:
    """The spawn form's forecast for ``profile`` paid by ``team``, as ``user`` sees it."""
    page = hub.login(user).get(f"{hub.url}/hub/spawn", timeout=30)
    assert page.status_code == 200, page.text[:300]
    start = f'budgethub-profile" data-profile="{profile}">'
    block = page.text.split(start, 1)[1].split('budgethub-profile" data-profile=', 1)[0]
    found = re.search(rf'<li data-team="{team}">(.*?)</li>', block, re.S)
    assert found, block[:2000]
    text = re.sub(r'<span class="badge[^"]*">[^<]*</span>', "", found.group(1))  # the team
    return html.unescape(re.sub(r"<[^>]+>", "", text)).strip()


def granted(hub: Hub, user: str) -> str:
    """The Hub log's grant line for ``user``'s default server."""
    for line in hub.log_path.read_text(errors="replace").splitlines():
        if "budgethub: granted " in line and f"granted {user}/" in line:
            return line
    raise AssertionError(f"no grant logged for {user}")


def test_the_form_says_funded_and_starts_now_for_a_request_the_policy_then_starts_funded(
    make_hub: Any,
) -> None:
    """Issue 40's first case: vision's share is 1.2 GPU and its funded sessions hold 1
    GPU; a second GPU is past what R2 funds beside it, but it is a day slice (S5), which
    the policy funds. The form said "would run unallocated"; the Hub then granted it
    funded."""
    hub = make_hub(
        nodes=[local_gpu_node(gpus=4)],
        teams=[
            {"name": "nlp", "share": {"gpu": 0.7, "cpu": 0.7}},
            {"name": "vision", "share": {"gpu": 0.3, "cpu": 0.3}},
        ],
        groups={"nlp": ["ann"], "vision": ["bo", "eve"]},
    )
    assert hub.spawn("bo", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("bo")
    line = form_line(hub, "eve", "gpu-notebook", "vision")
    assert line.startswith("would be funded, protected for 1 h"), line
    assert line.endswith("; starts now"), line
    asked = time.time()
    assert hub.spawn("eve", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("eve")
    grant = granted(hub, "eve")
    assert grant.endswith("(funded)"), grant
    assert time.time() - asked < 60
    hub.stop_server("eve")
    hub.stop_server("bo")


MIG_PROFILES = [
    {
        "slug": "gpu-notebook",
        "display_name": "GPU notebook",
        "class": "interactive",
        "pool": "gpu",
        "image": "budgethub/gpu:latest",
        "gpus": [1],
        "cpus": 1,
        "memory_gib": 2,
        "min_runtime": "1h",
        "max_min_runtime": "8h",
    },
    {
        "slug": "debug",
        "display_name": "Debug session",
        "class": "debug",
        "pool": "gpu",
        "image": "budgethub/gpu:latest",
        "slices": [{"mig": "1g.10gb"}],
        "cpus": 1,
        "memory_gib": 2,
        "min_runtime": "15m",
        "max_min_runtime": "15m",
    },
]


def test_a_debug_request_with_free_mig_instances_says_it_starts_now(make_hub: Any) -> None:
    """Issue 40's second case: ann (nlp) holds the node's one whole GPU, two requests of
    vision (which ranks first) wait for it, and five MIG instances are free. The form
    put dan's (nlp) debug session behind vision's two ("2 ahead in the queue; estimated
    start at the latest ..."): the old order had no debug lane. It starts at once."""
    hub = make_hub(
        nodes=[local_gpu_node(gpus=2, mig={"1": ["1g.10gb"] * 5}, cpus=16, memory_gib=32)],
        groups={"nlp": ["ann", "dan"], "vision": ["bo", "cy"]},
        profiles=MIG_PROFILES,
    )
    assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")
    for user in ("bo", "cy"):
        assert hub.spawn(user, ONE_GPU).status_code == 202  # both wait for the GPU
    page = hub.login("dan").get(f"{hub.url}/hub/spawn", timeout=30).text
    assert "(5 free now)" in page, page[:3000]
    line = form_line(hub, "dan", "debug", "nlp")
    assert line == "would be funded, protected for 15 min; starts now", line
    asked = time.time()
    assert hub.spawn("dan", {"profile": "debug"}).status_code in (201, 202)
    hub.wait_ready("dan")
    assert time.time() - asked < 60
    assert granted(hub, "dan")
    for user in ("dan", "bo", "cy", "ann"):
        hub.stop_server(user)


def test_the_admin_queue_shows_an_estimate_on_every_row(make_hub: Any) -> None:
    """Three requests wait behind two GPUs held for an hour; the budget service's queue
    gives the admin an estimated start on each (it said "unknown" on every row)."""
    hub = make_hub(
        nodes=[local_gpu_node(gpus=2)],
        groups={"nlp": ["ann", "cy"], "vision": ["bo", "dan", "eve"], "budget-admins": ["boss"]},
    )
    for user in ("ann", "bo"):
        assert hub.spawn(user, ONE_GPU).status_code in (201, 202)
        hub.wait_ready(user)
    for user in ("cy", "dan", "eve"):
        assert hub.spawn(user, ONE_GPU).status_code == 202
    hub.http.post(f"{hub.api}/users/boss", timeout=10)
    made = hub.http.post(f"{hub.api}/users/boss/tokens", json={"note": "forecasts"}, timeout=10)
    assert made.status_code == 201, made.text
    headers = {"Authorization": f"token {made.json()['token']}"}

    def queue() -> list[dict[str, Any]]:
        answer = requests.get(f"{hub.url}{PREFIX}api/v1/queue", headers=headers, timeout=30)
        if answer.status_code != 200:
            return []
        rows = [r for pool in answer.json()["pools"] for r in pool["requests"]]
        return rows if len(rows) == 3 else []

    deadline = time.monotonic() + 90
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not rows:
        rows = queue()
        time.sleep(0.5)
    assert rows, "the service never listed the three waiting requests"
    now = time.time()
    for row in rows:
        start = row["estimated_start"]
        assert start is not None, row
        # Both GPUs are protected for an hour: nothing starts before that ends.
        assert now + 3000 < start < now + 4 * 86400, row
    for user in ("cy", "dan", "eve", "ann", "bo"):
        hub.stop_server(user)
