"""Admin changes: checked like the configuration, kept in the store with an audit log,
merged over the configuration (the store wins), and swapped into a running core."""

from __future__ import annotations

import pytest

from bench.service import nodes as bench_nodes
from harness import builders
from scheduler_core.model import Request, Team
from scheduler_core.settings import Settings
from scheduler_core.simulator import VirtualClock
from scheduler_core.store import Store
from scheduler_core.store.admin import AdminStore, SchedulerStatus
from spawner import admin

POOLS = builders.pools()
TEAMS = [
    Team("nlp", {"gpu": 0.5, "cpu": 0.5}),
    Team("vision", {"gpu": 0.3, "cpu": 0.5}),
    Team("vision-sub", {"gpu": 0.5}, "vision"),
]


def test_a_share_within_the_pool_changes_and_is_checked_like_the_config() -> None:
    teams = admin.change_team(TEAMS, POOLS, "nlp", share={"gpu": 0.7})
    assert {t.name: t.share["gpu"] for t in teams}["nlp"] == 0.7


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"share": {"gpu": 0.8}}, "share.gpu", "sum to 1.1, over 1"),
        ({"share": {"gpu": -0.1}}, "share.gpu", "between 0 and 1"),
        ({"share": {"gpu": "lots"}}, "share.gpu", "must be a number"),
        ({"share": {"tpu": 0.1}}, "share.tpu", "unknown pool 'tpu'"),
        ({"share": 0.3}, "share", "pool → fraction"),
        ({"parent": "nobody"}, "parent", "unknown team 'nobody'"),
        ({"parent": "vision-sub"}, "parent", "its own ancestor"),
        ({}, "share", "give a share or a parent"),
    ],
)
def test_a_bad_change_names_the_field_and_why(change: dict, field: str, words: str) -> None:
    name = "vision" if "parent" in change else "nlp"
    with pytest.raises(admin.AdminError) as caught:
        admin.change_team(TEAMS, POOLS, name, **change)
    assert caught.value.field == field
    assert words in caught.value.reason


def test_the_hierarchy_changes_and_a_move_that_does_not_fit_names_the_parent() -> None:
    teams = admin.change_team(TEAMS, POOLS, "vision-sub", parent="nlp")
    assert {t.name: t.parent for t in teams}["vision-sub"] == "nlp"
    with pytest.raises(admin.AdminError) as caught:  # top level: 0.5 + 0.3 + 0.5 > 1
        admin.change_team(TEAMS, POOLS, "vision-sub", parent=None)
    assert caught.value.field == "parent" and "over 1" in caught.value.reason


def test_an_unknown_team_is_named() -> None:
    with pytest.raises(admin.AdminError) as caught:
        admin.change_team(TEAMS, POOLS, "robotics", share={"gpu": 0.1})
    assert caught.value.field == "team" and "unknown team 'robotics'" in caught.value.reason


@pytest.mark.parametrize(
    ("key", "value", "seconds", "words"),
    [
        ("lookback", "14d", 14 * 86400, None),
        ("lookback", 7200, 7200, None),
        ("max_min_runtime", "2h", 7200, None),
        ("lookback", -5, None, "lookback"),
        ("lookback", "soon", None, "lookback"),
        ("lookback", 1e12, None, "between"),
        ("lookback", True, None, "seconds or a duration"),
        ("cycle_tick", 5, None, "unknown setting"),
    ],
)
def test_settings_are_durations_within_limits(key, value, seconds, words) -> None:
    if seconds is not None:
        assert admin.check_setting(key, value) == seconds
        return
    with pytest.raises(admin.AdminError) as caught:
        admin.check_setting(key, value)
    assert words in str(caught.value)


def test_a_node_is_drained_or_returned_by_name() -> None:
    assert admin.check_node_state(["gpu-1"], "gpu-1", "draining") == "draining"
    with pytest.raises(admin.AdminError, match="node: unknown node 'gpu-9'"):
        admin.check_node_state(["gpu-1"], "gpu-9", "draining")
    with pytest.raises(admin.AdminError, match="state: must be one of ready, draining"):
        admin.check_node_state(["gpu-1"], "gpu-1", "down")


