"""What goes into the store comes back out as the same frozen dataclasses."""

from __future__ import annotations

import pytest
from store_helpers import CPU_POOL, GPU_POOL, allocation, fraction, gpu_node, mig, request, whole

from harness import builders
from scheduler_core import model
from scheduler_core.store import RequestState, RequestStatus, Store, StoreError


def test_pools_and_teams_round_trip(store: Store) -> None:
    assert store.load_pools() == [CPU_POOL, GPU_POOL]
    teams = {team.name: team for team in store.load_teams()}
    assert teams["olmo"] == model.Team("olmo", {"h100": 0.5}, parent="prior")
    assert dict(teams["prior"].share) == {"h100": 0.6, "cpu": 0.5}

    store.save_teams([model.Team("prior", {"cpu": 1.0}), model.Team("olmo", {"cpu": 0.25})])
    teams = {team.name: team for team in store.load_teams()}
    assert dict(teams["prior"].share) == {"cpu": 1.0}
    assert teams["olmo"].parent is None


def test_team_cycles_are_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="cycle"):
        store.save_teams([model.Team("a", {}, parent="b"), model.Team("b", {}, parent="a")])


def test_nodes_round_trip_with_gpus_and_mig(store: Store) -> None:
    mig_node = gpu_node("mig-1", gpus=2, mig=["1g.10gb", "3g.40gb"], labels={"rack": "a"})
    plain = gpu_node("h100-000", health=model.Health.DRAINING)
    cpu_node = builders.node("prep-1", pool=CPU_POOL.name, gpus=0, labels={"storage": "weka-a"})
    store.save_nodes([plain, mig_node, cpu_node], engine_urls={"prep-1": "tcp://prep-1:2376"})

    assert store.load_nodes() == [plain, mig_node, cpu_node]
    assert store.load_nodes(pool="cpu") == [cpu_node]
    assert store.engine_url("prep-1") == "tcp://prep-1:2376"
    assert store.engine_url("h100-000") is None


def test_saving_a_node_again_replaces_its_inventory_and_keeps_its_engine(store: Store) -> None:
    node = gpu_node("h100-000", gpus=4)
    store.save_nodes([node], engine_urls={node.name: "tcp://h100-000:2376"})
    smaller = gpu_node("h100-000", gpus=2, mig=["1g.10gb"])
    store.save_nodes([smaller])
    assert store.load_nodes() == [smaller]
    assert store.engine_url(node.name) == "tcp://h100-000:2376"


def test_node_health_changes(store: Store) -> None:
    store.save_nodes([gpu_node("h100-000")])
    store.set_node_health("h100-000", model.Health.DOWN)
    assert store.load_nodes()[0].health is model.Health.DOWN
    with pytest.raises(StoreError, match="node nowhere"):
        store.set_node_health("nowhere", model.Health.READY)


def test_requests_round_trip_and_queue_in_submit_order(store: Store) -> None:
    late = request(
        "late",
        submit=30.0,
        gpus=8,
        nodes=2,
        cpus=32.0,
        memory_gib=256.0,
        labels={"storage": "weka-a"},
        min_runtime=28800.0,
        resumable=True,
        priority=3,
        klass=model.RequestClass.BATCH,
        profile="gpu-8",
    )
    early = request("early", submit=10.0, gpu_milli=250, klass=model.RequestClass.DEBUG)
    middle = request("middle", submit=20.0, mig="1g.10gb", team="robotics")
    for item in (late, early, middle):
        store.add_request(item)

    assert store.load_request("late") == late
    assert store.pending_requests() == [early, middle, late]
    assert store.request_status("late") == RequestStatus(RequestState.PENDING)

    store.set_request_state("middle", RequestState.CANCELLED, "user stopped it")
    assert store.request_status("middle") == RequestStatus(
        RequestState.CANCELLED, "user stopped it"
    )
    assert store.pending_requests() == [early, late]
    with pytest.raises(StoreError, match="already exists"):
        store.add_request(early)


def test_allocations_round_trip(store: Store) -> None:
    first, second = gpu_node("mig-1", gpus=4, mig=["1g.10gb", "1g.10gb"]), gpu_node("h100-001")
    store.save_nodes([first, second])
    booked = allocation(
        "r1",
        (first, [mig(first.gpus[0], 1), whole(first.gpus[1]), fraction(first.gpus[2], 250)]),
        (second, [whole(second.gpus[3]), whole(second.gpus[5])]),
        start=100.0,
        charge_rate=4.25,
    )
    store.book(booked)
    cpu_only = allocation("r2", (second, []), start=50.0, funded=False)
    store.book(cpu_only)

    assert store.active_allocations() == [cpu_only, booked]
    assert store.active_allocations(pool="cpu") == []
    assert store.request_status("r1").state is RequestState.ADMITTED
    assert store.pending_requests() == []


