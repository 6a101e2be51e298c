"""Issue 50: a team with no share of a pool, running unallocated work, reads the same on
every page and in the API; and the small points of its item 7.

nlp has the whole GPU pool and runs a funded notebook on one GPU; vision has no share of
it and runs an unallocated quarter GPU (cy's default server). The budget service's My
budget, Teams and Nodes pages, its JSON API and /metrics, the Hub's banner line and My
sessions rows are read from one store; the pure helpers (the JSON body, a typed number)
are checked beside them.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from scheduler_core import model
from scheduler_core.store import Store
from spawner import admin
from spawner.readmodel.service import app as service_app
from spawner.readmodel.service import views
from spawner.readmodel.service.metrics import registry
from spawner.readmodel.storeview import StoreModel, build_state

NOW = time.time()
MIG = ["1g.10gb"] * 7


def _book(store: Store, request: model.Request, slices: tuple[model.Slice, ...], **kw: Any):
    store.add_request(request)
    store.book(
        model.Allocation(
            request=request,
            grants=(model.NodeGrant("gpu-1", slices, request.cpus, request.memory_gib),),
            start=kw.get("start", NOW - 600),
            funded=kw["funded"],
            protected_until=kw.get("until", NOW + 3600),
            charge_rate=kw.get("rate", 1.0),
        )
    )


@pytest.fixture
def store() -> Iterator[Store]:
    yield from zero_share_store()


def zero_share_store() -> Iterator[Store]:
    """The store of the module's docstring (a generator: a fixture's body)."""
    with Store.create("sqlite://") as store:
        gpus = model.virtual_gpus("gpu-1", 3, mig={2: MIG})
        store.save_pools(
            [model.Pool("gpu", model.PoolKind.GPU), model.Pool("cpu", model.PoolKind.CPU)]
        )
        store.save_teams(
            [model.Team("nlp", {"gpu": 1.0, "cpu": 0.5}), model.Team("vision", {"cpu": 0.5})]
        )
        # 6 CPUs: after the two sessions (2 CPUs each) there is CPU room for 2 debug
        # sessions of 1 CPU, while all 7 MIG instances are free.
        store.save_nodes(
            [model.Node("gpu-1", "gpu", 6.0, 64.0, gpus), model.Node("prep-1", "cpu", 4.0, 16.0)]
        )
        ann = model.Request("ann//00000001", "ann", "nlp", "gpu", NOW - 700, gpus=1, cpus=2.0)
        _book(store, ann, (model.Slice(gpus[0].uuid, model.SliceKind.WHOLE),), funded=True)
        cy = model.Request(
            "cy//00000002", "cy", "vision", "gpu", NOW - 700, gpu_milli=250, cpus=2.0
        )
        _book(
            store,
            cy,
            (model.Slice(gpus[1].uuid, model.SliceKind.FRACTION, 250),),
            funded=False,
            until=NOW - 500,  # its grace: over, and never a protection
            rate=0.0,
        )
        yield store


def _state(store: Store) -> Any:
    return build_state(store, StoreModel(store).admin, NOW)


def _viewer(name: str, groups: tuple[str, ...]) -> views.Viewer:
    return views.Viewer(name, frozenset(groups), frozenset({views.READ}))


CY = _viewer("cy", ("vision",))


def _pool(entry: dict[str, Any], pool: str = "gpu") -> dict[str, Any]:
    return next(p for p in entry["pools"] if p["pool"] == pool)


def test_a_team_with_no_share_ranks_among_every_team_of_the_pool(store: Store) -> None:
    state = _state(store)
    me = views.me(state, CY)
    vision = _pool(me["teams"][0])
    assert vision["share"] == 0 and vision["holds_unallocated"] == 0.25
    assert vision["teams_in_pool"] == 2 and 1 <= vision["rank"] <= 2  # never "3 of 2"
    for team in views.teams(state, CY)["teams"]:
        for p in team["pools"]:
            assert p["rank"] <= p["teams_in_pool"], (team["name"], p)
    [session] = me["sessions"]
    assert session["funded"] is False and session["protected_until"] is None


def test_the_home_banner_says_no_share_in_the_maps_words_with_a_unit(store: Store) -> None:
    state = _state(store)
    assert state.view is not None
    line = state.view.team_status("vision", "gpu").line()
    assert line == (
        "gpu: the team has no share of this pool, so its work runs unallocated; "
        "it holds 0.25 GPU unallocated"
    )
    nlp = state.view.team_status("nlp", "gpu").line()
    assert nlp.startswith("gpu: holds 1 GPU funded of a ") and "unallocated" not in nlp


def _pages(store: Store, user: str, groups: list[str], paths: tuple[str, ...]) -> dict[str, str]:
    """The budget service's answers to ``user``, logged in by a header (the Hub's login is
    not what is tested here)."""

    def current(handler: service_app.Base) -> dict[str, Any]:
        return {"name": user, "groups": groups, "scopes": [views.READ]}

    async def fetch_all() -> dict[str, str]:
        model_ = StoreModel(store, ttl=3600.0)
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(service_app.make_app(model_, cookie_secret=b"x" * 32))
        server.add_sockets(sockets)
        base = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/services/budget/"
        found = {}
        try:
            for path in paths:
                response = await AsyncHTTPClient().fetch(base + path)
                found[path] = response.body.decode()
        finally:
            server.stop()
            model_.close()
        return found

    original = service_app.Base.get_current_user
    service_app.Base.get_current_user = current  # type: ignore[method-assign]
    try:
        return asyncio.run(fetch_all())
    finally:
        service_app.Base.get_current_user = original  # type: ignore[method-assign]


def _section(html: str, pool: str) -> str:
    """The HTML of one pool's part of a page: from its ``data-pool`` to the next pool's."""
    start = html.index(f'data-pool="{pool}"')
    found = html.find("data-pool=", start + 10)
    return html[start : found if found > 0 else len(html)]


def _text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_my_budget_and_teams_pages_of_a_team_with_no_share(store: Store) -> None:
    pages = _pages(store, "cy", ["vision"], ("my", "teams", "nodes"))
    my = pages["my"]
    gpu = _section(my[: my.index('id="my-sessions"')], "gpu")
    text = _text(gpu)
    assert "0.25 GPU unallocated" in text and "0.25 unallocated" not in text.replace(
        "0.25 GPU unallocated", ""
    )
    assert "(rank 2 of 2," in text, text
    assert "no usage yet" not in text  # nothing owed: it says so instead
    assert "nothing is owed: the team has no share of this pool" in text
    assert "(no budget: no share here)" in text
    assert "would run unallocated (preemptible): the team has no share of this pool." in text, text
    sessions = _text(my[my.index('id="my-sessions"') :])
    assert "not protected" in sessions
    teams = pages["teams"]
    gpu_teams = _section(teams, "gpu")
    ratio = re.search(r'<svg[^>]*class="budget-chart ratio-bars.*?</svg>', gpu_teams, re.S)
    assert ratio is not None and "vision" in ratio.group(0) and "nlp" in ratio.group(0)
    lines = re.search(r'<svg[^>]*class="budget-chart usage-lines.*?</svg>', gpu_teams, re.S)
    assert lines is not None, gpu_teams
    assert "vision (no share)" in lines.group(0) and ">nlp<" in lines.group(0)


def test_the_nodes_page_names_my_session_and_says_a_cpu_nodes_cpus_once(store: Store) -> None:
    nodes = _pages(store, "cy", ["vision"], ("nodes",))["nodes"]
    text = _text(nodes)
    assert "your default server" in text and "cy//" not in nodes
    assert "another session" in text  # ann's, not named to cy
    prep = _text(nodes[nodes.index('data-node="prep-1"') :])
    assert prep.count("of 4") == 1 and "CPUs: 0 of 4 used, 4 free" in prep, prep
    admin_view = views.Viewer("boss", frozenset(), frozenset({views.ADMIN}))
    assert views.session_label("ann/train/00000009", admin_view) == "ann's server train"
    assert views.session_label("ann//00000001", CY) == "another session"


def test_an_empty_queue_has_a_pending_sample_of_zero(store: Store) -> None:
    text = generate_latest(registry(StoreModel(store))).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = families["budgethub_pending_sessions"].samples
    assert samples and all(s.value == 0 for s in samples)
    assert {"gpu", "cpu"} <= {s.labels["pool"] for s in samples}


def test_the_forms_mig_count_is_free_instances_not_cpu_room(store: Store) -> None:
    state = _state(store)
    assert state.view is not None
    debug = model.Request(
        "dan//x", "dan", "nlp", "gpu", NOW, mig="1g.10gb", cpus=1.0, memory_gib=2.0
    )
    assert state.view.free_count(debug) == 2  # what the node's CPUs leave room for
    assert state.view.free_count(debug, slices_only=True) == 7  # the free MIG instances


def test_a_nan_in_a_json_body_is_refused_naming_where_it_is() -> None:
    with pytest.raises(admin.AdminError) as whole:
        admin.json_body(b"NaN")
    assert whole.value.field == "body" and "NaN" in whole.value.reason
    with pytest.raises(admin.AdminError) as inner:
        admin.json_body(b'{"share": {"gpu": Infinity}}')
    assert inner.value.field == "share.gpu" and "Infinity" in inner.value.reason
    with pytest.raises(admin.AdminError) as listed:
        admin.json_body(b'{"a": [1, -Infinity]}')
    assert listed.value.field == "a.1"
    assert admin.json_body(b'{"share": {"gpu": 0.5}}') == {"share": {"gpu": 0.5}}
    with pytest.raises(ValueError):
        admin.json_body(b"{")


def test_a_typed_number_is_said_back_as_it_was_typed() -> None:
    assert admin.form_number(" -1 ") == -1 and isinstance(admin.form_number("-1"), int)
    assert admin.form_number("0.25") == 0.25
    assert math.isnan(admin.form_number("nan"))
    with pytest.raises(admin.AdminError) as error:
        admin.check_share("share.gpu", admin.form_number("-1"))
    assert error.value.reason.endswith("not -1"), error.value.reason
    with pytest.raises(ValueError):
        admin.form_number("many")
