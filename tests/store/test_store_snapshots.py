"""Snapshots in the store: whose they are, found by key or by server, and forgotten."""

from __future__ import annotations

from alembic import command
from store_helpers import request

from scheduler_core.store import Store
from scheduler_core.store.engine import alembic_config, make_engine


def test_snapshots_are_listed_per_user_and_server_and_deleted_by_key(store: Store) -> None:
    store.add_request(request("ann/lab/1"))
    first = store.save_snapshot(
        "ann/lab/1",
        10.0,
        "budgethub/gpu:latest",
        saved=["x"],
        unsaved={"sock": "socket.socket: cannot be pickled"},
        key="k1",
        server="lab",
        node="gpu-1",
        sizes={"kernels": 123, "home": 4096},
        kernels=[{"notebook": "a.ipynb", "state": "saved"}],
        report={"kernel_state": "saved"},
    )
    second = store.save_snapshot("ann/lab/1", 20.0, "img", key="k2", server="lab")
    other = store.save_snapshot("ann/lab/1", 30.0, "img", server="other")
    assert other.key == str(other.id)  # no key given: the row's id names it
    assert (first.user, first.server, first.node) == ("ann", "lab", "gpu-1")
    assert first.sizes == {"kernels": 123, "home": 4096}
    assert first.kernels == ({"notebook": "a.ipynb", "state": "saved"},)
    assert [s.key for s in store.list_snapshots(user="ann", server="lab")] == ["k1", "k2"]
    assert store.list_snapshots(user="bo") == []
    assert store.get_snapshot("k1") == first
    assert store.get_snapshot("nope") is None
    assert store.delete_snapshots(["k1", "nope"]) == 1
    assert [s.key for s in store.list_snapshots(user="ann")] == [second.key, other.key]


def test_0002_keeps_earlier_snapshot_rows(sqlite_file_url: str) -> None:
    engine = make_engine(sqlite_file_url)
    try:
        config = alembic_config()
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "0001")
            connection.exec_driver_sql(
                "INSERT INTO requests (id, user_name, team, pool, submit, gpus, nodes, gpu_milli,"
                " cpus, memory_gib, labels, min_runtime, resumable, priority, klass, state, spec)"
                " VALUES ('r1', 'ann', 'nlp', 'gpu', 0, 1, 1, 0, 1, 1, '{}', 0, 0, 0,"
                " 'interactive', 'finished', '{}')"
            )
            connection.exec_driver_sql(
                "INSERT INTO snapshots (request_id, created, image, saved, unsaved)"
                " VALUES ('r1', 5.0, 'img', '[]', '{}')"
            )
            command.upgrade(config, "0002")
            command.downgrade(config, "0001")  # and back: the columns go, the row stays
            command.upgrade(config, "0002")
    finally:
        engine.dispose()
    with Store.create(sqlite_file_url) as store:
        [snapshot] = store.list_snapshots(user="ann")
    assert (snapshot.key, snapshot.server, snapshot.created) == ("legacy-1", "", 5.0)
