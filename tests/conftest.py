"""How pytest-xdist hands the suite to its workers (``make test`` runs ``-n $(WORKERS)``,
4 by default).

A unit of work is a test file, as with xdist's ``loadscope``: a file's module-scoped
fixtures (a Hub shared by its tests, node engines) then live in one worker. Two
exceptions: the long files in ``SPLIT`` go out test by test, so that no worker is left
with all of them; and every test of a named host the integration tests share (the
second engine, the TLS node) goes to one worker, which alone starts, freezes, kills
and restarts that host. xdist's own ``loadgroup`` would group by a marker, but it
renames node ids in a way pytest 9.2 no longer reads, so the units are made here.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

SHARED_HOSTS = {
    "tests/integration/test_nodes_restart.py": "second_engine",
    "tests/integration/test_reliability.py::"
    "test_a_frozen_engine_goes_unreachable_and_comes_back_with_nothing_lost": "second_engine",
    "tests/integration/test_tls_node.py": "tls_node",
    "tests/integration/test_snapshot_across_nodes.py": "tls_node",
    # Not a host: twenty sessions starting at once would push the queue head of the
    # other test past its 15 s bound, so one worker runs the two in turn.
    "tests/integration/test_reliability.py::test_restart_under_load_loses_nothing": "bursts",
    "tests/integration/test_reliability.py::"
    "test_a_container_that_ends_by_itself_gives_its_gpu_back": "bursts",
}
"""A test file, or one test, → the unit of work it shares with others: the shared-host
fixture its tests use, or a name for tests that must not run at the same time."""

SPLIT = {
    "tests/integration/test_reliability.py",
    "tests/integration/test_queue.py",
    "tests/integration/test_spawn_flow.py",
    "tests/integration/test_snapshot_failures.py",
    "tests/integration/test_snapshot_agent.py",
}
"""Files whose tests are units of their own (none may use a module-scoped fixture)."""


def unit_of(nodeid: str) -> str:
    """The unit of work the test ``nodeid`` belongs to."""
    test = nodeid.split("[", 1)[0]
    path = test.split("::", 1)[0]
    return SHARED_HOSTS.get(test) or SHARED_HOSTS.get(path) or (test if path in SPLIT else path)


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a test the units would put in the wrong worker, naming it."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        for name, defs in info.name2fixturedefs.items() if info else ():
            if name in ("second_engine", "tls_node") and unit_of(item.nodeid) != name:
                raise pytest.UsageError(
                    f"{item.nodeid} uses the shared host {name}: list it under that name "
                    "in SHARED_HOSTS (tests/conftest.py), so that one worker runs its tests"
                )
            if item.nodeid.split("::", 1)[0] in SPLIT and any(
                d.scope in ("module", "class", "package") for d in defs
            ):
                raise pytest.UsageError(
                    f"{item.nodeid} uses the {defs[-1].scope}-scoped fixture {name}, so its "
                    "file must not be in SPLIT (tests/conftest.py)"
                )


TIMELINE = os.environ.get("BUDGETHUB_TIMELINE")
"""A file each worker appends one JSON line per test to (worker, test, start, end), so
that a run's idle workers can be seen: ``BUDGETHUB_TIMELINE=/tmp/t.jsonl make test``."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    start = time.time()
    yield
    if TIMELINE:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "master")
        line = {"worker": worker, "test": item.nodeid, "start": start, "end": time.time()}
        with open(TIMELINE, "a") as out:
            out.write(json.dumps(line) + "\n")
