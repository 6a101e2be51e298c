"""The simulator answers for the live cluster (issue 51): a real Hub on the Docker
runtime with virtual GPUs runs a fixed, seeded scenario in real time (harness/liverun.py:
two GPU nodes and a CPU node, three teams, 42 sessions of the debug, notebook and
data-prep profiles over about five minutes, guests' notebooks stopped for funded work
and restored, gpu-2 drained mid-run), then `budgethub replay` on its store must agree
with what happened: start order, waits, the preemptions, each team's GPU-hours. Where
it does not, the test prints each difference with its causes before it fails.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from harness.hub import Hub, new_hub_name, remove_containers
from harness.liverun import DRAIN, live_run, replay_report, start_live_hub
from harness.nodes import one_gpu_profile, preemption_hub
from scheduler_core.research.replay import compare, plan, simulate
from scheduler_core.research.replay_store import open_store, read_history
from scheduler_core.simulator import SimRun
from scheduler_core.store import Store
from spawner.hubapi import split_request_id

ORDER_BAR = 0.95
"""Start order: at least this share of the pairs in the same order (the issue's bar)."""
TEAM_BAR = 0.05
"""Each team's GPU time within this fraction of the live one (the issue's "delivered
GPU-hours": the time its sessions held GPUs, funded or not)."""


def team_gpu_seconds(
    store_url: str, started: float, ended: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Each team's GPU time, live and simulated, in GPU-seconds and unrounded (the
    report's GPU-hours are rounded to hundredths, as coarse as 5 % of a five-minute run):
    the replay's own plan and simulation of the same period, summed over the runs' segments
    in the GPU pool, funded or not."""
    source = open_store(store_url)
    try:
        history = read_history(source, started - 1, ended + 1, 0.0)
    finally:
        source.close()
    the_plan = plan(history)

    def held(run: SimRun) -> dict[str, float]:
        found: dict[str, float] = {}
        for segment in run.segments:
            if segment.pool == "gpu":
                seconds = (segment.end - segment.start) * segment.rate
                found[segment.team] = found.get(segment.team, 0.0) + seconds
        return {team: round(seconds, 1) for team, seconds in found.items() if seconds > 0}

    return held(the_plan.live), held(simulate(the_plan))


def user_server(request_id: str) -> str:
    """How the Hub's log names a request's server: ``user:server``."""
    return ":".join(split_request_id(request_id))


def why(report: dict[str, Any], wait_bar: float) -> str:
    """Each request whose simulated start is off by more than ``wait_bar`` or whose
    preemptions differ, with the causes the report names."""
    lines = []
    for row in report["requests"]:
        error = row["wait_error_s"]
        live, sim = row["live"], row["simulated"]
        off = error is not None and abs(error) > wait_bar
        if off or live["preemptions"] != sim["preemptions"]:
            lines.append(
                f"{row['id']} ({row['class']}, {row['team']}): live start {live['start']} "
                f"on {live['nodes']} funded={live['funded']} preempted {live['preemptions']}x; "
                f"simulated {sim['start']} on {sim['nodes']} funded={sim['funded']} "
                f"preempted {sim['preemptions']}x; error {error} s; causes {row['causes']}"
            )
    comparison = report["comparison"]
    lines.append(f"causes: {comparison['causes']}; unseen: {comparison['unseen']}")
    lines.append(f"teams: {comparison['teams']}")
    return "\n".join(lines)


@pytest.mark.slow
def test_replay_of_a_live_run_agrees_with_it(engine, tmp_path, request):
    hub_name = new_hub_name(request.node.nodeid)
    hub = start_live_hub(tmp_path, hub_name)
    try:
        hub.start()
        outcome = live_run(hub)
        log = hub.log_tail(400)
    finally:
        hub.stop()
        remove_containers(hub_name)
    assert not outcome.problems, f"{outcome.problems}\n{log[-20000:]}"
    assert set(outcome.spawn_status.values()) <= {201, 202}, outcome.spawn_status

    # The history the run had to leave: a preemption whose session came back restored,
    # the drain, each launch's latency and each request's forecast at submit.
    with Store.create(outcome.store_url, migrate_schema=False) as store:
        events = store.list_events()
        forecasts = store.request_forecasts()
    kinds = [e.kind for e in events]
    preempted = {e.payload["request"] for e in events if e.kind == "preempt"}
    snapshots = {e.payload["request"]: e.payload["key"] for e in events if e.kind == "snapshot"}
    launched = [e for e in events if e.kind == "launched"]
    hub_log = hub.log_path.read_text(errors="replace")
    restored = [
        rid
        for rid in preempted
        if rid in snapshots
        and sum(e.payload["request"] == rid for e in launched) >= 2
        and f"{user_server(rid)}: restoring snapshot {snapshots[rid]}" in hub_log
    ]
    assert restored, f"no preempted session started again from its snapshot: {kinds}"
    node, _, _ = DRAIN
    drains = [e.payload["state"] for e in events if e.kind == "node" and e.payload["node"] == node]
    assert drains == ["draining", "ready"], drains
    assert "hub-start" in kinds and kinds.count("admin-applied") >= 2
    submitted = {e.payload["request"] for e in events if e.kind == "submit"}
    assert len(submitted) == len(outcome.sessions) and set(forecasts) == submitted
    latency = statistics.median(e.payload["latency_s"] for e in launched)

    report, printed = replay_report(outcome, tmp_path, "--policy", "legacy")
    print(printed[-6000:])
    comparison = report["comparison"]
    tick = report["settings"]["cycle_tick"]
    wait_bar = tick + latency
    print(f"spawn latency median {latency:.2f} s, cycle tick {tick:g} s")
    print(json.dumps({k: comparison[k] for k in comparison if k != "unseen"}, indent=1))
    differences = why(report, wait_bar)
    print(differences)
    assert comparison["requests"] == len(outcome.sessions), differences
    assert comparison["order_agreement"] >= ORDER_BAR, differences
    assert comparison["wait_abs_error_s"]["p50"] <= wait_bar, differences
    assert comparison["preemptions"]["same_set"], differences
    live_s, simulated_s = team_gpu_seconds(outcome.store_url, outcome.started, outcome.ended)
    print(f"GPU-seconds per team: live {live_s}, simulated {simulated_s}")
    assert set(live_s) == {"nlp", "vision", "guests"}, live_s
    for team, held in live_s.items():
        error = abs(simulated_s.get(team, 0.0) - held) / held
        assert error <= TEAM_BAR, (
            f"{team}: live {held:.0f} s, simulated {simulated_s}\n{differences}"
        )

    # What-if on the same history: legacy makes debug sessions wait longer.
    rows = {row["label"]: row for row in report["outcomes"]}
    legacy = [row for row in report["outcomes"] if row["policy"] == "legacy"]
    assert legacy, report["outcomes"]
    budget = rows["replay"]["headline"]["debug_p90_s"]
    assert legacy[0]["headline"]["debug_p90_s"] > budget, report["outcomes"]


def test_a_session_the_hub_ended_at_a_preemption_is_ended_in_the_replay(
    make_hub: Callable[..., Hub],
) -> None:
    """A guest's notebook that cannot resume is preempted for funded work: the Hub ends
    it (its preempt event says requeued: false) and never starts it again. The replay of
    the store does the same; before, the simulator queued it again and started it once
    the funded session ended."""
    hub = preemption_hub(make_hub, profiles=[one_gpu_profile("notebook", resumable=False)])
    started = time.time()
    hub.spawn("gus", {"profile": "notebook"})  # no share: it runs unallocated
    hub.wait_ready("gus")
    time.sleep(1.5)  # past the unallocated grace
    hub.spawn("ann", {"profile": "notebook"})
    hub.wait_ready("ann", timeout=60)
    time.sleep(2.0)
    hub.stop_server("ann")
    time.sleep(3.0)  # the GPU free again: live, nothing starts there
    ended = time.time()
    store_url = f"sqlite:///{hub.directory}/budgethub.sqlite"
    with Store.create(store_url, migrate_schema=False) as store:
        [preempted] = [e for e in store.list_events() if e.kind == "preempt"]
    assert preempted.payload["requeued"] is False
    gus = preempted.payload["request"]
    source = open_store(store_url)
    try:
        history = read_history(source, started - 1, ended, 0.0)
    finally:
        source.close()
    the_plan = plan(history)
    assert gus in the_plan.ends_on_preempt
    simulated = simulate(the_plan)
    record = simulated.records[gus]
    assert (len(record.starts), record.preemptions, record.finished) == (1, 1, False)
    comparison = compare(the_plan, simulated)
    assert comparison["comparison"]["preemptions"]["same_set"], comparison["requests"]
    [row] = [r for r in comparison["requests"] if r["id"] == gus]
    assert row["simulated"]["end"] is None and row["live"]["end"] is None, row
