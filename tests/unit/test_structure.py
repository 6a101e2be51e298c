"""The house rules a reader of the tree relies on, read from the source itself.

* No product function is over 80 lines (spawner/, scheduler_core/ with research/, and
  the session image's package). Alembic migrations are left out: a released migration
  is history and is never edited.
* spawner/'s parts import one way: the Hub-facing side (``spawner.hub``) may use the
  session runtime (``spawner.runtime``) and the read model (``spawner.readmodel``);
  neither of those imports the Hub side or each other, and the shared modules at the
  top of ``spawner/`` import none of the three.
* No import circle among spawner's modules, counting every import: those inside
  functions and those under ``TYPE_CHECKING`` too.
* The scheduler core imports no jupyterhub, tornado, docker, traitlets or spawner; its
  policy imports no ORM either.

Each rule is checked on the AST, so that it holds for code that is never run here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import REPO

LIMIT = 80
PRODUCT = ("spawner", "scheduler_core", "images/session/budgethub_session")
SPARED = ("scheduler_core/store/migrations",)


def python_files(*roots: str, base: Path = REPO) -> Iterator[Path]:
    for root in roots:
        for path in sorted((base / root).rglob("*.py")):
            relative = path.relative_to(base).as_posix()
            if not any(relative.startswith(spared) for spared in SPARED):
                yield path


def module_name(path: Path, base: Path = REPO) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, base: Path = REPO) -> set[str]:
    """Every module ``path`` imports, anywhere in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path, base)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            # ``from spawner.hub import pages`` imports the module spawner.hub.pages
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def spawner_graph(base: Path = REPO) -> dict[str, set[str]]:
    modules = {module_name(p, base): p for p in python_files("spawner", base=base)}
    # A module's own packages are imported before it in any case: not an edge. That is
    # why spawner/__init__.py must import nothing eagerly (test below).
    return {
        name: {m for m in imported(path, base) if m in modules and not name.startswith(m + ".")}
        for name, path in modules.items()
    }


def long_functions(*roots: str, base: Path = REPO) -> list[str]:
    return [
        f"{path.relative_to(base)}:{node.lineno} {node.name} "
        f"({node.end_lineno - node.lineno + 1} lines)"
        for path in python_files(*roots, base=base)
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > LIMIT
    ]


def circles_in(graph: dict[str, set[str]]) -> list[list[str]]:
    # A package's __init__ importing its own submodule is not a circle.
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    circles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                circles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return circles


def test_no_product_function_is_over_80_lines() -> None:
    long = long_functions(*PRODUCT)
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


def part_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ("hub", "runtime", "readmodel"):
        return parts[1]
    return "entry" if module in ("spawner", "spawner.hubconfig") else "shared"


ALLOWED = {
    "entry": {"entry", "hub", "runtime", "readmodel", "shared"},
    "hub": {"hub", "runtime", "readmodel", "shared"},
    "runtime": {"runtime", "shared"},
    "readmodel": {"readmodel", "shared"},
    "shared": {"shared"},
}


def test_spawners_parts_import_one_way() -> None:
    wrong = [
        f"{module} ({part_of(module)}) imports {target} ({part_of(target)})"
        for module, targets in spawner_graph().items()
        for target in sorted(targets)
        if part_of(target) not in ALLOWED[part_of(module)]
        and not target.startswith(module + ".")  # a package's own submodules
    ]
    assert not wrong, "\n".join(wrong)


def test_the_package_imports_the_hub_side_only_when_asked() -> None:
    """``spawner/__init__.py`` runs before any of spawner's modules, in the budget
    service's process too: it names ``BudgetSpawner`` lazily, so that importing the read
    model does not import the Hub's side."""
    tree = ast.parse((REPO / "spawner" / "__init__.py").read_text())
    eager = [
        alias.name if isinstance(node, ast.Import) else node.module
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert not [name for name in eager if name and name.startswith("spawner")]


def test_no_import_circle_in_spawner() -> None:
    circles = circles_in(spawner_graph())
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize(
    ("root", "banned"),
    [
        ("scheduler_core", ("jupyterhub", "tornado", "docker", "traitlets", "spawner")),
        ("scheduler_core/policy", ("sqlalchemy", "alembic", "scheduler_core.store")),
    ],
)
def test_the_core_imports_nothing_of_the_hub(root: str, banned: tuple[str, ...]) -> None:
    wrong = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in python_files(root)
        for name in sorted(imported(path))
        if any(name == b or name.startswith(b + ".") for b in banned)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_checks_see_a_wrong_way_import_a_circle_and_a_long_function(tmp_path: Path) -> None:
    """The checks above can fail: on a small tree where the runtime imports a page (under
    TYPE_CHECKING), the page imports it back, and a function is 90 lines long."""
    (tmp_path / "spawner" / "hub").mkdir(parents=True)
    (tmp_path / "spawner" / "runtime").mkdir()
    (tmp_path / "spawner" / "hub" / "pages.py").write_text("from spawner.runtime import probe\n")
    (tmp_path / "spawner" / "runtime" / "probe.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..hub import pages\n"
        "def f():\n" + "    x = 1\n" * 90
    )
    graph = spawner_graph(tmp_path)
    assert graph["spawner.runtime.probe"] == {"spawner.hub.pages"}
    assert part_of("spawner.hub.pages") not in ALLOWED[part_of("spawner.runtime.probe")]
    assert circles_in(graph) == [
        ["spawner.hub.pages", "spawner.runtime.probe", "spawner.hub.pages"]
    ]
    assert long_functions("spawner", base=tmp_path) == ["spawner/runtime/probe.py:4 f (91 lines)"]
