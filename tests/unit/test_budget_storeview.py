"""The budget service's read model over a real store: the figures match the store, the
positions match the spawn page's QueueView, views hide other users, /metrics parses,
and every answer holds to the OpenAPI document."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.service import seed
from harness import builders
from scheduler_core import model
from scheduler_core.store import Store
from scheduler_core.store.admin import AdminStore, SchedulerStatus
from spawner.readmodel.service import openapi, views
from spawner.readmodel.service.metrics import registry
from spawner.readmodel.status import QueueView
from spawner.readmodel.storeview import DAY, StoreModel, build_state, preemption_reason

NOW = time.time()  # QueueView asks the wall clock, as live


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    with Store.create("sqlite://") as store:
        seed(store, users=30, team_count=5, requests=200, days=3, now=NOW, rng=random.Random(7))
        yield store


@pytest.fixture(scope="module")
def state(store: Store) -> Any:
    return build_state(store, StoreModel(store).admin, NOW)


def viewer(name: str, *groups: str, admin: bool = False) -> views.Viewer:
    scopes = {views.READ} | ({views.ADMIN} if admin else set())
    return views.Viewer(name, frozenset(groups), frozenset(scopes))


def test_usage_over_the_window_is_what_the_store_charged(store: Store, state: Any) -> None:
    window = state.settings.lookback
    running = store.active_allocations()
    assert len(running) == 127 and len(state.queue) == 73
    for (team, pool), tp in state.teams.items():
        charged = store.usage_between(team, pool, NOW - window, NOW)
        live = sum(
            a.charge_rate * (NOW - max(a.start, NOW - window))
            for a in running
            if a.funded and a.team == team and a.pool == pool
        )
        assert tp.used_units == pytest.approx(charged + live, rel=1e-9, abs=1e-6)
        assert tp.status.funded == pytest.approx(
            sum(a.charge_rate for a in running if a.funded and (a.team, a.pool) == (team, pool))
        )
        capacity = 127.0 + 1.0 if pool == "gpu" else 4 * 64.0  # 16 × 8 GPUs; one is MIG
        assert tp.status.share == pytest.approx(tp.share * capacity)
        assert tp.budget_units == pytest.approx(tp.status.share * window)


def _node() -> model.Node:
    """One node n1 of four GPUs in pool gpu."""
    return builders.node("n1", pool="gpu", gpus=4, cpus=16.0, memory_gib=64.0)


def _store(node: model.Node) -> Store:
    """A store on in-memory SQLite with pool gpu, teams a and b at half each and ``node``."""
    gpu = builders.pools()["gpu"]
    return builders.store(pools=[gpu], teams=builders.teams("a", "b"), nodes=[node])


def test_owed_per_day_is_the_share_or_what_was_asked_if_less() -> None:
    """As the simulator's daily fulfilment: hour by hour, owed is the share (2 GPUs here)
    or what the team had waiting or running if that is less; delivered is what it ran,
    at most what it was owed. A team that asked for nothing was owed nothing."""
    node = _node()
    yesterday = (NOW // DAY) * DAY - DAY
    with _store(node) as store:
        # a asks for 3 GPUs at 10:00, waits an hour, runs 2 h funded.
        ask = model.Request("a1", "ann", "a", "gpu", yesterday + 10 * 3600, gpus=3)
        slices = tuple(model.Slice(g.uuid, model.SliceKind.WHOLE) for g in node.gpus[:3])
        begin = yesterday + 11 * 3600
        store.book(
            model.Allocation(
                ask, (model.NodeGrant("n1", slices, 1.0, 4.0),), begin, True, begin, 3.0
            )
        )
        store.release("a1", begin + 2 * 3600)
        # and 1 GPU at 20:00, still waiting: owed from then on, 1 GPU an hour.
        store.add_request(model.Request("a2", "ann", "a", "gpu", yesterday + 20 * 3600, gpus=1))
        state = build_state(store, StoreModel(store).admin, NOW)
        days = {day: (owed, delivered) for day, owed, delivered in state.teams[("a", "gpu")].daily}
        owed, delivered = days[yesterday]
        # 10-11 h: min(2, 3) waiting; 11-13 h: min(2, 3) running; a2 still waits (pending).
        waiting_a2 = min(2.0, 1.0) * (min(NOW, yesterday + DAY) - (yesterday + 20 * 3600))
        assert owed == pytest.approx(2 * 3600 + 2 * 2 * 3600 + waiting_a2)
        assert delivered == pytest.approx(min(3 * 2 * 3600, owed))
        assert days[yesterday - DAY] == (0.0, 0.0)
        assert all(o == 0.0 and d == 0.0 for _, o, d in state.teams[("b", "gpu")].daily)


def test_rank_is_the_schedulers_order_with_the_last_day_in_it() -> None:
    """a ran 80 GPU-h three days ago, b 40 GPU-h in the last day (shares 2 GPUs each):
    by the window a's ratio is the higher (0.24 against 0.12), but with the last day
    weighed in (0.7 x 0.24 against 0.7 x 0.12 + 0.3 x 0.83) a goes first, as the
    scheduler takes them; the ratio shown stays the window's, which decides funding."""
    node = _node()
    with _store(node) as store:
        slices = tuple(model.Slice(g.uuid, model.SliceKind.WHOLE) for g in node.gpus)
        for rid, team, start, hours in (
            ("a1", "a", NOW - 3 * DAY, 20),
            ("b1", "b", NOW - 11 * 3600, 10),
        ):
            ask = model.Request(rid, f"u-{team}", team, "gpu", start, gpus=4)
            grant = model.NodeGrant("n1", slices, 1.0, 4.0)
            store.book(model.Allocation(ask, (grant,), start, True, start, 4.0))
            store.release(rid, start + hours * 3600)
        state = build_state(store, StoreModel(store).admin, NOW)
    a, b = state.teams[("a", "gpu")], state.teams[("b", "gpu")]
    assert a.ratio == pytest.approx(80 / 336) and b.ratio == pytest.approx(40 / 336)
    assert (a.rank, b.rank) == (1, 2)


