"""No slice is booked twice: whole GPUs, MIG instances and fractions of one GPU."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from store_helpers import allocation, fraction, gpu_node, mig, request, whole

from scheduler_core import model
from scheduler_core.store import SliceConflict, Store, StoreError
from scheduler_core.store.conflicts import Holding, check_free
from scheduler_core.store.mapping import allocation_row, request_row
from scheduler_core.store.records import RequestState

NODE = gpu_node("h100-000", gpus=4, mig=["1g.10gb", "1g.10gb", "3g.40gb"])
MIG_GPU, GPU, OTHER_GPU = NODE.gpus[0], NODE.gpus[1], NODE.gpus[2]


@pytest.fixture
def cluster(store: Store) -> Store:
    store.save_nodes([NODE])
    return store


def book(store: Store, request_id: str, *slices: model.Slice) -> None:
    store.book(allocation(request_id, (NODE, slices)))


def test_the_same_whole_gpu_twice_conflicts(cluster: Store) -> None:
    book(cluster, "r1", whole(GPU))
    cluster.add_request(request("r2"))
    with pytest.raises(SliceConflict) as raised:
        book(cluster, "r2", whole(GPU))
    assert raised.value.device_id == GPU.uuid
    assert raised.value.holders == ("r1",)
    assert GPU.uuid in str(raised.value)
    assert "held by r1" in str(raised.value)
    assert [a.id for a in cluster.active_allocations()] == ["r1"]
    assert cluster.request_status("r2").state is RequestState.PENDING


def test_fractions_share_a_gpu_up_to_one_thousand_milli(cluster: Store) -> None:
    book(cluster, "r1", fraction(GPU, 500))
    book(cluster, "r2", fraction(GPU, 500))
    with pytest.raises(SliceConflict, match="asks 1 milli-GPU but r1, r2 hold 1000"):
        book(cluster, "r3", fraction(GPU, 1))


def test_fractions_over_one_thousand_milli_conflict(cluster: Store) -> None:
    book(cluster, "r1", fraction(GPU, 600))
    with pytest.raises(SliceConflict) as raised:
        book(cluster, "r2", fraction(GPU, 500))
    assert raised.value.holders == ("r1",)
    book(cluster, "r3", fraction(GPU, 400))


@pytest.mark.parametrize("first_whole", [True, False], ids=["whole-first", "fraction-first"])
def test_whole_and_fraction_on_one_gpu_conflict(cluster: Store, first_whole: bool) -> None:
    first, second = (whole(GPU), fraction(GPU, 100))
    if not first_whole:
        first, second = second, first
    book(cluster, "r1", first)
    with pytest.raises(SliceConflict, match="held by r1"):
        book(cluster, "r2", second)


def test_mig_instances_are_booked_one_by_one(cluster: Store) -> None:
    book(cluster, "r1", mig(MIG_GPU, 0))
    book(cluster, "r2", mig(MIG_GPU, 1))
    with pytest.raises(SliceConflict) as raised:
        book(cluster, "r3", mig(MIG_GPU, 0))
    assert raised.value.device_id == MIG_GPU.mig[0].uuid
    for exclusive in (whole(MIG_GPU), fraction(MIG_GPU, 100)):
        with pytest.raises(SliceConflict, match="r1, r2"):
            book(cluster, "r4", exclusive)


def test_after_release_the_slices_can_be_booked_again(cluster: Store) -> None:
    book(cluster, "r1", whole(GPU), fraction(OTHER_GPU, 800))
    cluster.release("r1", 60.0)
    book(cluster, "r2", whole(GPU))
    book(cluster, "r3", fraction(OTHER_GPU, 1000))


def test_a_conflicting_allocation_books_none_of_its_slices(cluster: Store) -> None:
    book(cluster, "r1", whole(OTHER_GPU))
    with pytest.raises(SliceConflict):
        book(cluster, "r2", whole(GPU), whole(OTHER_GPU))
    book(cluster, "r3", whole(GPU))


def test_one_allocation_cannot_hold_a_slice_twice(cluster: Store) -> None:
    with pytest.raises(SliceConflict, match="r1 cannot book it"):
        book(cluster, "r1", whole(GPU), whole(GPU))
    with pytest.raises(SliceConflict):
        book(cluster, "r2", fraction(GPU, 600), fraction(GPU, 600))


def test_the_database_itself_refuses_a_device_booked_twice(cluster: Store) -> None:
    """The partial unique index holds even for writers that skip the store's check."""
    book(cluster, "r1", whole(GPU), fraction(OTHER_GPU, 300))
    sneaky = allocation("r2", (NODE, [whole(GPU)]))
    with Session(cluster.engine) as session:
        session.add(request_row(sneaky.request, RequestState.ADMITTED))
        session.add(allocation_row(sneaky))
        with pytest.raises(IntegrityError):
            session.commit()
    # Fractions are left to the store's locked check, so the index lets them through.
    shared = allocation("r3", (NODE, [fraction(OTHER_GPU, 300)]))
    with Session(cluster.engine) as session:
        session.add(request_row(shared.request, RequestState.ADMITTED))
        session.add(allocation_row(shared))
        session.commit()


def test_a_request_holds_one_active_allocation(cluster: Store) -> None:
    cluster.add_request(request("r1"))
    book(cluster, "r1", whole(GPU))
    cluster.set_request_state("r1", RequestState.PENDING)
    with pytest.raises(StoreError, match="r1 already holds an allocation"):
        book(cluster, "r1", whole(OTHER_GPU))


A, B = "GPU-a", "GPU-b"


def held(holder: str, gpu: str, kind: model.SliceKind, milli: int = 1000) -> Holding:
    return Holding(holder, "n1", model.Slice(gpu, kind, milli=milli))


@pytest.mark.parametrize(
    ("existing", "wanted", "conflicts"),
    [
        ([], [held("r", A, model.SliceKind.WHOLE)], False),
        ([held("x", B, model.SliceKind.WHOLE)], [held("r", A, model.SliceKind.WHOLE)], False),
        ([held("x", A, model.SliceKind.FRACTION, 1)], [held("r", A, model.SliceKind.WHOLE)], True),
        (
            [held("x", A, model.SliceKind.FRACTION, 300)] * 2,
            [held("r", A, model.SliceKind.FRACTION, 400)],
            False,
        ),
        (
            [held("x", A, model.SliceKind.FRACTION, 300)] * 2,
            [held("r", A, model.SliceKind.FRACTION, 401)],
            True,
        ),
        ([], [held("r", A, model.SliceKind.FRACTION, 700)] * 2, True),
    ],
)
def test_check_free_table(existing: list[Holding], wanted: list[Holding], conflicts: bool) -> None:
    if conflicts:
        with pytest.raises(SliceConflict):
            check_free(existing, wanted)
    else:
        check_free(existing, wanted)
