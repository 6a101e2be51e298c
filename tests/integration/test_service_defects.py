"""The budget service's defects of issue 41, each held here: absurd admin values, stale
data, numbers and words, capacity figures that explain each other.

The service's tornado application runs in this process on a real HTTP server on
127.0.0.1 over a SQLite store file (as ``bench.service`` runs it); the Hub's login is
left out (the user comes from a header), so these need no Docker engine and no Hub. The
store holds the situations of the issue: a node of four GPUs, one of them split into
seven MIG instances, three whole GPUs and one MIG instance held; a data-prep session
holding 4 CPUs and 16 GiB on ``prep-1``; two requests of eve's waiting.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from scheduler_core import model, verdict
from scheduler_core.store import Store
from scheduler_core.store.records import RequestState
from spawner.profiles import human_duration
from spawner.readmodel import storeview
from spawner.readmodel.service import app as service_app
from spawner.readmodel.status import verdict_words
from spawner.readmodel.storeview import StoreModel

GPU = model.Pool("gpu", model.PoolKind.GPU)
CPU = model.Pool("cpu", model.PoolKind.CPU)
GROUPS = {"ann": ["nlp"], "bo": ["nlp"], "cy": ["vision"], "di": ["vision"], "eve": ["nlp"]}
PREFIX = "/services/budget/"


def node_list() -> list[model.Node]:
    return [
        model.Node(
            "gpu-1", "gpu", 32.0, 256.0, model.virtual_gpus("gpu-1", 4, mig={3: ["1g.10gb"] * 7})
        ),
        model.Node("prep-1", "cpu", 16.0, 64.0),
    ]


def book(store: Store, request: model.Request, node: str, slices: tuple[model.Slice, ...]) -> None:
    store.book(
        model.Allocation(
            request=request,
            grants=(model.NodeGrant(node, slices, request.cpus, request.memory_gib),),
            start=request.submit + 1,
            funded=True,
            protected_until=request.submit + 1 + 3600,
            charge_rate=request.charge_rate(
                model.PoolKind.CPU if request.pool == "cpu" else model.PoolKind.GPU
            ),
        )
    )


def seed(store: Store, now: float, *, usage: bool = True) -> None:
    nodes = node_list()
    store.save_pools([GPU, CPU])
    store.save_teams([
        model.Team("nlp", {"gpu": 0.75, "cpu": 0.5}),
        model.Team("vision", {"gpu": 0.25, "cpu": 0.5}),
    ])  # fmt: skip
    store.save_nodes(nodes)
    gpus = nodes[0].gpus
    if not usage:  # an empty cluster: nothing used, nothing asked for yet
        return
    store.add_usage("nlp", "gpu", now - 7200, now - 3600, 3600.0)
    for i, (user, team) in enumerate((("ann", "nlp"), ("bo", "nlp"), ("cy", "vision"))):
        request = model.Request(
            f"{user}//{i:08x}", user, team, "gpu", now - 600, gpus=1, min_runtime=3600.0,
            profile="gpu-notebook",
        )  # fmt: skip
        book(store, request, "gpu-1", (model.Slice(gpus[i].uuid, model.SliceKind.WHOLE),))
    mig = gpus[3].mig[0]
    debug = model.Request(
        "di//00000010", "di", "vision", "gpu", now - 300, mig="1g.10gb", min_runtime=900.0,
        klass=model.RequestClass.DEBUG, profile="debug",
    )  # fmt: skip
    book(
        store,
        debug,
        "gpu-1",
        (
            model.Slice(
                gpus[3].uuid, model.SliceKind.MIG, mig_uuid=mig.uuid, mig_profile=mig.profile
            ),
        ),
    )
    prep = model.Request(
        "di/prep/00000011", "di", "vision", "cpu", now - 300, cpus=4.0, memory_gib=16.0,
        klass=model.RequestClass.DATAPREP, profile="data-prep",
    )  # fmt: skip
    book(store, prep, "prep-1", ())
    for i in range(2):
        store.add_request(
            model.Request(
                f"eve/w{i}/{i + 20:08x}", "eve", "nlp", "gpu", now - 120 + i, gpus=1,
                min_runtime=3600.0, profile="gpu-notebook",
            )
        )  # fmt: skip


class Service:
    """The service's application on a loopback port, in a thread of its own."""

    def __init__(self, store: Store, **model_args: Any) -> None:
        self.store = store
        self.model = StoreModel(store, **model_args)
        app = service_app.make_app(self.model, cookie_secret=b"x" * 32)
        sockets = bind_sockets(0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}{PREFIX}"
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            server = HTTPServer(app)
            server.add_sockets(sockets)
            self.loop.call_soon(started.set)
            self.loop.run_forever()
            server.stop()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        started.wait(10)

    def get(self, path: str, user: str = "ann", *, admin: bool = False) -> requests.Response:
        return requests.get(self.url + path, headers=self.who(user, admin), timeout=30)

    def patch(self, path: str, body: Any, user: str = "boss") -> requests.Response:
        return requests.patch(
            self.url + "api/v1/" + path, json=body, headers=self.who(user, True), timeout=30
        )

    @staticmethod
    def who(user: str, admin: bool) -> dict[str, str]:
        return {"X-Test-User": user, "X-Test-Admin": "1" if admin else ""}

    def metrics(self) -> dict[str, Any]:
        text = requests.get(self.url + "metrics", timeout=30).text
        return {f.name: f for f in text_string_to_metric_families(text)}

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.model.close()


