"""Fixtures of the unit tests; the builders they share are in harness/builders.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import builders
from scheduler_core.store import Store


@pytest.fixture
def empty_store() -> Iterator[Store]:
    """A migrated, empty store on a private in-memory SQLite database."""
    with builders.store() as opened:
        yield opened


@pytest.fixture
def store_file_url(tmp_path: Path) -> str:
    """The URL of a migrated, empty store on a temporary SQLite file, for code under
    test that opens the store itself (another process, say)."""
    url = builders.sqlite_file_url(tmp_path)
    builders.store(url).close()
    return url