def test_the_store_wins_over_the_configuration_and_stale_changes_are_ignored() -> None:
    overrides = {
        "teams": admin.team_specs(admin.change_team(TEAMS, POOLS, "nlp", share={"gpu": 0.6})),
        "lookback": 86400.0,
        "max_min_runtime": "bogus",
        "drained": ["gpu-1", "gone-node"],
    }
    merged = admin.effective(TEAMS, Settings(), POOLS, ["gpu-1", "gpu-2"], overrides)
    assert {t.name: t.share["gpu"] for t in merged.teams}["nlp"] == 0.6
    assert merged.settings.lookback == 86400.0
    assert merged.settings.max_min_runtime == Settings().max_min_runtime
    assert merged.drained == {"gpu-1"}
    assert any("max_min_runtime" in reason for reason in merged.ignored)
    # A change that no longer fits (the configuration's shares grew meanwhile) is ignored.
    grown = [Team("nlp", {"gpu": 0.5}), Team("vision", {"gpu": 0.5}), TEAMS[2]]
    stale = {"teams": [{"name": "nlp", "parent": None, "share": {"gpu": 0.9}}]}
    merged = admin.effective(grown, Settings(), POOLS, [], stale)
    assert {t.name: t.share["gpu"] for t in merged.teams}["nlp"] == 0.5
    assert merged.ignored and "over 1" in merged.ignored[0]


def test_changes_and_their_audit_are_kept_in_the_store(empty_store: Store) -> None:
    records = AdminStore(empty_store)
    assert records.version() == 0 and records.overrides() == {}
    first = records.change("boss", 10.0, {"lookback": 3600.0}, [("lookback", 604800.0, 3600.0)])
    second = records.change(
        "boss",
        20.0,
        {"drained": ["gpu-1"]},
        [("nodes.gpu-1.state", "ready", "draining")],
    )
    assert second > first == records.version() - 1
    assert records.overrides() == {"lookback": 3600.0, "drained": ["gpu-1"]}
    newest = records.audit()[0]
    assert (newest.actor, newest.target, newest.old, newest.new) == (
        "boss",
        "nodes.gpu-1.state",
        "ready",
        "draining",
    )
    with pytest.raises(ValueError, match="not admin settings: cycle_tick"):
        records.change("boss", 30.0, {"cycle_tick": 1}, [])
    status = SchedulerStatus("hub", 5.0, 3, 0.01, ((0.001, 1), (0.01, 3)), {"lookback": 1.0}, 2)
    records.report(status)
    records.report(status)
    assert records.statuses() == [status]


def test_a_running_core_takes_new_shares_and_settings_in_its_next_cycle() -> None:
    clock = VirtualClock()
    node_list = bench_nodes(gpu_nodes=2, gpus=2, cpu_nodes=0)[1:]  # no MIG
    teams = [Team("nlp", {"gpu": 0.0}), Team("vision", {"gpu": 1.0})]
    core = builders.scheduler(pools=POOLS.values(), nodes=node_list, teams=teams, clock=clock)
    # nlp has no share: its session runs unallocated.
    core.submit(Request("a/1/x", "a", "nlp", "gpu", 0.0, gpus=1, min_runtime=3600))
    core.settle()
    assert not core.running["a/1/x"].funded
    core.reconfigure(
        teams=[Team("nlp", {"gpu": 1.0}), Team("vision", {"gpu": 0.0})],
        settings=Settings(max_min_runtime=600.0),
    )
    # The next cycle funds nlp's next request, protected for the new cap.
    core.submit(Request("a/2/x", "a", "nlp", "gpu", 0.0, gpus=1, min_runtime=3600))
    assert core.settle() is not None
    admitted = core.running["a/2/x"]
    assert admitted.funded and admitted.protected_until - admitted.start == 600.0
    # Requests waiting when the cap drops are capped again.
    core.submit(Request("b/3/x", "b", "vision", "gpu", 0.0, gpus=1, min_runtime=3600))
    core.reconfigure(settings=Settings(max_min_runtime=300.0))
    assert core.pending["b/3/x"].min_runtime == 300.0
