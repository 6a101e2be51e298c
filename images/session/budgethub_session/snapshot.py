"""IPython extension, the kernel's side of a snapshot: it keeps the kernel's checkpoint
(:mod:`budgethub_session.checkpoint`) current after every cell and on the agent's
flush, and on start restores the variables of the snapshot the Hub mounted.

Loaded for every kernel of the session images (``/opt/venv/etc/ipython/
ipython_kernel_config.py``). The notebook comes from ``JPY_SESSION_NAME``; its
checkpoint lives in ``$BUDGETHUB_STATE_DIR/<notebook_key>/`` (docs/snapshots.md).

After a cell, on the kernel's thread, it only looks at names: which variables were
rebound, which the cell's code names, and which globals the cell's functions use
(a cell that calls ``globals()``/``exec`` or a magic that runs code counts as
touching everything). That takes microseconds; pickling, hashing and writing the
groups those names belong to happens in a background thread
(:class:`budgethub_session.checkpoint.Worker`). The agent's flush
(:func:`flush_json`, run as a silent execute request between cells) saves every
variable whose bytes changed, so what was missed by the name analysis (a mutation
through a module's function) is still caught before a preemption.

On start, with ``$BUDGETHUB_RESTORE_DIR`` holding this notebook's checkpoint, the
variables are loaded before the first cell, once per snapshot (a marker in
``~/.budgethub/restored/``), and a note is printed in the first cell's output.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
import time
import types
from pathlib import Path
from typing import Any

import budgethub_usersite

from budgethub_session import (
    RESTORE_ENV,
    notebook_key,
    notebook_path,
    restored_dir,
    state_dir,
)
from budgethub_session.checkpoint import Checkpointer, LoadResult, Worker, load_namespace

__all__ = ["flush_json", "load_ipython_extension", "unload_ipython_extension"]

_HIDDEN = re.compile(r"^(_{1,3}|_i{1,3}|_i?\d+|_oh|_ih|_dh|_exit_code)$")
_IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython"}
# Calls that reach the namespace without naming variables: look at everything.
_DYNAMIC = {"globals", "locals", "vars", "exec", "eval", "__import__"}
# get_ipython().<method>(...) forms that run no Python code of the user's.
_SAFE_SHELL_CALLS = {"system", "getoutput"}
_SAFE_MAGICS = {"pip", "conda", "mamba", "matplotlib", "who", "whos", "env", "pwd", "ls", "cd"}

_ACTIVE: Extension | None = None
_DISABLED = "the budgethub checkpoint extension is not loaded in this kernel"


def _codes(value: Any, namespace: dict[str, Any]) -> list[types.CodeType]:
    """Code objects of a cell's function, method, class or instance of such a class."""
    if isinstance(value, types.MethodType):
        value = value.__func__
    if isinstance(value, types.FunctionType):
        return [value.__code__] if value.__globals__ is namespace else []
    cls = value if isinstance(value, type) else type(value)
    if getattr(cls, "__module__", None) != "__main__":
        return []
    out = []
    for attr in vars(cls).values():
        for f in (attr, getattr(attr, "__func__", None), getattr(attr, "fget", None)):
            if isinstance(f, types.FunctionType) and f.__globals__ is namespace:
                out.append(f.__code__)
    return out


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _safe_shell_call(node: ast.Call) -> bool:
    func = node.func
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "get_ipython"
    ):
        return False
    if func.attr in _SAFE_SHELL_CALLS:
        return True
    if func.attr == "run_line_magic" and node.args and isinstance(node.args[0], ast.Constant):
        return node.args[0].value in _SAFE_MAGICS
    return False


