"""The frozen dataclasses whose ``__init__`` is written out (compiled, a generated one runs
interpreted: scheduler_core/view.py) take and set exactly their fields, in order, a default where
the field has one: a field added to the class but not to its ``__init__`` fails here,
not as a missing attribute in a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "scheduler_core"


def _written(tree: ast.Module) -> list[ast.ClassDef]:
    """Classes decorated ``@dataclass(..., init=False)`` that define ``__init__``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and getattr(decorator.func, "id", None) == "dataclass"
                and any(
                    k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in decorator.keywords
                )
                and any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in node.body)
            ):
                found.append(node)
    return found


CLASSES = [
    (path, cls)
    for path in sorted(CORE.rglob("*.py"))
    for cls in _written(ast.parse(path.read_text()))
]


def test_there_are_written_out_inits_to_check() -> None:
    assert len(CLASSES) >= 5, [c.name for _, c in CLASSES]


@pytest.mark.parametrize(("path", "cls"), CLASSES, ids=[c.name for _, c in CLASSES])
def test_a_written_out_init_takes_and_sets_every_field(path: Path, cls: ast.ClassDef) -> None:
    fields = [
        (s.target.id, s.value is not None)
        for s in cls.body
        if isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
    ]
    init = next(s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__")
    args = init.args.args[1:]
    required = len(args) - len(init.args.defaults)
    assert [(a.arg, i >= required) for i, a in enumerate(args)] == fields, cls.name
    set_names = [
        c.args[1].value
        for c in ast.walk(init)
        if isinstance(c, ast.Call)
        and ast.unparse(c.func) == "object.__setattr__"
        and isinstance(c.args[1], ast.Constant)
    ]
    assert sorted(set_names) == sorted(name for name, _ in fields), cls.name
