"""Two processes with a store each race to book the same slices; none is booked twice.

Each worker books every whole GPU, two fractions of every GPU and whole pairs of 4
nodes × 8 GPUs in its own shuffled order. A round counts as a race when both
workers won some bookings and lost some to SliceConflict; otherwise the workers
race again on fresh nodes, a bounded number of times.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
from collections import Counter, defaultdict
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from store_helpers import GPU_POOL, race_nodes, race_worker

from scheduler_core import model
from scheduler_core.store import Store
from scheduler_core.store.models import AllocationRow, BookedSliceRow

MAX_ROUNDS = 5
WORKERS = 2
TIMEOUT_S = 120.0


def run_race(url: str) -> tuple[dict[int, set[str]], dict[int, set[str]], int]:
    """Let the workers race until both won and lost (or MAX_ROUNDS); return won, lost, rounds."""
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(WORKERS + 1)
    stop = spawn.Event()
    out: Any = spawn.Queue()
    workers = [
        spawn.Process(target=race_worker, args=(url, w, MAX_ROUNDS, barrier, stop, out))
        for w in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    won: dict[int, set[str]] = defaultdict(set)
    lost: dict[int, set[str]] = defaultdict(set)
    rounds = 0
    try:
        for _ in range(MAX_ROUNDS):
            barrier.wait(timeout=TIMEOUT_S)
            rounds += 1
            for _ in range(WORKERS):
                worker_id, _round, round_won, round_lost, error = out.get(timeout=TIMEOUT_S)
                assert error is None, f"worker {worker_id} failed:\n{error}"
                won[worker_id].update(round_won)
                lost[worker_id].update(round_lost)
            if all(won[w] and lost[w] for w in range(WORKERS)):
                break
        stop.set()
        if rounds < MAX_ROUNDS:
            barrier.wait(timeout=TIMEOUT_S)
    except (AssertionError, queue.Empty, threading.BrokenBarrierError):
        barrier.abort()
        raise
    finally:
        for worker in workers:
            worker.join(timeout=TIMEOUT_S)
            if worker.is_alive():
                worker.terminate()
                worker.join()
            worker.close()
        out.close()
        out.join_thread()
    return won, lost, rounds


def race_on(url: str) -> None:
    with Store.create(url) as store:
        store.save_pools([GPU_POOL])
        store.save_nodes([n for r in range(MAX_ROUNDS) for n in race_nodes(r)])
        won, lost, rounds = run_race(url)

        for worker in range(WORKERS):
            assert won[worker], f"worker {worker} never won in {rounds} rounds"
            assert lost[worker], f"worker {worker} never met a SliceConflict in {rounds} rounds"

        with Session(store.engine) as session:
            booked = session.execute(
                select(AllocationRow.request_id, BookedSliceRow)
                .join(AllocationRow, BookedSliceRow.allocation_id == AllocationRow.id)
                .where(AllocationRow.end_time.is_(None))
            ).all()
            active_ids = set(
                session.scalars(
                    select(AllocationRow.request_id).where(AllocationRow.end_time.is_(None))
                )
            )

    all_won = set().union(*won.values())
    all_lost = set().union(*lost.values())
    assert active_ids == all_won, "the table holds exactly the bookings the workers won"
    assert not all_won & all_lost

    slices_per_request = Counter(request_id for request_id, _ in booked)
    for request_id, count in slices_per_request.items():
        assert count == (2 if "-pair-" in request_id else 1), f"{request_id} is half booked"

    owners = Counter(row.device_id for _, row in booked if row.kind is not model.SliceKind.FRACTION)
    assert [device for device, count in owners.items() if count > 1] == []

    by_gpu: defaultdict[str, list[BookedSliceRow]] = defaultdict(list)
    for _, row in booked:
        by_gpu[row.gpu_uuid].append(row)
    for gpu, rows in by_gpu.items():
        kinds = {row.kind for row in rows}
        if model.SliceKind.WHOLE in kinds:
            assert len(rows) == 1, f"{gpu} is held whole and by {len(rows) - 1} more"
        else:
            milli = sum(row.milli for row in rows)
            assert milli <= model.MILLI, f"{gpu} has {milli} milli-GPU booked"


@pytest.mark.postgres
@pytest.mark.slow
def test_two_processes_never_book_one_slice_twice_on_postgres(pg_url: str) -> None:
    race_on(pg_url)


@pytest.mark.slow
def test_two_processes_never_book_one_slice_twice_on_a_sqlite_file(sqlite_file_url: str) -> None:
    race_on(sqlite_file_url)