def test_positions_are_those_of_the_spawn_pages_queue_view(state: Any) -> None:
    view = QueueView(state.core, clock=lambda: state.now)  # the same moment
    for waiting in state.queue:
        exact = view.queue_status(waiting.request.id)
        assert exact is not None
        got = waiting.status
        assert (got.position, got.waiting, got.team_position, got.team_waiting) == (
            exact.position,
            exact.waiting,
            exact.team_position,
            exact.team_waiting,
        )
        assert got.funded == exact.funded
        estimate = state.estimate(waiting.request.id)
        if exact.estimated_start is None:
            assert estimate is None
        else:
            assert estimate == pytest.approx(exact.estimated_start, abs=2)
    ratios = sorted(state.teams[(t, "gpu")].ratio for t in state.team_names)
    ranks = sorted(state.teams[(t, "gpu")].rank for t in state.team_names)
    assert ranks == list(range(1, len(state.team_names) + 1)) and ratios == sorted(ratios)


def all_answers(state: Any, who: views.Viewer) -> dict[str, Any]:
    return {
        "me": views.me(state, who),
        "teams": views.teams(state, who),
        "queue": views.queue(state, who, limit=5000),
        "nodes": views.nodes(state, who),
    }


def test_a_user_sees_other_teams_totals_but_no_other_users(state: Any) -> None:
    me = viewer("user-000", "team-00")
    answers = all_answers(state, me)
    text = json.dumps(answers)
    others = {a.request.user for a in state.running} | {w.request.user for w in state.queue}
    others.discard("user-000")
    assert others and not any(f'"{name}' in text or f"{name}/" in text for name in others)
    assert {t["name"] for t in answers["teams"]["teams"]} == set(state.team_names)
    assert all(t["sessions"] is None for t in answers["teams"]["teams"])
    mine = [w for w in state.queue if w.request.user == "user-000"]
    assert len(answers["me"]["queued"]) == len(mine)
    shown = [r for p in answers["queue"]["pools"] for r in p["requests"]]
    assert len(shown) == len(state.queue)
    assert {r["user"] for r in shown} == {None, "user-000"} or {r["user"] for r in shown} == {None}
    # An admin sees who waits.
    boss = all_answers(state, viewer("boss", admin=True))
    assert {r["user"] for p in boss["queue"]["pools"] for r in p["requests"]} >= {"user-001"}


