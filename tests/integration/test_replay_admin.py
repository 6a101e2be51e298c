"""The budget service's admin page and the last `budgethub replay` report (issue 51): a
real Hub whose store holds a past run, a report written by the real command into the
reports' directory (``replay/`` beside the store, the default), and its admin, who
opens the report from the admin page and applies a what-if's setting through the
admin route that already exists, with its audit entry, taken in by the scheduler."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from harness.hub import Hub, wait_for
from harness.nodes import local_gpu_node
from scheduler_core.research.replay_write import simulate_recorded, write_run
from scheduler_core.scenario import parse_scenario
from scheduler_core.store import Store

PREFIX = "/services/budget/"
TEAMS = [
    {"name": "nlp", "share": {"gpu": 0.5, "cpu": 0.5}},
    {"name": "vision", "share": {"gpu": 0.5, "cpu": 0.5}},
]
GROUPS = {"nlp": ["ann"], "vision": ["bo"], "budget-admins": ["boss"]}
DAY = 86400.0
APPLY_FORM = r'<form[^>]*class="[^"]*replay-apply[^"]*"[^>]*>(.*?)</form>'
HIDDEN = r'<input type="hidden" name="([^"]+)" value="([^"]*)"'


def past_run(store_url: str, base: float) -> None:
    """An hour of debug and notebook sessions of both teams on the Hub's one node,
    simulated and written into the store as if it had run live from ``base``."""
    requests_ = [
        {
            "id": f"{user}/s{i}/{i:08x}",
            "user": user,
            "team": team,
            "pool": "gpu",
            "submit": 60.0 * i,
            "gpus": 1,
            "cpus": 1,
            "memory_gib": 1,
            "duration": 600.0 + 30 * i,
            "class": "debug" if i % 3 == 0 else "interactive",
            "min_runtime": 300.0,
        }
        for i, (user, team) in enumerate([("ann", "nlp"), ("bo", "vision")] * 6)
    ]
    node = local_gpu_node(gpus=2)
    data = {
        "name": "past",
        "horizon": 3600.0,
        "pools": [{"name": "gpu", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"}],
        "nodes": [{k: node[k] for k in ("name", "pool", "gpus", "cpus", "memory_gib")}],
        "teams": TEAMS,
        "requests": requests_,
    }
    with Store.create(store_url) as store:
        write_run(store, simulate_recorded(parse_scenario(data)), base)


def admin_page(hub: Hub, browser: requests.Session) -> str:
    response = browser.get(f"{hub.url}{PREFIX}admin", timeout=30)
    assert response.status_code == 200, response.text[:500]
    return response.text


def apply_form(page: str, key: str) -> dict[str, str]:
    """The fields of the admin page's Apply form that sets ``key``."""
    for form in re.findall(
        r'<form[^>]*class="[^"]*replay-apply[^"]*"[^>]*>(.*?)</form>', page, re.S
    ):
        fields = {
            name: html.unescape(value)
            for name, value in re.findall(
                r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form
            )
        }
        if key in fields:
            return fields
    raise AssertionError(f"no Apply form for {key} on the admin page")


def test_admin_page_links_the_last_replay_and_applies_its_what_if(make_hub, tmp_path: Path):
    store_url = f"sqlite:///{tmp_path}/budgethub.sqlite"  # the Hub's store (harness.hub)
    base = time.time() - 3 * 3600
    past_run(store_url, base)
    reports = tmp_path / "replay"
    reports.mkdir()
    written = subprocess.run(
        [
            str(Path(sys.executable).parent / "budgethub"),
            "replay",
            store_url,
            "--since",
            f"{base:.0f}",
            "--until",
            f"{base + 3600:.0f}",
            "--set",
            "lookback=2d",
            "--policy",
            "legacy",
            "--json",
            str(reports / "last-hour.json"),
            "--plot",
            str(reports / "last-hour.png"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert written.returncode == 0, written.stderr
    report = json.loads((reports / "last-hour.json").read_text())
    hub = make_hub(nodes=[local_gpu_node(gpus=2)], teams=TEAMS, groups=GROUPS)
    boss = hub.login("boss")
    wait_for(
        lambda: boss.get(f"{hub.url}{PREFIX}admin", timeout=30).status_code == 200,
        60,
        "the budget service",
    )
    page = admin_page(hub, boss)

    # The link to the report, and its plot: served as written, to admins only.
    assert f'href="{PREFIX}admin/replay/last-hour.json"' in page
    assert f'href="{PREFIX}admin/replay/last-hour.png"' in page
    served = boss.get(f"{hub.url}{PREFIX}admin/replay/last-hour.json", timeout=30)
    assert served.status_code == 200 and served.json() == report
    plot = boss.get(f"{hub.url}{PREFIX}admin/replay/last-hour.png", timeout=30)
    assert plot.status_code == 200 and plot.content.startswith(b"\x89PNG")
    missing = boss.get(f"{hub.url}{PREFIX}admin/replay/..%2Fbudgethub.sqlite", timeout=30)
    assert missing.status_code == 404
    ann = hub.login("ann")
    assert ann.get(f"{hub.url}{PREFIX}admin/replay/last-hour.json", timeout=30).status_code == 403
    # The what-ifs: legacy is the configuration's to set; lookback=2d can be applied here.
    assert "policy: set in the configuration file, not here" in page
    fields = apply_form(page, "lookback")
    assert fields["action"] == "settings" and float(fields["lookback"]) == 2 * DAY

    # Applied through the existing admin route (the settings form's POST), as admin.
    posted = boss.post(
        f"{hub.url}{PREFIX}admin",
        data=fields,  # the form as the page gives it (its _xsrf too)
        timeout=30,
    )
    assert posted.status_code == 200 and posted.url.endswith("admin?done=settings"), posted.text
    token = _token(hub, "boss")

    def admin_state() -> Any:
        headers = {"Authorization": f"token {token}"}
        return requests.get(f"{hub.url}{PREFIX}api/v1/admin", headers=headers, timeout=30).json()

    entry = admin_state()["audit"][0]
    assert (entry["actor"], entry["target"], entry["old"], entry["new"]) == (
        "boss",
        "lookback",
        7 * DAY,
        2 * DAY,
    )
    wait_for(lambda: admin_state()["applied"] >= entry["id"], 30, "the scheduler to take it in")
    assert admin_state()["settings"]["lookback"] == 2 * DAY
    with Store.create(store_url, migrate_schema=False) as store:
        applied = store.list_events(kind="admin-applied")
    assert applied and applied[-1].payload["audit_id"] >= entry["id"]
    assert applied[-1].payload["settings"]["lookback"] == 2 * DAY


def _token(hub: Hub, user: str) -> str:
    response = hub.http.post(f"{hub.api}/users/{user}/tokens", json={"note": "replay"}, timeout=10)
    assert response.status_code == 201, response.text
    return str(response.json()["token"])
