"""Each request's forecast at submit is kept with it (migration 0004, issue 51): stored
as given, read back by period, untouched by what happens to the request later, and a
store of the previous schema (0003) upgraded in place keeps its requests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, text
from store_helpers import gpu_node, whole
from store_helpers import request as asked_for

from harness import builders
from scheduler_core import model
from scheduler_core.scheduler import WallClock
from scheduler_core.store import RequestForecast, RequestState, Store
from scheduler_core.store.engine import alembic_config, make_engine, migrate
from spawner.hub.embedded import BudgetScheduler
from spawner.readmodel.status import QueueView

SAID = RequestForecast(
    time=100.5,
    start=460.25,
    starts_now=False,
    funded=True,
    protected_s=7200.0,
    position=3,
    waiting=5,
)
FORECAST_COLUMNS = {
    "forecast_time",
    "forecast_start",
    "forecast_starts_now",
    "forecast_funded",
    "forecast_protected_s",
    "forecast_position",
    "forecast_waiting",
}


def test_forecast_is_kept_as_given(store: Store) -> None:
    store.add_request(asked_for("ann/a/1", submit=100.0), SAID)
    no_estimate = replace(SAID, time=200.0, start=None, funded=False, protected_s=0.0)
    store.add_request(asked_for("ann/b/1", submit=200.0), no_estimate)
    now = replace(SAID, time=300.0, start=300.0, starts_now=True, position=1, waiting=1)
    store.add_request(asked_for("ann/c/1", submit=300.0), now)
    store.add_request(asked_for("ann/d/1", submit=400.0))  # none kept (an older Hub)
    assert store.request_forecasts() == {
        "ann/a/1": SAID,
        "ann/b/1": no_estimate,
        "ann/c/1": now,
    }
    # By submit time: [since, until).
    assert list(store.request_forecasts(since=200.0)) == ["ann/b/1", "ann/c/1"]
    assert list(store.request_forecasts(until=300.0)) == ["ann/a/1", "ann/b/1"]
    assert store.request_forecasts(since=301.0) == {}


def test_forecast_outlives_the_request_s_life(store: Store) -> None:
    """Booked, preempted and requeued, booked again, finished: the forecast stays what was
    said at submit (nothing writes it again)."""
    node = gpu_node("n1", gpus=2)
    store.save_nodes([node])
    asked = asked_for("ann/a/1", submit=100.0, gpus=1)
    store.add_request(asked, SAID)
    grant = model.NodeGrant("n1", (whole(node.gpus[0]),), 1.0, 1.0)
    store.book(
        model.Allocation(
            asked, (grant,), start=500.0, funded=True, protected_until=560.0, charge_rate=1.0
        )
    )
    store.release("ann/a/1", 600.0, state=RequestState.REQUEUED)
    store.set_request_priority("ann/a/1", 4)
    store.book(
        model.Allocation(
            asked, (grant,), start=700.0, funded=False, protected_until=700.0, charge_rate=1.0
        )
    )
    store.release("ann/a/1", 800.0)
    assert store.request_forecasts() == {"ann/a/1": SAID}


def test_a_request_booked_without_submit_has_no_forecast(store: Store) -> None:
    node = gpu_node("n1", gpus=1)
    store.save_nodes([node])
    asked = asked_for("ann/a/1", submit=100.0, gpus=1)
    grant = model.NodeGrant("n1", (whole(node.gpus[0]),), 1.0, 1.0)
    store.book(
        model.Allocation(
            asked, (grant,), start=100.0, funded=True, protected_until=160.0, charge_rate=1.0
        )
    )
    assert store.request_forecasts() == {}


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_upgrade_from_0003_keeps_requests_and_adds_empty_forecasts(
    backend: str, sqlite_file_url: str, request: pytest.FixtureRequest
) -> None:
    url = sqlite_file_url if backend == "sqlite" else request.getfixturevalue("pg_url")
    engine = make_engine(url)
    try:
        migrate(engine, "0003")
        with engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("requests")}
        assert not columns & FORECAST_COLUMNS
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO requests (id, user_name, team, pool, submit, gpus, nodes,"
                    " gpu_milli, mig, cpus, memory_gib, labels, min_runtime, resumable,"
                    " priority, klass, profile, state, reason, spec) VALUES ('ann/old/1',"
                    " 'ann', 'olmo', 'h100', 50.0, 1, 1, 0, NULL, 1.0, 1.0, '{}', 60.0,"
                    " TRUE, 0, 'interactive', 'gpu', 'pending', NULL, '{}')"
                )
            )
    finally:
        engine.dispose()
    with Store.create(url) as store:  # upgraded to the newest revision
        with store.engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("requests")}
            version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
        assert FORECAST_COLUMNS <= columns
        assert version is not None and version >= "0004"
        old = store.load_request("ann/old/1")
        assert (old.team, old.submit, old.min_runtime) == ("olmo", 50.0, 60.0)
        assert store.request_forecasts() == {}  # nothing was said of it: nothing is made up
        store.add_request(asked_for("ann/new/1", submit=60.0), SAID)
        assert store.request_forecasts() == {"ann/new/1": SAID}
        with store.engine.begin() as connection:  # and back: 0003's shape, requests kept
            config = alembic_config()
            config.attributes["connection"] = connection
            command.downgrade(config, "0003")
            columns = {c["name"] for c in inspect(connection).get_columns("requests")}
            count = connection.execute(text("SELECT count(*) FROM requests")).scalar()
        assert not columns & FORECAST_COLUMNS
        assert count == 2


def test_the_hub_keeps_what_the_spawn_page_says(tmp_path: Path) -> None:
    """`BudgetScheduler.submit` stores the read model's outlook of the request (the
    policy run dry, and forward for the estimate) as it is submitted: on a one-GPU node,
    the first request starts now, funded; the second, behind it, is forecast to start
    when the first one's protection ends (no past sessions to go by)."""
    teams = [model.Team("a", {"gpu": 0.5}), model.Team("b", {"gpu": 0.5})]
    node = builders.node("n1", pool="gpu", gpus=1)
    core = builders.scheduler(
        pools=builders.pools().values(), nodes=[node], teams=teams, clock=WallClock()
    )
    with builders.store(
        builders.sqlite_file_url(tmp_path), pools=builders.pools().values(), teams=teams
    ) as store:
        hub = BudgetScheduler()
        hub.started, hub.store, hub.core = True, store, core
        hub.view = QueueView(core, store)
        hub.kick = lambda: None  # type: ignore[method-assign]  # no cycle runs between
        shown = {}

        async def submit_two() -> None:
            for rid, team in (("ann/x/1", "a"), ("bo/y/1", "b")):
                asked = model.Request(
                    rid, rid.split("/")[0], team, "gpu", time.time(), gpus=1, min_runtime=600.0
                )
                shown[rid] = hub.view.outlook(asked)  # the spawn page, just before
                hub.submit(asked, {})

        asyncio.run(submit_two())
        kept = store.request_forecasts()
    assert list(kept) == ["ann/x/1", "bo/y/1"]
    for rid, said in kept.items():
        page = shown[rid]
        assert (said.funded, said.starts_now, said.protected_s, said.position) == (
            page.funded,
            page.starts_now,
            page.protected_s,
            page.position,
        )
        assert said.start == page.estimated_start
    first, second = kept["ann/x/1"], kept["bo/y/1"]
    assert first.starts_now and first.funded and first.start == pytest.approx(first.time, abs=1)
    assert first.protected_s == pytest.approx(600.0)
    # The first is admitted by that cycle, so none waits ahead of the second: place 1 of 2.
    assert not second.starts_now and (second.position, second.waiting) == (1, 2)
    assert second.start is not None
    assert second.start - second.time == pytest.approx(600.0, abs=5 + core.settings.cycle_tick)
