"""A resumable session preempted and granted again at once (room elsewhere) is started
again from its snapshot. Issue 51's live run lost such sessions: the grant came while
the preempted session's take-down still ran, and the Hub's stop of its old spawn (or
the spawn's own failure, when it had not answered yet) ended the new grant and the
request with it: never started again, and left 'preempted-requeued' in the store."""

from __future__ import annotations

import time

from harness.hub import booked, containers
from harness.nodes import FUNDED_AND_GUESTS, local_gpu_node
from scheduler_core.store import Store


def profile(slug: str, klass: str, **extra: object) -> dict[str, object]:
    return {
        "slug": slug,
        "display_name": slug,
        "description": slug,
        "class": klass,
        "pool": "gpu",
        "image": "budgethub/gpu:latest",
        "cpus": 1,
        "memory_gib": 1,
        "min_runtime": "10m",
        "max_min_runtime": "10m",
        "resumable": True,
        **extra,
    }


PROFILES = [profile("notebook", "interactive", gpus=[1, 2])]
ONE, TWO = ({"profile": "notebook", "gpus": n} for n in (1, 2))


def test_work_preempted_and_granted_again_at_once_is_started_again(make_hub):
    hub = make_hub(
        # Worst fit: gus's one GPU goes to gpu-1, whose two GPUs are all ann can use.
        nodes=[local_gpu_node(gpus=2), local_gpu_node(gpus=1, name="gpu-2")],
        teams=FUNDED_AND_GUESTS,
        groups={"nlp": ["ann"], "guests": ["gus"]},
        profiles=PROFILES,
        extra=(
            "c.BudgetScheduler.unallocated_grace = 1.0\nc.BudgetScheduler.placement = 'worst-fit'\n"
        ),
    )
    hub.spawn("gus", ONE)  # no share: unallocated
    hub.wait_ready("gus")
    [first] = booked(hub)
    time.sleep(1.2)  # past the unallocated grace
    # ann's two GPUs can only be gpu-1's: gus is stopped there, and granted again at once
    # on gpu-2, while its take-down still runs and the Hub stops its old spawn.
    hub.spawn("ann", TWO)
    hub.wait_ready("ann", timeout=90)
    hub.wait_ready("gus", timeout=120)
    store_url = f"sqlite:///{hub.directory}/budgethub.sqlite"
    with Store.create(store_url, migrate_schema=False) as store:
        events = store.list_events()
        [preempted] = [e for e in events if e.kind == "preempt"]
        cancels = [e for e in events if e.kind == "cancel"]
        nodes = {a.id: a.node_names for a in store.active_allocations()}
    assert preempted.payload["request"] == first and preempted.payload["requeued"] is True
    assert not cancels
    running = {c.labels["org.budgethub.request"] for c in containers(hub.hub_name)}
    assert first in running, running  # the same request, started again
    assert nodes[first] == ("gpu-2",), nodes
    [taken] = [e.payload["key"] for e in events if e.kind == "snapshot"]
    assert f"gus:: restoring snapshot {taken}" in hub.log_path.read_text()
    for user in ("gus", "ann"):
        hub.stop_server(user)
    assert booked(hub) == {}
