"""The schema comes from the Alembic migrations, which must match the models exactly."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from scheduler_core.store import Store
from scheduler_core.store.engine import alembic_config, make_engine
from scheduler_core.store.models import Base


def test_migrations_ship_inside_the_package() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    revisions = {revision.revision for revision in script.walk_revisions()}
    assert "0001" in revisions
    assert set(script.get_heads()) <= revisions


def test_migrated_schema_equals_the_models(store_url: str) -> None:
    with Store.create(store_url) as store, store.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert differences == []
        current = MigrationContext.configure(connection).get_current_heads()
        heads = ScriptDirectory.from_config(alembic_config()).get_heads()
        assert set(current) == set(heads)
        script = ScriptDirectory.from_config(alembic_config())
        applied = {r.revision for r in script.iterate_revisions(tuple(current), "base")}
        assert {"0003", "0004"} <= applied  # admin tables (0003), forecasts (0004) included


@pytest.mark.postgres
def test_postgres_partial_indexes_exist(pg_url: str) -> None:
    with Store.create(pg_url) as store, store.engine.connect() as connection:
        definitions: dict[str, str] = dict(
            connection.execute(
                text(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN "
                    "('uq_booked_slices_device', 'uq_allocations_active_request')"
                )
            ).all()
        )
    assert "WHERE ((kind)::text <> 'fraction'::text)" in definitions["uq_booked_slices_device"]
    assert "WHERE (end_time IS NULL)" in definitions["uq_allocations_active_request"]


def test_create_again_keeps_the_data(sqlite_file_url: str) -> None:
    with Store.create(sqlite_file_url) as store:
        store.append_event(1.0, "hello")
    with Store.create(sqlite_file_url) as store:
        assert [event.kind for event in store.list_events()] == ["hello"]


def test_downgrade_removes_every_table(sqlite_file_url: str) -> None:
    with Store.create(sqlite_file_url) as store, store.engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "base")
        assert inspect(connection).get_table_names() == ["alembic_version"]
        command.upgrade(config, "heads")
        assert set(Base.metadata.tables) <= set(inspect(connection).get_table_names())


def test_sqlite_file_uses_wal_and_foreign_keys(sqlite_file_url: str) -> None:
    with Store.create(sqlite_file_url) as store, store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_in_memory_sqlite_is_one_database_for_every_session() -> None:
    engine = make_engine("sqlite://")
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM t").scalar() == 0
    finally:
        engine.dispose()
