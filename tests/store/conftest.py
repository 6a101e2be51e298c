"""Fixtures of the store tests: stores on in-memory SQLite, a SQLite file and PostgreSQL.

Every PostgreSQL test gets a schema of its own (selected through the URL's
search_path) that is dropped afterwards, so the tests are independent and can run
again and again against one database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text
from store_helpers import CPU_POOL, GPU_POOL

from harness import builders
from scheduler_core import model
from scheduler_core.store import Store

POSTGRES_URL = os.environ.get(
    "BUDGETHUB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL schema, dropped after the test."""
    schema = f"store_test_{uuid.uuid4().hex[:16]}"
    admin = create_engine(POSTGRES_URL)
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def sqlite_file_url(tmp_path: Path) -> str:
    """The URL of a SQLite file that does not exist yet."""
    return builders.sqlite_file_url(tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    """In-memory SQLite, and PostgreSQL for tests marked postgres."""
    if request.param == "sqlite":
        return "sqlite://"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A migrated store with the h100 and cpu pools and the teams prior > olmo, robotics."""
    teams = [
        model.Team("prior", {"h100": 0.6, "cpu": 0.5}),
        model.Team("olmo", {"h100": 0.5}, parent="prior"),
        model.Team("robotics", {"h100": 0.4, "cpu": 0.5}),
    ]
    with builders.store(store_url, pools=[GPU_POOL, CPU_POOL], teams=teams) as opened:
        yield opened
