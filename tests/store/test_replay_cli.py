"""`budgethub replay` as an operator runs it, on real stores: the report (table, JSON, plot),
what-if runs, admin changes read from the audit log, and every bad input as one line that
names its flag (issue 51)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

from scheduler_core.model import Health
from scheduler_core.research.cli import main
from scheduler_core.research.generator import SeedLikeOptions, seed_like
from scheduler_core.research.replay import History, forecast_accuracy, plan
from scheduler_core.research.replay_store import open_store, read_history
from scheduler_core.research.replay_write import simulate_recorded, write_run
from scheduler_core.scenario import Scenario, parse_scenario
from scheduler_core.store import Store
from scheduler_core.store.engine import make_engine, migrate
from scheduler_core.store.store import NODE_INVENTORY

BASE = 1_790_000_000.0
POSTGRES_URL = os.environ.get(
    "BUDGETHUB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def day() -> Scenario:
    """A generated day on 32 GPUs: debug, notebooks and a batch backlog, four teams."""
    return parse_scenario(seed_like(SeedLikeOptions(seed=3, gpus=32, days=1, users=12, teams=4)))


@pytest.fixture(scope="module")
def history_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Scenario]:
    """A SQLite store holding the day as if a Hub had run it from BASE."""
    scenario = day()
    path = tmp_path_factory.mktemp("replay") / "store.sqlite"
    store = Store.create(f"sqlite:///{path}")
    try:
        write_run(store, simulate_recorded(scenario), BASE)
    finally:
        store.close()
    return path, scenario


def history_of(path: Path, since: float, until: float) -> History:
    """The store's history of the period, read as the command reads it."""
    source = open_store(str(path))
    try:
        return read_history(source, since, until, 0.0)
    finally:
        source.close()


def period(scenario: Scenario) -> list[str]:
    return ["--since", str(BASE), "--until", str(BASE + scenario.horizon)]


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the command; it must fail with status 2 and exactly one line on stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("budgethub replay: ")
    return err[0]


