"""Issue 50: My sessions shows "protected until" only for a protected (funded) session;
an unallocated one's grace is no protection (the page says "not protected", the JSON
has null)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from test_zero_share_pages import _state, zero_share_store

from scheduler_core.store import Store
from spawner.hub import mysessions


@pytest.fixture
def store() -> Iterator[Store]:
    yield from zero_share_store()


def test_my_sessions_shows_no_protection_for_unallocated_work(store: Store) -> None:
    state = _state(store)

    class Facade:
        core = state.core
        core_pools = state.core.pools
        view = state.view
        notices: dict[Any, str] = {}
        store = type("S", (), {"list_snapshots": staticmethod(lambda user: [])})()

    class User:
        name = "cy"
        spawners: dict[str, Any] = {}
        orm_spawners: dict[str, Any] = {}

    [row] = mysessions.rows_of(Facade(), User())  # type: ignore[arg-type]
    assert row.funding == "unallocated" and row.protected_until is None
    assert json.loads(json.dumps(row.json()))["protected_until"] is None
