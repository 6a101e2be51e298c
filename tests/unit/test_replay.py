"""`budgethub replay`'s pure parts (issue 51): the start-order agreement, a request's work
from its live runs, the state at the period's start, admin changes at their times, and
the command's flags (checked before any store is opened)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_core.model import (
    Node,
    NodeGrant,
    Pool,
    PoolKind,
    Request,
    Team,
    virtual_gpus,
)
from scheduler_core.research.cli import main
from scheduler_core.research.commands.replay import parse_when
from scheduler_core.research.replay import (
    FINISHED,
    PREEMPTED,
    RUNNING,
    AdminChange,
    History,
    InventoryChange,
    LiveRequest,
    LiveRun,
    compare,
    order_agreement,
    plan,
    simulate,
    work_of,
)
from scheduler_core.scheduler import Scheduler
from scheduler_core.settings import Settings
from scheduler_core.view import Decisions

T0 = 1_800_000_000.0
POOL = Pool("g", PoolKind.GPU)


def node(gpus: int = 1) -> Node:
    return Node("n0", "g", 16.0, 64.0, virtual_gpus("n0", gpus))


def request(rid: str, team: str, submit: float, **fields: object) -> Request:
    return Request(id=rid, user="u", team=team, pool="g", submit=T0 + submit, gpus=1, **fields)  # type: ignore[arg-type]


def run(start: float, end: float | None, ended: str, funded: bool = True) -> LiveRun:
    grant = NodeGrant("n0", (), 1.0, 4.0)
    protected = T0 + start + 3600  # funded and protected for an hour, as live
    return LiveRun(
        T0 + start, None if end is None else T0 + end, (grant,), funded, protected, 1.0, ended
    )


def history(requests: list[LiveRequest], **fields: object) -> History:
    values: dict[str, object] = {
        "since": T0,
        "until": T0 + 20_000,
        "settings": Settings(default_min_runtime=0.0),
        "pools": (POOL,),
        "nodes": (node(),),
        "teams": (Team("a", {"g": 0.5}), Team("b", {"g": 0.5})),
        "requests": tuple(requests),
    }
    values.update(fields)
    return History(**values)  # type: ignore[arg-type]


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=25))
def test_order_agreement_counts_pairs_as_a_direct_count_does(
    pairs: list[tuple[int, int]],
) -> None:
    agree = disagree = ties = 0
    for (a1, b1), (a2, b2) in itertools.combinations(pairs, 2):
        if a1 == a2 or b1 == b2:
            ties += 1
        elif (a1 < a2) == (b1 < b2):
            agree += 1
        else:
            disagree += 1
    share, counted, tied = order_agreement([(float(a), float(b)) for a, b in pairs])
    assert (counted, tied) == (agree + disagree, ties)
    assert share == (agree / counted if counted else None)


def test_work_is_what_the_runs_did_kept_across_a_preemption() -> None:
    notebook = request("r", "a", 0, resumable=True, memory_gib=4.0)
    live = LiveRequest(notebook, (run(0, 1000, PREEMPTED), run(2000, 3500, FINISHED)))
    work, complete = work_of(live, T0 + 20_000)
    # All of the first run is kept (a snapshot); the second starts with its restore.
    assert complete
    assert work == pytest.approx(1000 + 1500 - notebook.restart_seconds)
    fresh = LiveRequest(request("s", "a", 0), (run(0, 1000, PREEMPTED), run(2000, None, RUNNING)))
    assert work_of(fresh, T0 + 5000) == (3000.0, False)


def test_the_running_session_and_the_queue_at_the_start_are_taken_in() -> None:
    running = LiveRequest(request("old", "a", -500), (run(-400, 100, FINISHED),))
    waiting = LiveRequest(request("next", "b", -300), (run(100, 600, FINISHED),))
    later = LiveRequest(request("new", "a", 50), (run(600, 900, FINISHED),))
    the_plan = plan(history([running, waiting, later]))
    assert [a.allocation.id for a in the_plan.adopted] == ["old"]
    assert the_plan.adopted[0].allocation.grants[0].slices, "placed on its node's free GPU"
    assert [q.request.id for q in the_plan.queued] == ["next"]
    assert [r.id for r in the_plan.scenario.requests] == ["new"]
    simulated = simulate(the_plan)
    assert simulated.records["old"].ends == [100.0]
    assert simulated.records["next"].starts == [100.0]
    assert simulated.records["new"].starts == [600.0]
    comparison = compare(the_plan, simulated)["comparison"]
    assert comparison["wait_abs_error_s"]["p90"] == 0.0
    assert not comparison["causes"]


def test_a_session_running_at_the_start_that_no_longer_fits_is_unseen() -> None:
    """Two sessions ran at --since on node n0, which now has one GPU: the first is
    placed on it, the second cannot be and is left out, saying why."""
    first = LiveRequest(request("one", "a", -900), (run(-800, 300, FINISHED),))
    second = LiveRequest(request("two", "b", -700), (run(-600, 400, FINISHED),))
    the_plan = plan(history([first, second]))
    assert [a.allocation.id for a in the_plan.adopted] == ["one"]
    assert "cannot hold" in the_plan.unseen["two"]
    simulated = simulate(the_plan)
    assert simulated.records["one"].ends == [300.0]
    assert "two" not in simulated.records


def test_an_admin_share_change_applies_at_its_time() -> None:
    teams = (Team("a", {"g": 0.0}), Team("b", {"g": 1.0}))
    first = LiveRequest(request("first", "a", 0), (run(0, 500, FINISHED, funded=False),))
    second = LiveRequest(request("second", "a", 2000), (run(2000, 2500, FINISHED),))
    change = AdminChange(T0 + 1000, shares={("a", "g"): 0.5})
    the_plan = plan(history([first, second], teams=teams, admin=(change,)))
    assert [c.at for c in the_plan.admin] == [1000.0]
    shares: list[tuple[float, float, float]] = []

    def observe(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
        tree = scheduler.teams.teams
        shares.append((now, tree["a"].share["g"], tree["b"].share["g"]))

    simulate(the_plan, observer=observe)
    assert {s[1:] for s in shares if s[0] < 1000} == {(0.0, 1.0)}
    assert {s[1:] for s in shares if s[0] >= 1000} == {(0.5, 1.0)}
    assert any(s[0] >= 1000 for s in shares)


def test_a_what_if_keeps_its_policy_and_settings_through_a_hub_start_in_the_period() -> None:
    """A Hub start inside the period brings the configured settings back (policy budget,
    its lookback); a what-if run pins what it tries, and the rest still changes."""
    work = [
        LiveRequest(request("first", "a", 0), (run(0, 500, FINISHED),)),
        LiveRequest(request("second", "b", 2000), (run(2000, 2500, FINISHED),)),
    ]
    start = AdminChange(
        T0 + 1000,
        settings={"name": "budget", "lookback": 3600.0, "cycle_tick": 10.0},
        source="hub-start",
    )
    the_plan = plan(history(work, admin=(start,)))
    seen: list[tuple[float, str, float, float]] = []

    def observe(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
        settings = scheduler.settings
        seen.append((now, settings.name, settings.lookback, settings.cycle_tick))

    what_if = the_plan.scenario.settings.replace(name="legacy", lookback=7200.0)
    simulate(the_plan, what_if, pinned={"name", "lookback"}, observer=observe)
    assert {s[1:] for s in seen if s[0] < 1000} == {("legacy", 7200.0, 30.0)}
    assert {s[1:] for s in seen if s[0] >= 1000} == {("legacy", 7200.0, 10.0)}
    seen.clear()
    simulate(the_plan, what_if, observer=observe)
    assert {s[1:] for s in seen if s[0] >= 1000} == {("budget", 3600.0, 10.0)}


def test_a_request_that_left_the_queue_is_one_the_simulator_cannot_see() -> None:
    gone = LiveRequest(request("gone", "a", 10), (), cancelled=T0 + 50)
    the_plan = plan(history([gone, LiveRequest(request("x", "b", 0), (run(0, 9, FINISHED),))]))
    assert "gone" in the_plan.unseen and "cannot cancel" in the_plan.unseen["gone"]
    assert compare(the_plan, simulate(the_plan))["comparison"]["causes"] == {"unseen": 1}


def test_times_are_read_as_an_operator_writes_them() -> None:
    now = 1_800_000_000.0
    assert parse_when("now", "--until", now) == now
    assert parse_when("7d", "--since", now) == now - 7 * 86400
    assert parse_when("36h", "--since", now) == now - 36 * 3600
    assert parse_when("1700000000", "--since", now) == 1_700_000_000.0
    assert parse_when("2026-12-01", "--since", now) == 1796083200.0
    assert parse_when("2026-12-01T08:00Z", "--since", now) == 1796083200.0 + 8 * 3600
    assert parse_when("2026-12-01T09:00+01:00", "--since", now) == 1796083200.0 + 8 * 3600


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--policy", "nope"], "budgethub replay: --policy: unknown policy 'nope'"),
        (["--set", "warp=9"], "budgethub replay: --set warp: unknown setting"),
        (["--set", "name=legacy"], "budgethub replay: --set name: choose the policy with --policy"),
        (["--set", "min_runtime=1h", "--set", "min_runtime=2h"], "--set min_runtime: is given"),
        (["--set", "min_runtime=1h,soon"], "budgethub replay: --set min_runtime: 'soon' is not a"),
        (["--until", "tomorrow"], "budgethub replay: --until: 'tomorrow' is not a time"),
    ],
)
def test_flags_are_checked_before_the_store_is_opened(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "/nonexistent/store.sqlite", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]


def test_a_session_the_live_hub_ended_at_a_preemption_is_not_queued_again() -> None:
    """The live Hub ends a preempted session that cannot resume (the store's ``preempt``
    event says ``requeued: false``); the simulator would queue it again and start it once
    the funded job is done. The replay does as the Hub did: the same record, nothing only
    one side did."""
    teams = (Team("a", {"g": 0.0}), Team("b", {"g": 1.0}))
    notebook = LiveRequest(
        request("nb", "a", 0, memory_gib=4.0),
        (run(0, 1000, PREEMPTED, funded=False),),
        requeued=False,
    )
    job = LiveRequest(request("job", "b", 1000), (run(1000, 4000, FINISHED),))
    the_plan = plan(history([notebook, job], teams=teams))
    assert "nb" in the_plan.ends_on_preempt
    simulated = simulate(the_plan)
    record = simulated.records["nb"]
    assert (record.starts, record.ends, record.preemptions) == ([0.0], [1000.0], 1)
    assert not record.finished
    comparison = compare(the_plan, simulated)["comparison"]
    assert not comparison["causes"] and comparison["preemptions"]["same_set"]
    assert all(t["live_gpu_h"] == t["simulated_gpu_h"] for t in comparison["teams"].values())
    # Queued again, as the simulator does by itself, it runs again after the job.
    requeued = replace(notebook, requeued=True)
    again = simulate(plan(history([requeued, job], teams=teams))).records["nb"]
    assert again.starts == [0.0, 4000.0]


def test_the_hub_rule_decides_where_the_store_does_not_say() -> None:
    """Never preempted live: a preemption ends a session that cannot resume (as the live
    Hub's takedown does) and queues one that can."""
    plain = LiveRequest(request("plain", "a", 0), (run(0, 10, FINISHED),))
    resumable = LiveRequest(request("res", "a", 5, resumable=True), (run(10, 20, FINISHED),))
    the_plan = plan(history([plain, resumable]))
    assert the_plan.ends_on_preempt == {"plain"}


def test_a_node_that_gains_a_gpu_at_a_hub_start_gains_it_in_the_replay() -> None:
    """n0 has one GPU at the period's start and two after a Hub start at 1000 s (the
    store's node-inventory event): the second request waits for the first or for the
    new GPU, whichever comes first, as live."""
    first = LiveRequest(request("first", "a", 0, min_runtime=9000.0), (run(0, 5000, FINISHED),))
    second = LiveRequest(request("second", "b", 10), (run(1000, 2000, FINISHED),))
    grown = InventoryChange(T0 + 1000, node(2))
    the_plan = plan(history([first, second], inventory=(grown,)))
    assert [c.at for c in the_plan.inventory] == [1000.0]
    simulated = simulate(the_plan)
    assert simulated.records["second"].starts == [1000.0]
    assert not compare(the_plan, simulated)["comparison"]["causes"]
    # Without the change the second waits for the first to end.
    assert simulate(plan(history([first, second]))).records["second"].starts == [5000.0]


def test_an_inventory_change_that_takes_a_held_gpu_away_is_skipped() -> None:
    """A Hub refuses to start on a node that lost a device a session holds; the replay
    skips such a change too (the simulated run still holds it) and goes on."""
    first = LiveRequest(request("first", "a", 0, min_runtime=9000.0), (run(0, 5000, FINISHED),))
    second = LiveRequest(request("second", "b", 10), (run(10, 2000, FINISHED),))
    other = Node("n0", "g", 16.0, 64.0, virtual_gpus("elsewhere", 1))
    the_plan = plan(
        history([first, second], nodes=(node(2),), inventory=(InventoryChange(T0 + 5, other),))
    )
    simulated = simulate(the_plan)
    assert simulated.records["first"].ends == [5000.0]
    assert simulated.records["second"].starts == [10.0], "n0 kept both of its GPUs"