def test_the_report_table_json_and_plot(
    history_file: tuple[Path, Scenario], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, scenario = history_file
    out, png = tmp_path / "report.json", tmp_path / "waits.png"
    argv = ["replay", str(path), *period(scenario), "--json", str(out), "--plot", str(png)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    for words in ("start order", "wait error", "same node", "preemptions", "outcomes"):
        assert words in table
    report = json.loads(out.read_text())
    assert set(report) >= {
        "generated",
        "store",
        "schema",
        "period",
        "policy",
        "settings",
        "history",
        "comparison",
        "requests",
        "forecast",
        "outcomes",
    }
    assert report["history"]["submitted_in_period"] == len(scenario.requests)
    comparison = report["comparison"]
    assert comparison["order_agreement"] == 1.0
    assert comparison["wait_abs_error_s"]["p90"] == 0.0
    assert comparison["preemptions"]["same_set"]
    assert [row["label"] for row in report["outcomes"]] == ["live", "replay"]
    live, replay = (row["headline"] for row in report["outcomes"])
    assert live["debug_p90_s"] == replay["debug_p90_s"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    steps = ["read", "plan", "simulate", "outcomes", "compare", "what_ifs"]
    assert list(report["timings_s"]) == steps and report["timings_s"]["simulate"] > 0
    assert any(line.startswith("took read ") for line in table.splitlines())


def test_what_if_runs_a_sweep_and_another_policy(
    history_file: tuple[Path, Scenario], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, scenario = history_file
    out = tmp_path / "whatif.json"
    argv = ["replay", str(path), *period(scenario), "--set", "min_runtime=0s,4h"]
    argv += ["--set", "max_min_runtime=6h", "--json", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "min_runtime=4h max_min_runtime=6h" in table
    rows = json.loads(out.read_text())["outcomes"]
    assert [r["label"] for r in rows[2:]] == [
        "min_runtime=0s max_min_runtime=6h",
        "min_runtime=4h max_min_runtime=6h",
    ]
    assert rows[3]["set"] == {"min_runtime": 14400.0, "max_min_runtime": 21600.0}
    assert rows[3]["written"] == {"min_runtime": "4h", "max_min_runtime": "6h"}
    assert rows[3]["admin_applicable"] == ["max_min_runtime"]
    # Every request asks for the tried protection, and the runs differ by it.
    assert rows[2]["headline"]["lost_gpu_h"] != rows[3]["headline"]["lost_gpu_h"]

    legacy = ["replay", str(path), *period(scenario), "--policy", "legacy", "--json", str(out)]
    assert main(legacy) == 0
    rows = json.loads(out.read_text())["outcomes"]
    assert rows[2]["label"] == "policy legacy" and rows[2]["policy"] == "legacy"
    # As in the family: legacy makes debug work wait behind the backlog; budget does not.
    assert rows[2]["headline"]["debug_p90_s"] > rows[1]["headline"]["debug_p90_s"]


def test_bad_flags_are_one_line_naming_the_flag(
    history_file: tuple[Path, Scenario], capsys: pytest.CaptureFixture[str]
) -> None:
    path, scenario = history_file
    store = str(path)
    line = one_line_error(capsys, ["replay", store, *period(scenario), "--set", "min_runtim=4h"])
    assert "--set min_runtim: unknown setting" in line
    line = one_line_error(capsys, ["replay", store, *period(scenario), "--set", "lookback=soon"])
    assert "--set lookback" in line
    line = one_line_error(capsys, ["replay", store, *period(scenario), "--policy", "lottery"])
    assert "--policy: unknown policy 'lottery'" in line
    line = one_line_error(capsys, ["replay", store, "--since", "yesterday-ish"])
    assert "--since: 'yesterday-ish' is not a time" in line
    future = str(time.time() + 86400)
    line = one_line_error(capsys, ["replay", store, "--since", future])
    assert "--since:" in line and "is in the future" in line
    line = one_line_error(
        capsys, ["replay", store, "--since", "2020-01-01", "--until", "2020-01-02"]
    )
    assert "--since: no request was submitted, running or waiting" in line
    assert "its requests were submitted from" in line
    line = one_line_error(capsys, ["replay", store, "--since", str(BASE), "--until", str(BASE)])
    assert "--since:" in line and "is not before --until" in line
    line = one_line_error(capsys, ["replay", str(path.parent / "nothing.sqlite")])
    assert "STORE_URL: no SQLite store at" in line


def test_an_older_sqlite_store_is_upgraded_in_a_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "old.sqlite"
    engine = make_engine(f"sqlite:///{path}")
    migrate(engine, "0002")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO requests (id, user_name, team, pool, submit, gpus, nodes, "
                "gpu_milli, cpus, memory_gib, labels, min_runtime, resumable, priority, "
                "klass, state, spec) VALUES ('r1', 'ann', 't', 'g', :t, 1, 1, 0, 1, 4, '{}', "
                "0, 0, 0, 'debug', 'pending', '{}')"
            ),
            {"t": BASE + 10},
        )
    engine.dispose()
    source = open_store(str(path))
    try:
        assert source.revision != "0002" and source.copy is not None
        assert "schema 0002, read from a copy upgraded to" in source.shown
        history = read_history(source, BASE, BASE + 3600, 0.0)
        assert [r.request.id for r in history.requests] == ["r1"]
    finally:
        source.close()
    with sqlite3.connect(path) as original:
        assert original.execute("SELECT version_num FROM alembic_version").fetchone() == ("0002",)


@pytest.fixture
def pg_url() -> Iterator[str]:
    schema = f"replay_cli_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.mark.postgres
def test_an_older_postgresql_store_is_refused_with_its_revision(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = make_engine(pg_url)
    migrate(engine, "0002")
    engine.dispose()
    line = one_line_error(capsys, ["replay", pg_url, "--since", "7d"])
    assert "STORE_URL: the store's schema is at revision 0002, older than 0003" in line


def test_admin_changes_come_from_the_audit_log_at_their_times(tmp_path: Path) -> None:
    """No hub-start event: the settings and shares at --since are the newest ones with
    every later audit entry undone; the entries inside the period are changes then."""
    scenario = day()
    path = tmp_path / "store.sqlite"
    store = Store.create(f"sqlite:///{path}")
    try:
        write_run(store, simulate_recorded(scenario), BASE)
        team = scenario.teams[0].name
        pool = "h100"
        now_share = scenario.teams[0].share[pool]
        with store.engine.begin() as connection:
            connection.execute(text("DELETE FROM events WHERE kind = 'hub-start'"))
            connection.execute(
                text("UPDATE scheduler_status SET settings = :s"),
                {"s": json.dumps({"name": "budget", "lookback": 3 * 86400.0})},
            )
            for at, target, old, new in (
                (BASE + 3600, "lookback", 7 * 86400.0, 3 * 86400.0),
                (BASE + 7200, f"teams.{team}.share.{pool}", 0.05, now_share),
            ):
                connection.execute(
                    text(
                        "INSERT INTO audit_log (time, actor, target, old, new) "
                        "VALUES (:t, 'admin', :target, :old, :new)"
                    ),
                    {"t": at, "target": target, "old": json.dumps(old), "new": json.dumps(new)},
                )
    finally:
        store.close()
    history = history_of(path, BASE, BASE + scenario.horizon)
    assert history.settings.lookback == 7 * 86400.0
    assert {t.name: t.share.get(pool) for t in history.teams}[team] == 0.05
    changes = [(c.at - BASE, dict(c.settings), dict(c.shares)) for c in history.admin]
    assert changes == [
        (3600.0, {"lookback": 3 * 86400.0}, {}),
        (7200.0, {}, {(team, pool): now_share}),
    ]
    assert any("hub-start events" in line for line in history.missing)


def test_the_forecast_kept_at_submit_is_measured_against_what_happened(tmp_path: Path) -> None:
    scenario = day()
    path = tmp_path / "store.sqlite"
    recorded = simulate_recorded(scenario)
    store = Store.create(f"sqlite:///{path}")
    try:
        write_run(store, recorded, BASE)
        started = [r for r in recorded.run.records.values() if r.starts][:2]
        said = [
            (started[0], -60.0, started[0].funded[0]),
            (started[1], 30.0, not started[1].funded[0]),
        ]
        with store.engine.begin() as connection:
            for record, delta, funded in said:
                connection.execute(
                    text(
                        "UPDATE requests SET forecast_time = :t, forecast_start = :s, "
                        "forecast_starts_now = 0, forecast_funded = :f WHERE id = :id"
                    ),
                    {
                        "t": BASE + record.submit,
                        "s": BASE + record.starts[0] + delta,
                        "f": funded,
                        "id": record.id,
                    },
                )
    finally:
        store.close()
    history = history_of(path, BASE, BASE + scenario.horizon)
    accuracy = forecast_accuracy(plan(history))
    assert accuracy is not None
    # Actual start less the forecast: +60 s for the first, -30 s for the second.
    assert accuracy["start_error_s"] == {"n": 2, "p50": -30.0, "p90": 60.0}
    assert accuracy["start_abs_error_s"] == {"n": 2, "p50": 30.0, "p90": 60.0}
    assert (accuracy["funding_n"], accuracy["funding_agreement"]) == (2, 0.5)


@pytest.mark.postgres
def test_the_command_replays_a_postgresql_store(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = day()
    store = Store.create(pg_url)
    try:
        write_run(store, simulate_recorded(scenario), BASE)
    finally:
        store.close()
    out = tmp_path / "report.json"
    assert main(["replay", pg_url, *period(scenario), "--json", str(out)]) == 0
    assert "start order       100.0%" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["store"].startswith("postgresql+psycopg://")
    assert report["history"]["submitted_in_period"] == len(scenario.requests)
    assert report["comparison"]["wait_abs_error_s"]["p90"] == 0.0


def test_whether_the_hub_queued_a_preempted_session_again_is_read_from_its_events(
    tmp_path: Path,
) -> None:
    """A ``preempt`` event's ``requeued`` says what the Hub did; a request it ended there
    is one a preemption ends in the replay too. A store from before the flag: a request
    preempted and run again was queued again."""
    scenario = day()
    path = tmp_path / "store.sqlite"
    store = Store.create(f"sqlite:///{path}")
    try:
        write_run(store, simulate_recorded(scenario), BASE)
    finally:
        store.close()
    until = BASE + scenario.horizon
    preempted = {
        r.request.id: r for r in history_of(path, BASE, until).requests if r.requeued is not None
    }
    assert preempted and all(r.requeued for r in preempted.values())
    ended = next(iter(preempted))
    flag = "UPDATE events SET payload = json_set(payload, '$.requeued', json('false')) "
    with sqlite3.connect(path) as connection:
        connection.execute(
            flag + "WHERE kind = 'preempt' AND json_extract(payload, '$.request') = ?", (ended,)
        )
    history = history_of(path, BASE, until)
    said = {r.request.id: r.requeued for r in history.requests if r.requeued is not None}
    assert said == {rid: rid != ended for rid in preempted}
    assert ended in plan(history).ends_on_preempt
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE events SET payload = json_remove(payload, '$.requeued')")
    before_the_flag = history_of(path, BASE, until)
    assert any("without 'requeued'" in line for line in before_the_flag.missing)
    older = {r.request.id: r for r in before_the_flag.requests}
    for rid in preempted:
        runs = older[rid].runs
        assert older[rid].requeued is True, (rid, runs)


def test_a_node_s_inventory_over_time_comes_from_its_events(tmp_path: Path) -> None:
    """The store's node rows hold only the newest inventory; each Hub start that finds a
    node new or changed records it (``node-inventory``), so a period before a change
    is replayed on the node as it was then, and a change inside it at its time."""
    scenario = day()
    path = tmp_path / "store.sqlite"
    store = Store.create(f"sqlite:///{path}")
    try:
        write_run(store, simulate_recorded(scenario), BASE)
        node = scenario.nodes[0]
        store.save_nodes([node], at=BASE + 100.0)  # unchanged: no event
        smaller = replace(node, gpus=node.gpus[:-1])
        store.save_nodes([smaller], at=BASE + 7200.0)
        added = replace(node, name="late-1", gpus=())
        store.save_nodes([added], at=BASE + 3600.0)
        kinds = [(e.time - BASE, e.payload["node"]) for e in store.list_events(kind=NODE_INVENTORY)]
    finally:
        store.close()
    assert (0.0, node.name) in kinds and (100.0, node.name) not in kinds
    assert (7200.0, node.name) in kinds and (3600.0, "late-1") in kinds
    before = history_of(path, BASE, BASE + 3000.0)
    [as_then] = [n for n in before.nodes if n.name == node.name]
    assert len(as_then.gpus) == len(node.gpus), "the inventory at the start, not the row's"
    assert not before.inventory
    assert "late-1" not in {n.name for n in before.nodes}, "it came after the period"
    [late] = [n for n in history_of(path, BASE, BASE + 4000.0).nodes if n.name == "late-1"]
    assert late.health is Health.DOWN, "a node that came later is not there at the start"
    whole = history_of(path, BASE, BASE + scenario.horizon)
    changes = [(c.at - BASE, c.node.name, len(c.node.gpus), c.added) for c in whole.inventory]
    assert changes == [(3600.0, "late-1", 0, True), (7200.0, node.name, len(node.gpus) - 1, False)]
    assert not any("MIG layout over time" in line for line in whole.missing)


def test_a_request_read_back_keeps_what_a_preemption_of_it_costs(tmp_path: Path) -> None:
    """A Hub started again recovers its waiting and running requests from the store
    (`Store.pending_requests`, `active_allocations`): their checkpoint interval and
    restart cost come back with them, so the live policy prices their preemption as the
    replay does."""
    scenario = day()
    asked = replace(
        scenario.requests[0], submit=BASE, resumable=True, checkpoint_every=600.0, restart_cost=45.0
    )
    with Store.create(f"sqlite:///{tmp_path / 'store.sqlite'}") as store:
        store.save_pools(scenario.pools)
        store.save_teams(scenario.teams)
        store.save_nodes(list(scenario.nodes))
        store.add_request(asked)
        [waiting] = store.pending_requests()
        again = store.load_request(asked.id)
    assert (waiting.checkpoint_every, waiting.restart_cost) == (600.0, 45.0)
    assert again == asked
