"""Restore fidelity (issue 42), with real kernels: variables defined in a kernel of one
Jupyter Server with the budgethub extensions, checkpointed by its agent, restored into
a fresh kernel of a second server whose restore folder is the first one's state (as a
new container finds the snapshot), and compared there with
:func:`budgethub_session.fidelity.describe`: values, types and identity relations.

The property test draws namespaces with hypothesis (budgethub_session.fidelity.programs);
BUDGETHUB_FIDELITY_EXAMPLES sets how many (``make bench`` runs more, bench.restore_fidelity).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_server")

from budgethub_session.fidelity import Program, check, programs  # noqa: E402
from budgethub_session.localserver import LocalKernel, LocalServer  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

EXAMPLES = int(os.environ.get("BUDGETHUB_FIDELITY_EXAMPLES", "4"))
_paths = itertools.count()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, LocalServer]]:
    base = tmp_path_factory.mktemp("fidelity")
    root = base / "root"
    with LocalServer(root, home=base / "home-a") as first:
        with LocalServer(root, home=base / "home-b", restore_dir=first.state_dir) as second:
            yield first, second


# Issue 42, defects 1-3: each of these came back as something else before.
DEFECTS = """
import numpy as np
from pathlib import Path
Path('data.txt').write_text('one\\ntwo\\nthree\\n')
reader = open('data.txt'); first_line = reader.readline()
binary = open('data.txt', 'rb'); head = binary.read(4)
log = open('log.txt', 'a+'); log.write('before\\n')
out = open('out.txt', 'w'); out.write('abc')
with open('data.txt') as done:
    pass
Path('gone.txt').write_text('x'); gone = open('gone.txt'); Path('gone.txt').unlink()

class Slotted:
    __slots__ = ('a', 'b')
    def __init__(self, a, b):
        self.a, self.b = a, b

s = Slotted(1, [2])
base_arr = np.arange(10.0)
view = base_arr[2:5]
grid = np.arange(12.0).reshape(3, 4)
row = grid[1]
pair = (base_arr, base_arr[::-1])
"""
DEFECT_NAMES = [
    "reader", "binary", "log", "out", "done", "gone", "s", "base_arr", "view", "grid", "row",
    "pair",
]  # fmt: skip


def test_files_slots_and_views_come_back_as_they_were(
    servers: tuple[LocalServer, LocalServer],
) -> None:
    first, second = servers
    program = Program([], DEFECT_NAMES, {"gone"}, header=DEFECTS)
    program.files = {"reader", "binary", "log", "out", "done"}
    seen: dict[str, object] = {}

    def probe(kb: LocalKernel) -> None:
        # What the restored kernel does with them: reads go on, writes reach the disk.
        seen["got"] = kb.value(
            "[type(reader).__name__, reader.name, reader.mode, reader.readline(),"
            " type(binary).__name__, binary.mode, binary.read(2).decode(),"
            " log.mode, log.write('after\\n'), log.flush(),"
            " out.mode, out.write('def'), out.flush(), done.closed, done.name,"
            " hasattr(s, '__dict__'), type(s).__slots__,"
            " view.base is base_arr, row.base is grid.base, pair[1].base is pair[0],"
            " bool(np.shares_memory(view, base_arr))]"
        )
        seen["slot"] = kb.run("s.c = 1").error

    outcome = check(first, second, program, "defects/files.ipynb", probe)
    assert outcome.mismatches == []
    assert "was deleted while open" in outcome.not_kept["gone"]
    assert sorted(outcome.reopened) == ["binary", "done", "log", "out", "reader"]
    assert seen["got"] == [
        "TextIOWrapper", "data.txt", "r", "two\n", "BufferedReader", "rb", "tw",
        "a+", 6, None, "w", 3, None, True, "data.txt",
        False, ["a", "b"], True, True, True, True,
    ]  # fmt: skip
    assert "AttributeError" in str(seen["slot"]), "an instance with __slots__ took a new attribute"
    folder = first.root / "defects"
    assert (folder / "log.txt").read_text() == "before\nafter\n"
    assert (folder / "out.txt").read_text() == "abcdef"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(program=programs())
def test_restored_namespaces_are_the_namespaces_checkpointed(
    servers: tuple[LocalServer, LocalServer], program: Program
) -> None:
    first, second = servers
    outcome = check(first, second, program, f"property/ex{next(_paths)}.ipynb")
    assert outcome.mismatches == [], "\n".join(
        [program.source()[-3000:], json.dumps(outcome.not_kept), *outcome.mismatches]
    )