def test_release_charges_funded_allocations_only(store: Store) -> None:
    node = gpu_node("h100-000")
    store.save_nodes([node])
    store.book(allocation("funded", (node, [whole(node.gpus[0])]), start=100.0, charge_rate=2.0))
    store.book(allocation("free", (node, [whole(node.gpus[1])]), start=100.0, funded=False))

    assert store.release("funded", 400.0) == pytest.approx(600.0)
    assert store.release("free", 400.0) == 0.0
    assert store.usage_between("olmo", "h100", 0.0, 1000.0) == pytest.approx(600.0)
    assert store.usage_between("robotics", "h100", 0.0, 1000.0) == 0.0
    assert store.active_allocations() == []
    assert store.request_status("funded").state is RequestState.FINISHED
    with pytest.raises(StoreError, match="no active allocation"):
        store.release("funded", 500.0)


def test_preempted_request_is_requeued_and_can_be_booked_again(store: Store) -> None:
    node = gpu_node("h100-000")
    store.save_nodes([node])
    first = allocation("r1", (node, [whole(node.gpus[0])]), start=10.0)
    store.book(first)
    store.release("r1", 20.0, state=RequestState.REQUEUED, reason="preempted by r9")

    assert store.request_status("r1") == RequestStatus(RequestState.REQUEUED, "preempted by r9")
    assert store.pending_requests() == [first.request]
    again = allocation("r1", (node, [whole(node.gpus[0])]), start=10.0)
    store.book(again)
    assert store.active_allocations() == [again]


def test_finished_requests_cannot_be_booked(store: Store) -> None:
    node = gpu_node("h100-000")
    store.save_nodes([node])
    store.book(allocation("r1", (node, [whole(node.gpus[0])])))
    store.release("r1", 5.0)
    with pytest.raises(StoreError, match="finished, not waiting"):
        store.book(allocation("r1", (node, [whole(node.gpus[0])])))


def test_booking_needs_the_gpus_in_the_inventory(store: Store) -> None:
    node, elsewhere = gpu_node("h100-000"), gpu_node("h100-001")
    store.save_nodes([node])
    with pytest.raises(StoreError, match="not in the stored inventory"):
        store.book(allocation("r1", (elsewhere, [whole(elsewhere.gpus[0])])))
    store.save_nodes([elsewhere])
    with pytest.raises(StoreError, match="is on node h100-001, not h100-000"):
        store.book(allocation("r1", (node, [whole(elsewhere.gpus[0])])))
    assert store.active_allocations() == []


def test_usage_between_prorates_overlapping_records(store: Store) -> None:
    store.add_usage("olmo", "h100", 100.0, 200.0, 100.0)
    store.add_usage("olmo", "h100", 300.0, 300.0, 7.0)
    store.add_usage("olmo", "cpu", 100.0, 200.0, 1000.0)

    assert store.usage_between("olmo", "h100", 150.0, 250.0) == pytest.approx(50.0)
    assert store.usage_between("olmo", "h100", 120.0, 130.0) == pytest.approx(10.0)
    assert store.usage_between("olmo", "h100", 0.0, 1000.0) == pytest.approx(107.0)
    assert store.usage_between("olmo", "h100", 200.0, 300.0) == 0.0
    assert store.usage_between("olmo", "h100", 300.0, 301.0) == pytest.approx(7.0)


def test_events_and_snapshots_survive_a_new_store(sqlite_file_url: str) -> None:
    node = gpu_node("h100-000")
    with Store.create(sqlite_file_url) as store:
        store.save_pools([GPU_POOL])
        store.save_nodes([node])
        store.append_event(1.0, "submit", {"request": "r1"})
        store.book(allocation("r1", (node, [whole(node.gpus[0])])))
        store.append_event(2.0, "admit", {"request": "r1", "node": node.name, "gpus": [0]})
        snapshot = store.save_snapshot(
            "r1",
            3.0,
            "budgethub/snapshots:r1-1",
            saved=["kernel:analysis.ipynb", "filesystem"],
            unsaved={"kernel:train.ipynb": "a CUDA context cannot be pickled"},
        )

    with Store.create(sqlite_file_url) as store:
        events = store.list_events()
        assert [(e.time, e.kind, dict(e.payload)) for e in events] == [
            (1.0, "submit", {"request": "r1"}),
            (2.0, "admit", {"request": "r1", "node": node.name, "gpus": [0]}),
        ]
        assert [e.kind for e in store.list_events(kind="admit")] == ["admit"]
        assert [e.kind for e in store.list_events(since=1.5)] == ["admit"]
        assert store.list_snapshots() == [snapshot]
        assert store.list_snapshots("r1")[0].unsaved == {
            "kernel:train.ipynb": "a CUDA context cannot be pickled"
        }
        assert snapshot.allocation_id is not None
        assert store.active_allocations()[0].id == "r1"


def test_snapshots_need_a_known_request(store: Store) -> None:
    with pytest.raises(StoreError, match="request r404 is not stored"):
        store.save_snapshot("r404", 1.0, "image")