def cell_names(
    source: str | None, bindings: dict[str, Any], namespace: dict[str, Any]
) -> set[str] | None:
    """Variables a cell may have touched, or None when that cannot be told (all)."""
    if source is None:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _safe_shell_call(node):
            assert isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call)
            allowed.add(id(node.func.value.func))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id in _DYNAMIC or (node.id == "get_ipython" and id(node) not in allowed):
                return None
            names.add(node.id)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names.update(node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            if node.name == "*":
                return None
            names.add((node.asname or node.name).split(".")[0])
    # Through the functions and classes the cell uses, to the globals they use.
    todo = [n for n in names if n in bindings]
    seen = set(todo)
    while todo:
        for code in _codes(bindings[todo.pop()], namespace):
            for n in _code_names(code):
                if n in bindings and n not in seen:
                    seen.add(n)
                    todo.append(n)
    return seen | names


def format_note(result: LoadResult) -> str:
    shown = ", ".join(result.restored[:12]) + (", ..." if len(result.restored) > 12 else "")
    note = (
        f"budgethub: restored {len(result.restored)} variable"
        f"{'' if len(result.restored) == 1 else 's'}"
        + (f" ({shown})" if result.restored else "")
        + f" in {result.seconds:.1f} s"
    )
    if result.reopened:
        files = "; ".join(f"{name} ({what})" for name, what in sorted(result.reopened.items()))
        note += f"; open files: {files}"
    if result.not_restored:
        lost = "; ".join(f"{name} ({why})" for name, why in sorted(result.not_restored.items()))
        note += f"; not restored: {lost}"
    return note


class Extension:
    def __init__(self, shell: Any, notebook: str) -> None:
        self.shell = shell
        self.namespace: dict[str, Any] = shell.user_ns
        self.notebook = notebook
        self.key = notebook_key(notebook)
        self.checkpointer = Checkpointer(state_dir() / self.key, notebook, self.namespace)
        self.worker = Worker(self.checkpointer, self._error)
        self.errors: list[str] = []
        self.note: str | None = None
        self.restore_result: LoadResult | None = None
        self._note_pending = False
        self._last_ids: dict[str, int] = {}
        # IPython hides what is in the namespace when the kernel has started (after
        # extensions load): the restored variables are the user's, not hidden.
        self.restored: set[str] = set()
        self.cell_seconds = 0.0  # time spent on the kernel's thread after cells

    # -- the namespace -----------------------------------------------------------
    def bindings(self) -> dict[str, Any]:
        hidden = self.shell.user_ns_hidden
        out = {}
        for name, value in list(self.namespace.items()):
            if name.startswith("__") and name.endswith("__"):
                continue
            if name in _IPYTHON_NAMES or _HIDDEN.match(name):
                continue
            if name in hidden and hidden[name] is value and name not in self.restored:
                continue
            out[name] = value
        return out

    # -- hooks ---------------------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        if self.restored:
            hidden = self.shell.user_ns_hidden
            for name in self.restored:
                if name in hidden and hidden[name] is self.namespace.get(name, hidden):
                    del hidden[name]
            self.restored = set()
        if self._note_pending and self.note:
            self._note_pending = False
            print(self.note)

    def post_run_cell(self, result: Any) -> None:
        t0 = time.perf_counter()
        try:
            bindings = self.bindings()
            ids = {n: id(v) for n, v in bindings.items()}
            rebound = {n for n, i in ids.items() if self._last_ids.get(n) != i}
            self._last_ids = ids
            info = getattr(result, "info", None)
            raw = getattr(info, "raw_cell", None)
            source = None
            if raw is not None:
                try:
                    source = self.shell.transform_cell(raw)
                except Exception:
                    source = None
            named = cell_names(source, bindings, self.namespace)
            self.worker.submit(bindings, None if named is None else named | rebound)
        except Exception as error:  # never break the user's cell
            self._error(error)
        self.cell_seconds += time.perf_counter() - t0

    def _error(self, error: BaseException) -> None:
        text = f"{type(error).__name__}: {error}"
        self.errors = [*self.errors[-4:], text]
        print(f"budgethub checkpoint: {text}", file=sys.__stderr__, flush=True)

    # -- restore and flush -------------------------------------------------------------
    def restore(self) -> None:
        source = os.environ.get(RESTORE_ENV)
        if not source:
            return
        directory = Path(source) / self.key
        try:
            stamp = hashlib.sha256((directory / "manifest.json").read_bytes()).hexdigest()[:32]
        except OSError:
            return  # no checkpoint of this notebook in the snapshot
        marker = restored_dir() / self.key
        try:
            if marker.read_text().strip() == stamp:
                return  # restored once already from this snapshot (a kernel restart)
        except OSError:
            pass
        try:
            result = load_namespace(directory, self.namespace)
        except Exception as error:
            self.note = f"budgethub: the kernel state could not be restored: {error}"
        else:
            self.restore_result = result
            self.restored = set(result.restored)
            self.note = format_note(result)
        try:
            marker.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            marker.write_text(stamp + "\n")
        except OSError as error:
            self._error(error)
        self._note_pending = True
        print(self.note, file=sys.__stderr__, flush=True)
        bindings = self.bindings()
        self._last_ids = {n: id(v) for n, v in bindings.items()}
        self.worker.submit(bindings, None)  # into this container's state dir, in the background

    def flush(self) -> dict[str, Any]:
        """Save every variable whose bytes changed, durably; the kernel's thread waits."""
        t0 = time.perf_counter()
        self.worker.discard_pending()
        result = self.checkpointer.save(self.bindings(), None, fsync=True)
        return {
            "state": "saved",
            "notebook": self.notebook,
            "saved": result.saved,
            "unsaved": result.unsaved,
            "reopened": result.reopened,
            "bytes": result.bytes,
            "written": result.written,
            "error": "; ".join(self.errors) or None,
            "seconds": round(time.perf_counter() - t0, 4),
        }

    def close(self) -> None:
        self.worker.close()


def flush_json() -> str:
    """The agent's entry point (a silent execute request's user expression)."""
    if _ACTIVE is None:
        return json.dumps(
            {"state": "failed", "saved": [], "unsaved": {}, "bytes": 0, "error": _DISABLED}
        )
    try:
        return json.dumps(_ACTIVE.flush())
    except Exception as error:
        return json.dumps(
            {
                "state": "failed",
                "saved": [],
                "unsaved": {},
                "bytes": 0,
                "error": f"{type(error).__name__}: {error}",
            }
        )


def _magic(line: str) -> None:
    """%budgethub_checkpoint: save now and say what is kept (and the restore note)."""
    if _ACTIVE is None:
        print(_DISABLED)
        return
    report = _ACTIVE.flush()
    print(
        f"budgethub: {len(report['saved'])} variables saved ({report['bytes'] / 2**20:.1f} MiB)"
        f" in {_ACTIVE.checkpointer.directory}"
    )
    for name, what in report["reopened"].items():
        print(f"  {name}: {what}")
    for name, why in report["unsaved"].items():
        print(f"  not saved: {name} ({why})")
    if _ACTIVE.note:
        print(_ACTIVE.note)


def load_ipython_extension(shell: Any) -> None:
    global _ACTIVE, _DISABLED
    budgethub_usersite.ensure()
    if _ACTIVE is not None and _ACTIVE.shell is shell:
        return
    if os.environ.get("BUDGETHUB_CHECKPOINT", "1") == "0":
        _DISABLED = "checkpoints are off in this kernel (BUDGETHUB_CHECKPOINT=0)"
        return
    notebook = notebook_path()
    if notebook is None:
        _DISABLED = "this kernel belongs to no notebook (JPY_SESSION_NAME is not set)"
        return
    ext = Extension(shell, notebook)
    _ACTIVE = ext
    shell.events.register("pre_run_cell", ext.pre_run_cell)
    shell.events.register("post_run_cell", ext.post_run_cell)
    shell.register_magic_function(_magic, "line", "budgethub_checkpoint")
    ext.restore()


def unload_ipython_extension(shell: Any) -> None:
    global _ACTIVE
    if _ACTIVE is None or _ACTIVE.shell is not shell:
        return
    shell.events.unregister("pre_run_cell", _ACTIVE.pre_run_cell)
    shell.events.unregister("post_run_cell", _ACTIVE.post_run_cell)
    _ACTIVE.close()
    _ACTIVE = None
