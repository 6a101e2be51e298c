"""Requests that wait again: a container that did not start, and preempted resumable
work, both at their old place in the queue."""

from __future__ import annotations

import time

from harness.hub import booked, containers, wait_for
from harness.nodes import local_gpu_node, one_gpu_profile, preemption_hub
from scheduler_core.store import Store


def test_a_container_that_does_not_start_waits_again_then_the_spawn_says_why(make_hub):
    hub = make_hub(
        nodes=[local_gpu_node(gpus=1)],
        profiles=[
            one_gpu_profile("broken", image="budgethub/no-such-image:latest"),
            one_gpu_profile("ok"),
        ],
        groups={"nlp": ["ann", "bo"]},
        teams=[{"name": "nlp", "share": {"gpu": 1.0, "cpu": 1.0}}],
        extra="c.BudgetScheduler.launch_attempts = 2",
    )
    hub.http.post(f"{hub.api}/users/bo", timeout=10)
    response = hub.spawn("ann", {"profile": "broken"})
    assert hub.spawn("bo", {"profile": "ok"}).status_code in (201, 202)
    if response.status_code == 202:  # it failed after the Hub's slow_spawn_timeout
        wait_for(lambda: hub.server_model("ann") is None, 60, "ann's spawn to end")
        message = hub.log_tail(600)
    else:
        message = response.json()["message"]
    assert response.status_code in (202, 500)
    assert "it did not start (attempt 2 of 2): on node gpu-1:" in message
    assert "no-such-image" in message
    hub.wait_ready("bo")  # the GPU went back, twice, and then to bo
    log = hub.log_tail(2000)
    granted = [line for line in log.splitlines() if "budgethub: granted" in line]
    ann = [i for i, line in enumerate(granted) if " ann//" in line]
    bo = [i for i, line in enumerate(granted) if " bo//" in line]
    assert len(ann) == 2 and len(bo) == 1 and max(ann) < bo[0], granted
    assert "launch failed, queued again" in log
    assert set(booked(hub)) == {c.labels["org.budgethub.request"] for c in containers(hub.hub_name)}
    hub.stop_server("bo")


def test_preempted_resumable_work_waits_again_at_its_old_place(make_hub):
    hub = preemption_hub(
        make_hub,
        profiles=[
            one_gpu_profile("job", **{"class": "batch", "resumable": True}),
            one_gpu_profile("notebook"),
        ],
    )
    hub.spawn("gus", {"profile": "job"})  # guests have no share: it runs unallocated
    hub.wait_ready("gus")
    [first] = containers(hub.hub_name)
    request_id = first.labels["org.budgethub.request"]

    time.sleep(1.5)  # past the unallocated grace
    hub.spawn("ann", {"profile": "notebook"})
    hub.wait_ready("ann", timeout=60)
    # gus's server was stopped, then spawned again through the Hub: it waits.
    wait_for(lambda: (hub.server_model("gus") or {}).get("pending") == "spawn", 30, "gus waits")
    [running] = containers(hub.hub_name)
    assert running.labels["org.budgethub.user"] == "ann"
    store = Store.create(f"sqlite:///{hub.directory}/budgethub.sqlite")
    [preempted] = [e for e in store.list_events() if e.kind == "preempt"]
    store.engine.dispose()
    assert preempted.payload["request"] == request_id
    assert "waits in the queue again at its old place" in preempted.payload["message"]

    hub.stop_server("ann")
    hub.wait_ready("gus", timeout=60)
    [again] = containers(hub.hub_name)
    assert again.labels["org.budgethub.request"] == request_id  # the same request, requeued
    assert again.id != first.id
    hub.stop_server("gus")
    assert booked(hub) == {}
