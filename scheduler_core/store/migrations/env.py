"""Alembic environment of the store.

``Store.create`` hands over an open connection (``config.attributes["connection"]``)
so that in-memory SQLite migrates the very database the store then uses; the
alembic command line instead connects to ``BUDGETHUB_DATABASE_URL``.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from scheduler_core.store.engine import make_engine
from scheduler_core.store.models import Base

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("BUDGETHUB_DATABASE_URL")
    if not url:
        raise RuntimeError("set BUDGETHUB_DATABASE_URL to the database to migrate")
    return url


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(url=_database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_database_url())
    try:
        with engine.begin() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
