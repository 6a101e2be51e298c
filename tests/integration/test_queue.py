"""Queueing, preemption, slice uniqueness and refusals, through the real Hub."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from harness.hub import containers, positions, queue_events, wait_for
from harness.nodes import ONE_GPU, local_gpu_node, preemption_hub


@pytest.mark.slow
def test_a_full_cluster_queues_with_positions_and_starts_in_turn(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    assert hub.spawn("ann", ONE_GPU).status_code in (201, 202)
    hub.wait_ready("ann")

    assert hub.spawn("bo", ONE_GPU).status_code == 202
    bo_events: list[dict[str, Any]] = []
    stop = threading.Event()
    bo_thread = threading.Thread(target=queue_events, args=(hub, "bo", bo_events, stop))
    bo_thread.start()
    wait_for(lambda: positions(bo_events), 20, "bo's queue position")
    assert hub.spawn("cy", ONE_GPU).status_code == 202
    cy_events: list[dict[str, Any]] = []
    cy_thread = threading.Thread(target=queue_events, args=(hub, "cy", cy_events, stop))
    cy_thread.start()
    wait_for(lambda: positions(cy_events), 20, "cy's queue position")

    # vision (bo) has used nothing; nlp (ann, cy) holds the GPU: bo is first.
    assert positions(bo_events)[-1] == 1
    assert positions(cy_events)[-1] == 2
    message = next(e["message"] for e in cy_events if "queue" in e)
    assert "position 2 of 2 in the pool" in message
    assert "1 of 1 in your team" in message
    # nlp's share is half the one GPU and ann's session holds all of it: a second
    # one would pass 1.25 x the share, so it would run unallocated.
    assert (  # the policy's verdict (OVER_BURST) in its words, with the team's figures
        "beyond the team's burst limit next to its other funded work (its funded sessions "
        "hold 1 GPU, its share is 0.5 GPU; " in message
    )
    assert "-day budget used): it will run unallocated (preemptible)" in message
    bo_message = next(e["message"] for e in bo_events if "queue" in e)
    assert "funded by your team's budget, protected for 1 h" in bo_message  # human_duration
    assert "estimated start" in bo_message  # when ann's protected hour ends, at the latest
    assert hub.server_model("bo")["pending"] == "spawn"

    hub.stop_server("ann")
    hub.wait_ready("bo")
    wait_for(lambda: positions(cy_events)[-1:] == [1], 20, "cy to move up to position 1")
    assert hub.server_model("cy")["pending"] == "spawn"

    hub.stop_server("bo")
    hub.wait_ready("cy")
    stop.set()
    bo_thread.join(timeout=30)
    cy_thread.join(timeout=30)
    assert any(e.get("ready") for e in cy_events)
    hub.stop_server("cy")
    assert containers(hub.hub_name) == []


def test_cancelling_a_queued_spawn_takes_it_out_of_the_queue(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)])
    hub.spawn("ann", ONE_GPU)
    hub.wait_ready("ann")
    assert hub.spawn("bo", ONE_GPU).status_code == 202
    wait_for(lambda: hub.server_model("bo") is not None, 10, "bo's pending server")
    hub.stop_server("bo")  # the user's "cancel" on the spawn page
    hub.stop_server("ann")
    time.sleep(2)  # a cycle runs on the stop; a request still queued would start now
    assert hub.server_model("bo") is None
    assert [c.labels["org.budgethub.user"] for c in containers(hub.hub_name)] == []
    assert "left the queue" in hub.log_tail(400)


def test_a_spawn_that_waits_past_the_maximum_queue_wait_ends_with_a_message(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=1)], extra="c.BudgetScheduler.max_queue_wait = 4.0")
    hub.spawn("ann", ONE_GPU)
    hub.wait_ready("ann")
    # The Hub holds the POST up to its slow_spawn_timeout (10 s): the wait ends before.
    response = hub.spawn("bo", ONE_GPU)
    assert response.status_code == 503, response.text
    assert "in the queue, the most this Hub allows" in response.json()["message"]
    wait_for(lambda: hub.server_model("bo") is None, 20, "bo's server to clear")
    hub.stop_server("ann")
    time.sleep(2)
    assert [c.labels["org.budgethub.user"] for c in containers(hub.hub_name)] == []


def test_a_funded_request_displaces_an_unallocated_session_and_its_user_sees_why(make_hub):
    hub = preemption_hub(make_hub)
    hub.spawn("gus", ONE_GPU)  # guests have no share: unallocated, on idle capacity
    hub.wait_ready("gus")
    [victim] = containers(hub.hub_name)
    assert victim.attrs["Config"]["Env"].count("BUDGETHUB_FUNDED=0") == 1

    time.sleep(1.5)  # past the unallocated grace
    hub.spawn("ann", ONE_GPU)
    hub.wait_ready("ann", timeout=60)
    hub.wait_stopped("gus")
    [survivor] = containers(hub.hub_name)
    assert survivor.labels["org.budgethub.user"] == "ann"

    page = hub.login("gus").get(f"{hub.url}/hub/spawn/gus", timeout=10)
    assert page.status_code == 200
    assert "Your session was stopped at" in page.text
    assert "ran unallocated, on idle capacity" in page.text

    hub.stop()
    hub.start()  # the notice is kept in the store's event log, not only in memory
    page = hub.login("gus").get(f"{hub.url}/hub/spawn/gus", timeout=10)
    assert "Your session was stopped at" in page.text
    assert "ran unallocated, on idle capacity" in page.text
    hub.stop_server("ann")


def test_no_two_sessions_share_a_slice_and_each_sees_only_its_own(make_hub, engine):
    hub = make_hub(nodes=[local_gpu_node(gpus=3)])
    for user in ("ann", "bo", "cy"):
        hub.spawn(user, ONE_GPU)
    for user in ("ann", "bo", "cy"):
        hub.wait_ready(user)
    seen = {}
    for container in containers(hub.hub_name):
        granted = container.labels["org.budgethub.gpus"]
        inside = container.exec_run(["printenv", "NVIDIA_VISIBLE_DEVICES"]).output.decode()
        assert inside.strip() == granted
        seen[container.labels["org.budgethub.user"]] = granted
    assert len(set(seen.values())) == 3, seen
    for user in ("ann", "bo", "cy"):
        hub.stop_server(user)


FORGED = [
    ({"profile": "bitcoin-miner"}, "unknown profile"),
    ({"profile": "gpu-notebook", "team": "vision"}, "not a member of team"),
    ({"profile": "gpu-notebook", "gpus": 9999}, "does not offer 9999 GPUs"),
    ({"profile": "gpu-notebook", "priority": -1}, "priority"),
    ({"profile": "gpu-notebook", "min_runtime": "24h"}, "over the cap"),
    ({"profile": "debug", "min_runtime": "1h"}, "over the cap"),
    ({"profile": "gpu-notebook", "gpus": 8}, "could ever hold it"),
    ({"profile": "gpu-notebook", "privileged": True}, "is not a spawn option"),
]


def test_forged_spawn_requests_get_a_clear_refusal(make_hub):
    hub = make_hub(nodes=[local_gpu_node(gpus=2)])
    for options, reason in FORGED:
        response = hub.spawn("ann", options)
        assert response.status_code == 400, (options, response.status_code, response.text)
        assert reason in response.json()["message"], (options, response.json())
        wait_for(lambda: hub.server_model("ann") is None, 10, "the refused server to clear")
    assert "Traceback" not in hub.log_tail(2000)
    assert containers(hub.hub_name) == []
    # The form path too: a logged-in browser posting a forged form gets a page, not a 500.
    browser = hub.login("ann")
    page = browser.post(
        f"{hub.url}/hub/spawn/ann",
        data={"profile": "gpu-notebook", "gpus": "9999", "_xsrf": browser.cookies["_xsrf"]},
        timeout=30,
    )
    assert page.status_code < 500, page.status_code
    assert "does not offer 9999 GPUs" in page.text
