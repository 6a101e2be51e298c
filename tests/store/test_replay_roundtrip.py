"""Issue 51's round trip: a scenario run in the simulator, written into a real store as if it
had run live, then replayed with `budgethub replay`'s library, gives identical outcomes.

Also: the store as read back is the run that was written (the live side of the report),
the replay never writes (SQLite opened read-only beside a writer, PostgreSQL in read-only
transactions), and a period that starts mid-run takes the running sessions and the queue
at its start.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sqlite3
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, make_url, text

from harness.builders import ONE_TEAM, gpu_request, gpu_scenario, scenarios
from scheduler_core.metrics import result
from scheduler_core.model import RequestClass
from scheduler_core.research.replay import compare, metrics_run, plan, simulate
from scheduler_core.research.replay_store import open_store, read_history
from scheduler_core.research.replay_write import simulate_recorded, write_run
from scheduler_core.scenario import Scenario
from scheduler_core.store import Store

POSTGRES_URL = os.environ.get(
    "BUDGETHUB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
BASE = 1_790_000_000.0
"""The epoch second the written history starts at."""


@st.composite
def priced_scenarios(draw: st.DrawFn) -> Scenario:
    """`harness.builders.scenarios`, with batch jobs that checkpoint or cost a restart
    and notebooks that go idle before they end: all of it must survive the store."""
    scenario = draw(scenarios())
    requests = []
    idle_after: dict[str, float] = {}
    for request in scenario.requests:
        if request.klass is RequestClass.BATCH and draw(st.booleans()):
            request = dataclasses.replace(
                request,
                resumable=True,
                checkpoint_every=float(draw(st.sampled_from([600, 1800]))),
                restart_cost=float(draw(st.sampled_from([0, 120]))),
            )
        elif request.klass is RequestClass.INTERACTIVE and draw(st.booleans()):
            idle_after[request.id] = float(draw(st.integers(0, 3000)))
        requests.append(request)
    return dataclasses.replace(scenario, requests=tuple(requests), idle_after=idle_after)


def written(scenario: Scenario, url: str) -> Any:
    """Simulate ``scenario`` and write it into a fresh store at ``url``."""
    recorded = simulate_recorded(scenario)
    store = Store.create(url)
    try:
        write_run(store, recorded, BASE)
    finally:
        store.close()
    return recorded.run


def replayed(url: str, since: float, until: float) -> tuple[Any, Any]:
    source = open_store(url)
    try:
        history = read_history(source, since, until, 0.0)
    finally:
        source.close()
    the_plan = plan(history)
    return the_plan, simulate(the_plan)


def assert_round_trip(scenario: Scenario, url: str) -> None:
    original = result(written(scenario, url))
    the_plan, again = replayed(url, BASE, BASE + scenario.horizon)
    replay = result(again)
    live = result(metrics_run(the_plan.live))
    assert replay["requests"] == original["requests"]
    assert replay["metrics"] == original["metrics"]
    # What the store says happened is the run (it keeps no count of the cycles).
    assert live["requests"] == original["requests"]
    assert live["metrics"] | {"cycles": 0} == original["metrics"] | {"cycles": 0}
    comparison = compare(the_plan, again)["comparison"]
    assert comparison["wait_abs_error_s"]["p90"] in (None, 0.0)
    assert comparison["order_agreement"] in (None, 1.0)
    assert comparison["preemptions"]["same_set"]
    assert not comparison["causes"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(priced_scenarios())
def test_round_trip_gives_identical_outcomes(scenario: Scenario) -> None:
    with tempfile.TemporaryDirectory() as folder:
        assert_round_trip(scenario, f"sqlite:///{folder}/store.sqlite")


@pytest.mark.postgres
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(priced_scenarios())
def test_round_trip_on_postgresql(pg_schema: Any, scenario: Scenario) -> None:
    url = pg_schema()
    assert_round_trip(scenario, url)
    source = open_store(url)
    try:
        with source.engine.begin() as connection:
            assert connection.execute(text("SHOW transaction_read_only")).scalar() == "on"
    finally:
        source.close()


@pytest.fixture
def pg_schema(request: pytest.FixtureRequest) -> Any:
    """A maker of fresh PostgreSQL schemas (one per hypothesis example), all dropped after."""
    admin = create_engine(POSTGRES_URL)
    made: list[str] = []

    def make() -> str:
        schema = f"replay_test_{uuid.uuid4().hex[:12]}"
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        made.append(schema)
        url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
        return url.render_as_string(hide_password=False)

    yield make
    with admin.begin() as connection:
        for schema in made:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    admin.dispose()


def month_like(seed: int = 3) -> Scenario:
    from scheduler_core.research.generator import SeedLikeOptions, seed_like
    from scheduler_core.scenario import parse_scenario

    options = SeedLikeOptions(seed=seed, gpus=32, days=1, users=12, teams=4)
    return parse_scenario(seed_like(options))


def test_a_notebook_idle_from_its_start_and_moved_in_one_cycle_keeps_its_idle_time(
    tmp_path: Path,
) -> None:
    """A notebook idle from its first second is stopped by a drain and started again on
    the other node in the same cycle: its second run's idle report, at the instant the
    first run ended, is the second run's (read as the first's, the replay had it go idle
    41 s into each run, and woke a cycle the run never had)."""
    notebook = gpu_request("nb", "a", 61, 1, "interactive", min_runtime=0, duration=600)
    scenario = gpu_scenario(
        [notebook | {"idle_after": 0}],
        gpus=1,
        teams=ONE_TEAM,
        events=[{"at": 102, "node": "n-0", "state": "draining"}],
        parse=True,
    )
    recorded = simulate_recorded(scenario)
    assert recorded.run.records["nb"].starts == [61.0, 102.0], "moved in the drain's cycle"
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    written(scenario, url)
    source = open_store(url)
    try:
        history = read_history(source, BASE, BASE + scenario.horizon, 0.0)
    finally:
        source.close()
    [live] = history.requests
    assert live.idle_after == 0.0
    assert_round_trip(scenario, f"sqlite:///{tmp_path / 'again.sqlite'}")


def test_a_period_from_mid_run_starts_from_the_running_sessions_and_queue(
    tmp_path: Path,
) -> None:
    scenario = month_like()
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    written(scenario, url)
    middle = BASE + scenario.horizon / 2
    the_plan, again = replayed(url, middle, BASE + scenario.horizon)
    assert the_plan.adopted, "sessions running at --since are taken in"
    assert all(a.allocation.start < 0 for a in the_plan.adopted)
    assert all(r.submit >= 0 for r in the_plan.scenario.requests)
    comparison = compare(the_plan, again)["comparison"]
    # The state at the start is the live one: the simulator goes on as the run did.
    assert comparison["order_agreement"] is not None and comparison["order_agreement"] >= 0.95
    assert comparison["wait_abs_error_s"]["p50"] == 0.0
    for team in comparison["teams"].values():
        if team["live_gpu_h"] > 1:
            assert abs(team["error"]) <= 0.05


def test_the_replay_reads_beside_a_writer_and_never_writes(tmp_path: Path) -> None:
    scenario = month_like()
    path = tmp_path / "store.sqlite"
    written(scenario, f"sqlite:///{path}")
    hub = sqlite3.connect(path, isolation_level=None)  # a Hub holding the write lock
    try:
        hub.execute("BEGIN IMMEDIATE")
        hub.execute("INSERT INTO events (time, kind, payload) VALUES (1, 'x', '{}')")
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        the_plan, _ = replayed(str(path), BASE, BASE + scenario.horizon)
        assert len(the_plan.scenario.requests) == len(scenario.requests)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before
        hub.execute("ROLLBACK")
    finally:
        hub.close()
    source = open_store(str(path))
    try:
        with source.engine.connect() as connection, pytest.raises(Exception, match="readonly"):
            connection.exec_driver_sql("DELETE FROM events")
    finally:
        source.close()
    assert os.path.getsize(path) > 0


def test_a_session_running_at_the_start_keeps_the_devices_it_was_granted(
    tmp_path: Path,
) -> None:
    """The store deletes an ended allocation's slices; the Hub's ``granted`` event names
    its devices, so a session running at --since is adopted on the GPUs it really had
    (not on the first free ones, which may differ)."""
    scenario = month_like()
    recorded = simulate_recorded(scenario)
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    store = Store.create(url)
    try:
        write_run(store, recorded, BASE)
    finally:
        store.close()
    held = {(a.id, BASE + a.start): a.grants for a in recorded.allocations}
    middle = BASE + scenario.horizon / 2
    source = open_store(url)
    try:
        history = read_history(source, middle, BASE + scenario.horizon, 0.0)
    finally:
        source.close()
    under_way = [
        (live.request.id, run)
        for live in history.requests
        for run in live.runs
        if live.request.gpu_weight and run.start < middle and (run.end is None or run.end > middle)
    ]
    ended_since = [(rid, run) for rid, run in under_way if run.end is not None]
    assert ended_since, "sessions running at the start whose allocation has ended since"
    for rid, run in ended_since:
        assert run.grants == held[(rid, run.start)], rid
    the_plan = plan(history)
    adopted = {a.allocation.id: a.allocation.grants for a in the_plan.adopted}
    assert all(adopted[rid] == run.grants for rid, run in ended_since)
    assert not any("cannot hold" in why for why in the_plan.unseen.values())