def nullable_to_json_schema(schema: Any) -> Any:
    """OpenAPI 3.0's ``nullable`` as JSON Schema's type lists, refs resolved."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            return nullable_to_json_schema(openapi.SCHEMAS[name])
        out = {k: nullable_to_json_schema(v) for k, v in schema.items() if k != "nullable"}
        if schema.get("nullable"):
            if "type" in out:
                out["type"] = [out["type"], "null"]
        return out
    if isinstance(schema, list):
        return [nullable_to_json_schema(s) for s in schema]
    return schema


@pytest.mark.parametrize("name", ["me", "teams", "queue", "nodes"])
def test_answers_hold_to_the_openapi_document(state: Any, name: str) -> None:
    schema = nullable_to_json_schema(openapi.SCHEMAS[name.capitalize()])
    for who in (viewer("user-000", "team-00"), viewer("boss", admin=True)):
        jsonschema.validate(all_answers(state, who)[name], schema)
    jsonschema.validate(views.admin(state), nullable_to_json_schema(openapi.SCHEMAS["Admin"]))


def test_metrics_parse_and_carry_the_figures(store: Store) -> None:
    model = StoreModel(store)
    text = generate_latest(registry(model)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    state = model.state()
    pending = {
        (s.labels["pool"], s.labels["team"], s.labels["class"]): s.value
        for s in families["budgethub_pending_sessions"].samples
    }
    assert sum(pending.values()) == len(state.queue) == 73
    shares = {
        s.labels["team"]: s.value
        for s in families["budgethub_team_share"].samples
        if s.labels["pool"] == "gpu"
    }
    assert shares == {t: state.teams[(t, "gpu")].share for t in state.team_names}
    usage = families["budgethub_team_usage_gpu_seconds"].samples
    assert all(s.value >= 0 for s in usage)
    slices = {
        (s.labels["node"], s.labels["state"]): s.value for s in families["budgethub_slices"].samples
    }
    assert slices[("gpu-00", "free")] + slices[("gpu-00", "used")] == 7 + 7  # 7 MIG + 7 whole
    assert sum(v for (_, st), v in slices.items() if st == "used") == 127
    preempted = families["budgethub_preemptions"].samples
    assert sum(s.value for s in preempted if s.name.endswith("_total")) == 40
    waits = [
        s
        for s in families["budgethub_admission_wait_time_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert sum(s.value for s in waits) == 127
    assert "budgethub_team_occupancy_ratio" in families
    assert "budgethub_cycle_duration_seconds" in families


def test_the_model_is_kept_until_the_store_changes(store: Store) -> None:
    model = StoreModel(store, ttl=3600)
    first = model.state()
    assert model.state() is first
    store.append_event(time.time(), "note", {})
    time.sleep(0.6)  # past the check interval
    assert model.state(fresh=True) is not first


def test_the_grafana_dashboard_charts_only_served_metrics(store: Store) -> None:
    import re

    path = builders.REPO / "docs" / "grafana" / "budgethub.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"budgethub_[a-z_]+", e)}
    AdminStore(store).report(SchedulerStatus("hub", time.time(), 4, 0.002, ((0.001, 3),), {}, 0))
    text = generate_latest(registry(StoreModel(store))).decode()
    served = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    served |= {f.name for f in text_string_to_metric_families(text)}
    assert used and used <= served, used - served


def test_every_preemption_reason_of_the_policy_gets_its_own_label() -> None:
    labels = {
        reason: preemption_reason({"reason": reason})
        for reason in ("funded", "debug", "time-slice", "drain", "node-down")
    }
    assert labels == {
        "funded": "funded-victim",
        "debug": "debug-victim",
        "time-slice": "time-slice",
        "drain": "drain",
        "node-down": "node-down",
    }
