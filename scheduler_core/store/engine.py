"""Engines for SQLite files, in-memory SQLite and PostgreSQL, and the migration runner.

SQLite gets WAL, foreign keys and SQLAlchemy-emitted BEGIN: the sqlite3 driver's
own transaction handling cannot do ``BEGIN IMMEDIATE``, which the store needs to
take the write lock before it checks whether slices are free.
"""

from __future__ import annotations

import sqlite3
from importlib.resources import files
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

SQLITE_BEGIN = "budgethub_sqlite_begin"
"""Execution option naming the SQLite BEGIN mode (``DEFERRED`` or ``IMMEDIATE``)."""

_MIGRATION_LOCK = 0x627564676574
"""PostgreSQL advisory lock key held while migrating, so two Hubs never migrate at once."""


def is_memory_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def make_engine(url: str | URL, *, echo: bool = False) -> Engine:
    """An engine for ``url`` with the settings the store relies on for its backend."""
    url = make_url(url)
    if url.get_backend_name() != "sqlite":
        return create_engine(url, echo=echo, pool_pre_ping=True)
    if is_memory_sqlite(url):
        # One shared connection, or every checkout would see its own empty database.
        engine = create_engine(
            url,
            echo=echo,
            poolclass=StaticPool,
            connect_args={"check_same_thread": False},
        )
    else:
        # Wait for another process's write lock rather than fail at once.
        engine = create_engine(url, echo=echo, connect_args={"timeout": 30})
    event.listen(engine, "connect", _configure_sqlite_connection)
    event.listen(engine, "begin", _begin_sqlite_transaction)
    return engine


def writer_engine(engine: Engine) -> Engine:
    """``engine`` set up for transactions that check what is free and then write.

    SQLite takes its write lock at BEGIN (a deferred transaction that reads, then
    writes, can fail with "database is locked" instead of waiting). PostgreSQL runs
    at READ COMMITTED, so that a statement after a row lock sees what the previous
    holder of the lock committed.
    """
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
    if engine.dialect.name == "postgresql":
        return engine.execution_options(isolation_level="READ COMMITTED")
    return engine


def _configure_sqlite_connection(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    assert isinstance(dbapi_connection, sqlite3.Connection)
    # Leave BEGIN to _begin_sqlite_transaction; the PRAGMAs must run outside a transaction.
    dbapi_connection.isolation_level = None
    dbapi_connection.execute("PRAGMA foreign_keys = ON")
    dbapi_connection.execute("PRAGMA journal_mode = WAL")
    dbapi_connection.execute("PRAGMA synchronous = NORMAL")


def _begin_sqlite_transaction(connection: Connection) -> None:
    mode = connection.get_execution_options().get(SQLITE_BEGIN, "DEFERRED")
    connection.exec_driver_sql(f"BEGIN {mode}")


def alembic_config() -> Config:
    """The Alembic configuration shipped inside the package (works when installed)."""
    ini = files("scheduler_core.store").joinpath("alembic.ini")
    return Config(str(ini))


def migrate(engine: Engine, revision: str = "heads") -> None:
    """Bring the database behind ``engine`` to ``revision`` with the shipped migrations.

    ``heads``, not ``head``: features that add tables each bring their own migration, and
    two written side by side may both follow the same parent until they are chained."""
    config = alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
