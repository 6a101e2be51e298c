"""Issue 52: every page says why a request waits from its verdict's codes, through one map
(`scheduler_core.verdict.MESSAGES`). Change the words of a code there and every page
changes: the Hub's admin queue and home page (`pages.figures`), the spawn-pending page's
queue message, My sessions (page rows and JSON), and the budget service's Queue page, My
budget page and JSON API (through `storeview` and `status`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from scheduler_core import model, registry, verdict
from scheduler_core.store import Store
from spawner.hub import mysessions, pages
from spawner.hub.spawner import BudgetSpawner
from spawner.readmodel.service import app as service_app
from spawner.readmodel.status import QueueStatus
from spawner.readmodel.storeview import State, StoreModel, build_state

SENTINEL = "SENTINEL-the-one-map-said-this"
NOW = time.time()
WAITING = "cy//00000001"


@pytest.fixture
def store() -> Iterator[Store]:
    """One GPU, held by nlp's protected notebook; vision (no share of the pool) asks for
    one: unfunded (`no-share`) and, as unfunded work that may stop no one, `no-room`."""
    with Store.create("sqlite://") as store:
        node = model.Node("gpu-1", "gpu", 8.0, 32.0, model.virtual_gpus("gpu-1", 1))
        store.save_pools([model.Pool("gpu", model.PoolKind.GPU)])
        store.save_teams([model.Team("nlp", {"gpu": 1.0}), model.Team("vision", {})])
        store.save_nodes([node])
        running = model.Request("ann//00000000", "ann", "nlp", "gpu", NOW - 60, gpus=1)
        store.book(
            model.Allocation(
                request=running,
                grants=(
                    model.NodeGrant(
                        "gpu-1", (model.Slice(node.gpus[0].uuid, model.SliceKind.WHOLE),), 1, 4
                    ),
                ),
                start=NOW - 59,
                funded=True,
                protected_until=NOW + 3600,
                charge_rate=1.0,
            )
        )
        store.add_request(model.Request(WAITING, "cy", "vision", "gpu", NOW - 30, gpus=1))
        yield store


class Facade:
    """What the Hub's pages read of `BudgetScheduler`: its core and read model (here the
    store's, which is the same `QueueView` over the same kind of core)."""

    def __init__(self, state: State) -> None:
        assert state.view is not None
        self.view = state.view
        self.core = state.core
        self.core_pools = state.core.pools
        self.notices: dict[tuple[str, str], str] = {}
        self.store = self

    def team_of_groups(self, groups: list[str]) -> list[str]:
        return [g for g in groups if g in self.core.teams.teams]

    def home_snapshot_notice(self, user: str) -> None:
        return None

    def list_snapshots(self, user: str) -> list[Any]:
        return []


class HubUser:
    def __init__(self, name: str) -> None:
        self.name = name
        self.spawners: dict[str, Any] = {}
        self.orm_spawners: dict[str, Any] = {}


def hub_pages(state: State) -> dict[str, str]:
    """What each of the Hub's pages says of cy's waiting request."""
    facade: Any = Facade(state)
    admin = pages.figures(facade, "boss", [], admin=True)
    home = pages.figures(facade, "cy", ["vision"], admin=False)
    status = home.queued[""]
    [row] = mysessions.rows_of(facade, HubUser("cy"))
    return {
        "admin queue": admin.queue[0].status.why,
        "home": status.why,
        "spawn pending": BudgetSpawner._queue_message(cast(BudgetSpawner, None), status),
        "my sessions": row.why,
        "my sessions JSON": json.dumps(row.json()),
    }


@pytest.fixture
def header_login(monkeypatch: pytest.MonkeyPatch) -> None:
    def user(handler: service_app.Base) -> dict[str, Any]:
        name = handler.request.headers["X-Test-User"]
        groups = {"cy": ["vision"]}.get(name, [])
        return {"name": name, "groups": groups, "scopes": ["custom:budget:read"]}

    monkeypatch.setattr(service_app.Base, "get_current_user", user)


def service_pages(store: Store) -> dict[str, str]:
    """The budget service's Queue and My budget pages and its JSON API, as cy reads them."""

    async def fetch_all() -> dict[str, str]:
        model_ = StoreModel(store, ttl=3600.0)
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(service_app.make_app(model_, cookie_secret=b"x" * 32))
        server.add_sockets(sockets)
        base = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/services/budget/"
        client = AsyncHTTPClient()
        found = {}
        try:
            for path in ("queue", "my", "api/v1/queue", "api/v1/me"):
                response = await client.fetch(base + path, headers={"X-Test-User": "cy"})
                found[f"service {path}"] = response.body.decode()
        finally:
            server.stop()
            model_.close()
        return found

    return asyncio.run(fetch_all())


def test_every_page_says_why_from_the_verdicts_codes_through_one_map(
    store: Store, header_login: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = build_state(store, StoreModel(store).admin, NOW)
    status = state.view.queue_status(WAITING) if state.view else None
    assert isinstance(status, QueueStatus)
    assert (status.reason, status.ground) == (verdict.NO_ROOM, verdict.NO_SHARE)
    before = {**hub_pages(state), **service_pages(store)}
    for page, text in before.items():
        assert SENTINEL not in text, page
        assert verdict.MESSAGES[verdict.NO_ROOM] in text, page

    monkeypatch.setitem(verdict.MESSAGES, verdict.NO_ROOM, SENTINEL)
    after = {**hub_pages(state), **service_pages(store)}
    for page, text in after.items():
        assert SENTINEL in text, page
        assert text != before[page], page


def test_why_unfunded_comes_from_the_same_map(
    store: Store, header_login: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The funding code's words too: the spawn-pending message, the My budget page's
    "a session started now would run unallocated", the API's ``why_unallocated``."""
    monkeypatch.setitem(verdict.MESSAGES, verdict.NO_SHARE, SENTINEL)
    state = build_state(store, StoreModel(store).admin, NOW)
    said = {**hub_pages(state), **service_pages(store)}
    for page in ("spawn pending", "admin queue", "my sessions", "service my", "service api/v1/me"):
        assert SENTINEL in said[page], page
    me = json.loads(said["service api/v1/me"])
    assert me["teams"][0]["pools"][0]["why_unallocated"].startswith(SENTINEL)


def test_a_request_no_cycle_weighed_says_so_through_the_same_map(
    store: Store, header_login: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle that gives cy's request no verdict (here a policy that gives none, the
    `legacy` baseline, in the budget policy's place): the read model sets
    `verdict.NOT_WEIGHED` as why it is not funded, and every page says so in that code's
    words from the map, as for any other code."""
    monkeypatch.setitem(registry.POLICIES, "budget", registry.POLICIES["legacy"])
    state = build_state(store, StoreModel(store).admin, NOW)
    status = state.view.queue_status(WAITING) if state.view else None
    assert isinstance(status, QueueStatus)
    assert (status.funded, status.ground, status.reason) == (False, verdict.NOT_WEIGHED, "")
    before = {**hub_pages(state), **service_pages(store)}
    for page, text in before.items():
        assert SENTINEL not in text, page
        assert verdict.MESSAGES[verdict.NOT_WEIGHED] in text, page

    monkeypatch.setitem(verdict.MESSAGES, verdict.NOT_WEIGHED, SENTINEL)
    after = {**hub_pages(state), **service_pages(store)}
    for page, text in after.items():
        assert SENTINEL in text, page
        assert text != before[page], page