@pytest.fixture(autouse=True)
def header_login(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user from a header, instead of the Hub's OAuth (not what is tested here)."""

    def user(handler: service_app.Base) -> dict[str, Any] | None:
        name = handler.request.headers.get("X-Test-User")
        if not name:
            return None
        scopes = ["custom:budget:read"]
        if handler.request.headers.get("X-Test-Admin"):
            scopes.append("custom:budget:admin")
        return {"name": name, "groups": GROUPS.get(name, []), "scopes": scopes}

    monkeypatch.setattr(service_app.Base, "get_current_user", user)
    monkeypatch.setattr(service_app.Base, "check_xsrf_cookie", lambda self: None)


def open_service(tmp_path: Path, *, usage: bool = True, **model_args: Any) -> Iterator[Service]:
    store = Store.create(f"sqlite:///{tmp_path / 'store.sqlite'}")
    seed(store, time.time(), usage=usage)
    service = Service(store, **model_args)
    try:
        yield service
    finally:
        service.close()
        store.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from open_service(tmp_path)


PAGES = ("my", "teams", "queue", "nodes", "admin")


def page_text(html: str) -> str:
    """The words of a page, without its markup."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# -- 1. absurd admin values ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("admin/teams/nlp", {"share": {"gpu": 1e-300}}, "share.gpu"),
        ("admin/teams/nlp", {"share": {"gpu": 0.0005}}, "share.gpu"),
        ("admin/settings", {"max_min_runtime": 0}, "max_min_runtime"),
        ("admin/settings", {"max_min_runtime": "30s"}, "max_min_runtime"),
        ("admin/settings", {"max_min_runtime": "8d"}, "max_min_runtime"),
        ("admin/settings", {"lookback": "30m"}, "lookback"),
    ],
)
def test_an_absurd_admin_value_is_a_400_naming_the_field(
    service: Service, path: str, body: dict[str, Any], field: str
) -> None:
    response = service.patch(path, body)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field
    admin = service.get("api/v1/admin", "boss", admin=True).json()
    assert [t["share"]["gpu"] for t in admin["teams"]] == [0.75, 0.25]
    assert admin["settings"]["max_min_runtime"] == 8 * 3600


def test_the_smallest_share_accepted_breaks_no_page(service: Service) -> None:
    assert service.patch("admin/teams/nlp", {"share": {"gpu": 0.001}}).status_code == 200
    for page in PAGES:
        html = service.get(page, "ann", admin=True).text
        text = page_text(html)
        assert not re.search(r"\d[\d,]{12,}", text), (page, re.findall(r"\d[\d,]{12,}", text))
        if page != "admin":  # the Admin page shows a share exactly as it was set: 0.001
            assert not re.search(r"\d\.\d{3,}", text), (page, re.findall(r"\d\.\d{3,}", text))
    teams = service.get("teams", "ann").text
    chart = re.search(
        r'data-pool="gpu".*?<svg[^>]*class="budget-chart ratio-bars.*?</svg>', teams, re.S
    )
    assert chart is not None and "nlp (0.1%)" in chart.group(0)  # not dropped from the chart


def test_a_share_an_old_store_kept_prints_at_sensible_precision(service: Service) -> None:
    # A share of 1e-300 accepted before the bound (the store keeps admin changes).
    service.model.admin.change(
        "boss",
        time.time(),
        {"teams": [
            {"name": "nlp", "parent": None, "share": {"gpu": 1e-300, "cpu": 0.5}},
            {"name": "vision", "parent": None, "share": {"gpu": 0.25, "cpu": 0.5}},
        ]},
        [("teams.nlp.share.gpu", 0.5, 1e-300)],
    )  # fmt: skip
    html = service.get("teams", "ann").text
    assert not re.search(r"\d[\d,]{12,}", page_text(html))
    assert len(html) < 40_000
    assert "nlp (&lt;0.1%)" in html or "nlp (<0.1%)" in html


# -- 2. stale data ------------------------------------------------------------------------


def test_a_cancelled_request_is_gone_on_the_next_read(service: Service) -> None:
    before = service.get("api/v1/me", "eve").json()
    assert [q["position"] for q in before["queued"]] == [1, 2]
    service.get("my", "eve")
    service.store.set_request_state("eve/w0/00000014", RequestState.CANCELLED)
    me = service.get("api/v1/me", "eve").json()
    assert [(q["server"], q["position"], q["waiting"]) for q in me["queued"]] == [("w1", 1, 1)]
    page = service.get("my", "eve").text
    assert "w0" not in page and "w1" in page


def test_the_admin_get_right_after_a_patch_has_the_new_share(service: Service) -> None:
    assert service.get("api/v1/admin", "boss", admin=True).status_code == 200
    for share in (0.3, 0.4, 0.2, 0.75):
        assert service.patch("admin/teams/nlp", {"share": {"gpu": share}}).status_code == 200
        admin = service.get("api/v1/admin", "boss", admin=True).json()
        assert {t["name"]: t["share"]["gpu"] for t in admin["teams"]}["nlp"] == share
        teams = service.get("api/v1/teams", "ann").json()
        nlp = next(t for t in teams["teams"] if t["name"] == "nlp")
        assert {p["pool"]: p["share"] for p in nlp["pools"]}["gpu"] == share


def test_a_preemption_is_counted_on_the_next_scrape(service: Service) -> None:
    assert "budgethub_preemptions" in service.metrics()
    service.store.append_event(
        time.time(), "preempt", {"request": "bo//00000001", "reason": "funded request"}
    )
    samples = service.metrics()["budgethub_preemptions"].samples
    assert {s.labels["reason"]: s.value for s in samples if s.name.endswith("_total")} == {
        "funded-victim": 1.0
    }


SLOW_BUILD = 3.0
"""Seconds a rebuild of the service's state takes in the slow-rebuild test."""


def test_a_slow_rebuild_serves_the_page_saying_how_old_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = storeview.build_state

    def slow(*args: Any) -> Any:
        time.sleep(SLOW_BUILD)
        return build(*args)

    for service in open_service(tmp_path, wait=0.3):
        assert "stale" not in service.get("my", "eve").text
        monkeypatch.setattr(storeview, "build_state", slow)
        service.store.set_request_state("eve/w0/00000014", RequestState.CANCELLED)
        # Reads within CHECK_EVERY of the last one share its look at the store: past it,
        # this read sees the change (else, on a fast write, it raced the first read).
        time.sleep(2 * storeview.CHECK_EVERY)
        t0 = time.monotonic()
        page = service.get("my", "eve").text
        # Well under the build's time, not a race with it on a machine slowed by other work.
        assert time.monotonic() - t0 < SLOW_BUILD / 2
        assert 'id="stale"' in page and '<meta http-equiv="refresh"' in page
        time.sleep(SLOW_BUILD)  # the build done: the next read is current, no notice
        page = service.get("my", "eve").text
        assert 'id="stale"' not in page and "w0" not in page


# -- 3. numbers and words -----------------------------------------------------------------


def test_gpu_amounts_durations_and_plurals_read_well(service: Service) -> None:
    nodes = page_text(service.get("nodes").text)
    assert "3.14 of 4 GPU used, 0.86 free" in nodes
    my = page_text(service.get("my", "eve").text)
    assert "request(s)" not in my and "2 requests of the team wait in this pool" in my
    assert "protected for 1 h" in my  # the form's words for an hour (human_duration)
    queue = page_text(service.get("queue", "eve").text)
    assert "(s)" not in queue
    assert f"funded, protected for {human_duration(3600)}" in queue
    assert "60 min" not in my + queue
    for page in PAGES:
        text = page_text(service.get(page, "boss", admin=True).text)
        assert not re.search(r"\d\.\d{3,}", text), (page, re.findall(r"\d\.\d{3,}", text))
        assert "(s)" not in text, page


def test_why_a_request_waits_is_said_one_way(service: Service) -> None:
    me = service.get("api/v1/me", "eve").json()
    queue = service.get("api/v1/queue", "eve").json()
    whys = {q["why"] for q in me["queued"]}
    assert whys == {r["why"] for p in queue["pools"] for r in p["requests"]}
    second = next(q for q in me["queued"] if q["position"] == 2)
    # Its verdict's codes in the one map's words: where it went (no room, no one to stop),
    # then its funding (within the share); its place is the position column's.
    assert second["why"] == verdict_words(verdict.NO_VICTIMS, verdict.SHARE)
    assert second["why"] == (
        "waiting: no free capacity fits it and no preemptible sessions make room; "
        "funded: within the team's share"
    )


def test_my_budget_has_a_legend_and_an_empty_chart_says_so(tmp_path: Path) -> None:
    for service in open_service(tmp_path):
        html = service.get("my", "ann").text
        assert 'class="legend"' in html and "delivered (GPU·h per day)" in html
        assert "owed: the share" in page_text(html)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for service in open_service(fresh, usage=False):
        html = service.get("my", "cy").text
        assert html.count("no usage yet") == 2  # both pools
        assert "e-0" not in html and "1.1e" not in html


# -- 4. capacity figures that explain each other ------------------------------------------


def test_cpu_nodes_have_cpu_and_memory_figures(service: Service) -> None:
    families = service.metrics()
    cpus = {
        (s.labels["node"], s.labels["state"]): s.value
        for s in families["budgethub_node_cpus"].samples
    }
    assert cpus[("prep-1", "used")] == 4 and cpus[("prep-1", "free")] == 12
    memory = {
        (s.labels["node"], s.labels["state"]): s.value
        for s in families["budgethub_node_memory_bytes"].samples
    }
    assert memory[("prep-1", "used")] == 16 * 2**30 and memory[("prep-1", "free")] == 48 * 2**30
    # gpu-1: three whole GPUs and a MIG instance, 1 CPU and 4 GiB each
    assert cpus[("gpu-1", "used")] == 4 and memory[("gpu-1", "used")] == 16 * 2**30
    nodes = {n["name"]: n for n in service.get("api/v1/nodes").json()["nodes"]}
    assert nodes["prep-1"]["cpus_used"] == 4 and nodes["prep-1"]["memory_free_gib"] == 48
    text = page_text(service.get("nodes").text)
    assert "CPUs: 4 of 16 used, 12 free" in text
    assert "memory: 16 of 64 GiB used, 48 GiB free" in text


def test_usage_metrics_carry_a_true_unit(service: Service) -> None:
    families = service.metrics()
    gpu = {s.labels["pool"] for s in families["budgethub_team_usage_gpu_seconds"].samples}
    cpu = {s.labels["pool"] for s in families["budgethub_team_usage_cpu_seconds"].samples}
    assert gpu == {"gpu"} and cpu == {"cpu"}


# -- the same, through a real Hub and the service it starts ---------------------------------


def test_through_the_hub_a_patch_shows_on_the_next_get_and_absurd_values_are_refused(
    engine: Any, tmp_path: Path
) -> None:
    from harness.hub import new_hub_name, remove_containers, start_hub
    from harness.nodes import local_gpu_node

    hub = start_hub(
        tmp_path,
        hub_name=new_hub_name(__name__ + "::real"),
        nodes=[local_gpu_node(gpus=2)],
        teams=[
            {"name": "nlp", "share": {"gpu": 0.5, "cpu": 0.5}},
            {"name": "vision", "share": {"gpu": 0.5, "cpu": 0.5}},
        ],
        groups={"nlp": ["uxann"], "budget-admins": ["boss"]},
    )
    try:
        hub.http.post(f"{hub.api}/users/boss", timeout=10)
        made = hub.http.post(f"{hub.api}/users/boss/tokens", json={"note": "t"}, timeout=10)
        headers = {"Authorization": f"token {made.json()['token']}"}
        api = f"{hub.url}{PREFIX}api/v1/"

        def get_admin() -> requests.Response:
            return requests.get(api + "admin", headers=headers, timeout=20)

        deadline = time.monotonic() + 60
        while get_admin().status_code != 200:
            assert time.monotonic() < deadline, "the service never answered"
            time.sleep(0.5)
        for body, field in (
            ({"share": {"gpu": 1e-300}}, "share.gpu"),
            ({"max_min_runtime": 0}, "max_min_runtime"),
        ):
            path = "admin/teams/nlp" if "share" in body else "admin/settings"
            refused = requests.patch(api + path, json=body, headers=headers, timeout=20)
            assert refused.status_code == 400 and refused.json()["field"] == field
        for share in (0.3, 0.2):
            changed = requests.patch(
                api + "admin/teams/nlp", json={"share": {"gpu": share}}, headers=headers, timeout=20
            )
            assert changed.status_code == 200, changed.text
            teams = {t["name"]: t["share"] for t in get_admin().json()["teams"]}
            assert teams["nlp"]["gpu"] == share
    finally:
        hub.stop()
        remove_containers(hub.hub_name)
