"""Restore fidelity: what a namespace's variables are, in a form two kernels can compare.

:func:`describe` runs inside a kernel (before the checkpoint, and after the restore
in a fresh kernel) and returns JSON: each variable's type and value, walked into
containers, instances, closures and partials, and the identity relations among
everything it met (``b is a[0]``, ``v.base is a``, two arrays sharing memory, a
cycle). Two descriptions are equal when the variables came back equal, with their
relations. The property test (tests/unit/test_restore_fidelity.py) and
``bench.restore_fidelity`` generate the variables with hypothesis (:func:`programs`).

Identity is compared for mutable objects, tuples and frozensets (not for numbers,
strings and bytes, whose identity Python itself interns at will); an array's
``.base`` is compared by identity only (a restored array's memory belongs to the
restored buffer, not to itself, which ``.base`` shows but no value does).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import io
import json
import sys
import time
import types
from collections.abc import Callable
from typing import Any

__all__ = ["HEADER", "Outcome", "Program", "check", "describe", "describe_json", "programs"]

LIMIT = 20_000  # nodes described per namespace
_ATOMS = (int, float, complex, str, bytes, bool, type(None))
_NO_IDENTITY = (int, float, complex, str, bytes, bool, type(None), range, slice)


class _Walker:
    def __init__(self) -> None:
        self.seen: dict[int, str] = {}
        self.keep: list[Any] = []  # what was met stays alive: ids are not reused
        self.relations: list[list[str]] = []
        self.arrays: list[tuple[str, Any]] = []
        self.count = 0

    def identity(self, obj: Any, path: str) -> bool:
        """Record ``obj`` met at ``path``; True when it was met before (not described)."""
        if isinstance(obj, _NO_IDENTITY) or (type(obj) in (tuple, frozenset) and not obj):
            return False
        first = self.seen.get(id(obj))
        if first is not None:
            self.relations.append([path, first])
            return True
        self.seen[id(obj)] = path
        self.keep.append(obj)
        return False

    def walk(self, obj: Any, path: str) -> Any:
        self.count += 1
        if self.count > LIMIT:
            return ["cut"]
        if isinstance(obj, float) and obj != obj:
            return ["float", "nan"]
        if isinstance(obj, _ATOMS):
            return [type(obj).__name__, repr(obj)]
        if self.identity(obj, path):
            return ["same", self.seen[id(obj)]]
        return self.node(obj, path)

    def node(self, obj: Any, path: str) -> Any:
        t = type(obj)
        name = f"{t.__module__}.{t.__qualname__}"
        if t in (list, tuple):
            return [name, [self.walk(v, f"{path}[{i}]") for i, v in enumerate(obj)]]
        if t is dict:
            return [name, [[repr(k), self.walk(v, f"{path}[{k!r}]")] for k, v in obj.items()]]
        if t in (set, frozenset):
            return [name, sorted(repr(v) for v in obj)]
        np = sys.modules.get("numpy")
        if np is not None and t is np.ndarray:
            return self.array(obj, path, np)
        pd = sys.modules.get("pandas")
        if pd is not None and isinstance(obj, pd.DataFrame | pd.Series | pd.Index):
            return [name, _pandas(obj)]
        if isinstance(obj, enum.Enum):
            return [name, obj.name, self.walk(obj.value, f"{path}.value")]
        if isinstance(obj, functools.partial):
            return [
                name,
                self.walk(obj.func, f"{path}.func"),
                self.walk(obj.args, f"{path}.args"),
                self.walk(obj.keywords, f"{path}.keywords"),
            ]
        if isinstance(obj, types.FunctionType):
            return self.function(obj, path)
        if isinstance(obj, io.IOBase):
            return [name, _file(obj)]
        if t.__module__ == "__main__":
            return self.instance(obj, path)
        text = repr(obj)
        return [name, text if " at 0x" not in text else ""]

    def array(self, a: Any, path: str, np: Any) -> Any:
        self.arrays.append((path, a))
        if isinstance(a.base, np.ndarray):
            self.identity(a.base, f"{path}.base")  # identity only (see the docstring)
        value = a.tolist() if a.size <= 1000 and not a.dtype.hasobject else None
        if value is None:
            value = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
        return ["ndarray", a.dtype.str, list(a.shape), bool(a.flags.writeable), repr(value)]

    def function(self, f: types.FunctionType, path: str) -> Any:
        cells = [
            self.walk(c.cell_contents, f"{path}.__closure__[{i}]")
            for i, c in enumerate(f.__closure__ or ())
        ]
        code = hashlib.sha256(f.__code__.co_code).hexdigest()[:16]
        return [
            "function",
            f.__qualname__,
            code,
            self.walk(f.__defaults__, f"{path}.defaults"),
            cells,
        ]

    def instance(self, obj: Any, path: str) -> Any:
        t = type(obj)
        self.identity(t, f"{path}.__class__")
        attrs: list[Any] = []
        slots = [
            s
            for k in t.__mro__
            for s in (
                [k.__dict__["__slots__"]]
                if isinstance(k.__dict__.get("__slots__"), str)
                else k.__dict__.get("__slots__", ())
            )
            if s not in ("__dict__", "__weakref__")
        ]
        for s in slots:
            if hasattr(obj, s):
                attrs.append([s, self.walk(getattr(obj, s), f"{path}.{s}")])
        has_dict = hasattr(obj, "__dict__")
        if has_dict:
            for k, v in vars(obj).items():
                attrs.append([k, self.walk(v, f"{path}.{k}")])
        props = []
        for k, v in vars(t).items():
            if isinstance(v, property):
                props.append([k, self.walk(getattr(obj, k), f"{path}.{k}()")])
        return [f"__main__.{t.__qualname__}", has_dict, attrs, props]


def _pandas(obj: Any) -> Any:
    pd = sys.modules["pandas"]
    frame = obj.to_frame() if isinstance(obj, pd.Series | pd.Index) else obj
    dtypes = [str(d) for d in frame.dtypes]
    index = repr(list(frame.index)) + repr(frame.index.names) + str(type(frame.index))
    hashed = pd.util.hash_pandas_object(frame, index=True).tolist()
    return [dtypes, repr(list(frame.columns)), index, hashed, repr(getattr(obj, "name", None))]


def _file(f: Any) -> Any:
    if f.closed:
        return [getattr(f, "name", None), getattr(f, "mode", None), "closed"]
    return [getattr(f, "name", None), getattr(f, "mode", None), f.tell() if f.seekable() else None]


def describe(namespace: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The variables ``names`` of ``namespace`` and their relations (see the module)."""
    w = _Walker()
    values = {n: w.walk(namespace[n], n) for n in sorted(names) if n in namespace}
    np = sys.modules.get("numpy")
    shares = []
    if np is not None:
        arrays = w.arrays[:80]
        for i, (p, a) in enumerate(arrays):
            for q, b in arrays[i + 1 :]:
                if np.shares_memory(a, b):
                    shares.append([p, q])
    return {"values": values, "relations": sorted(w.relations), "shares": shares}


def describe_json(namespace: dict[str, Any], names: list[str]) -> str:
    return json.dumps(describe(namespace, names), sort_keys=True)


# --- generated namespaces ----------------------------------------------------------

HEADER = """\
import dataclasses, enum, functools, threading, os
import numpy as np
import pandas as pd
from decimal import Decimal
from fractions import Fraction
from datetime import datetime, timedelta, timezone


@dataclasses.dataclass
class Point:
    x: object
    y: object = None


@dataclasses.dataclass(frozen=True, slots=True)
class Frozen:
    a: object


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b


class Bag:
    def __init__(self, items):
        self._items = items

    @property
    def size(self):
        return len(self._items) if isinstance(self._items, (list, dict, tuple)) else -1


class Color(enum.Enum):
    RED = 1
    GREEN = "g"


def make_adder(k):
    def add(x):
        return (x, k)
    return add


def scale(k, x=2):
    return (k, x)


with open("fidelity-data.txt", "w") as _data:
    _data.write("first\\nsecond\\nthird\\n")
"""


@dataclasses.dataclass
class Program:
    """A cell that binds the variables ``names``; ``unsaved``: those that cannot be kept
    (a generator, a lock, a pipe, or a value holding one), to be named in the report."""

    lines: list[str]
    names: list[str]
    unsaved: set[str]
    files: set[str] = dataclasses.field(default_factory=set)  # open files: reopened
    holds: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    header: str = HEADER

    def taint(self, bad: set[str]) -> None:
        """``unsaved``: the bad variables and every variable that holds one (or is one)."""
        out = set(bad)
        while True:
            more = {n for n, held in self.holds.items() if held & out} - out
            if not more:
                break
            out |= more
        self.unsaved = out

    def source(self) -> str:
        return self.header + "\n" + "\n".join(self.lines) + "\n"


def _float_src(x: float) -> str:
    if x != x:
        return "float('nan')"
    if x in (float("inf"), float("-inf")):
        return f"float('{x}')"
    return repr(x)


def _atoms(st: Any) -> Any:
    return st.one_of(
        st.integers(-(2**70), 2**70).map(repr),
        st.floats().map(_float_src),
        st.text(max_size=6).map(repr),
        st.binary(max_size=6).map(repr),
        st.sampled_from(["True", "False", "None", "()"]),
        st.tuples(st.integers(-5, 5), st.integers(-5, 5)).map(lambda t: f"complex{t}"),
        st.decimals(allow_nan=False, allow_infinity=False, places=2).map(
            lambda d: f"Decimal({str(d)!r})"
        ),
        st.fractions(max_denominator=40).map(lambda f: f"Fraction({f.numerator}, {f.denominator})"),
        st.tuples(st.integers(-12, 12), st.integers(1, 28)).map(
            lambda t: f"datetime(2024, 3, {t[1]}, 9, tzinfo=timezone(timedelta(hours={t[0]})))"
        ),
    )


_KINDS = ("atom", "list", "tuple", "dict", "set", "array", "df", "series", "obj", "func")
_ARRAY = ("np.arange({n}).astype('{dt}')", "np.asfortranarray(np.arange({n}).astype('{dt}'))")
_VIEWS = ("{a}[{i}:{j}:{k}]", "{a}.T", "{a}[::-1]", "{a}[..., :1]", "{a}.reshape(-1)")
_OBJS = ("Point({e}, {f})", "Frozen({e})", "Slotted({e}, {f})", "Bag({e})", "Color.RED")
_FUNCS = ("make_adder({e})", "functools.partial(scale, {e})", "lambda x: (x, {e})")
_BAD = (
    "(i for i in range(3))",
    "threading.Lock()",
    "open(os.pipe()[0])",
)
_FILES = ("open('fidelity-data.txt')", "open('fidelity-data.txt', 'rb')", "open('fid.log', 'a+')")


def programs(max_vars: int = 12) -> Any:
    """A hypothesis strategy of :class:`Program` (hypothesis is imported here: the test
    and bench environments have it, the session image need not)."""
    from hypothesis import strategies as st

    atoms = _atoms(st)

    @st.composite
    def build(draw: Any) -> Program:
        p = Program([], [], set())
        kinds: dict[str, str] = {}
        bad: set[str] = set()
        for i in range(draw(st.integers(1, max_vars))):
            name = f"v{i}"
            extra = ["alias", "bad", "file"] if p.names else ["bad", "file"]
            extra += ["view", "view"] if "array" in kinds.values() else []
            extra += ["column"] if "df" in kinds.values() else []
            chosen = draw(st.sampled_from(_KINDS + tuple(extra)))
            expr, kind = _expr(draw, st, atoms, p, kinds, chosen)
            p.lines.append(f"{name} = {expr}")
            refs = set() if expr.startswith("lambda") else set(_refs(expr, p.names))
            p.holds[name] = refs
            if chosen == "alias":  # the same object: what one holds, the other does
                p.holds[expr].add(name)
            if kind == "bad":
                bad.add(name)
            if kind == "file" and chosen != "alias":
                p.lines.append(f"{name}.readline() if {name}.readable() else {name}.write('x\\n')")
            if kind == "file":
                p.files.add(name)
            p.names.append(name)
            kinds[name] = kind
        for _ in range(draw(st.integers(0, 3))):  # cross references and cycles
            _mutate(draw, st, atoms, p, kinds)
        p.taint(bad)
        return p

    return build()


def _refs(expr: str, names: list[str]) -> list[str]:
    import re

    return [n for n in re.findall(r"\bv\d+\b", expr) if n in names]


def _elem(draw: Any, st: Any, atoms: Any, p: Program) -> str:
    if p.names and draw(st.booleans()):
        return str(draw(st.sampled_from(p.names)))
    return str(draw(atoms))


def _expr(
    draw: Any, st: Any, atoms: Any, p: Program, kinds: dict[str, str], kind: str
) -> tuple[str, str]:
    def e() -> str:
        return _elem(draw, st, atoms, p)

    small = st.integers(0, 4)
    if kind == "atom":
        return draw(atoms), kind
    if kind == "alias":
        ref = draw(st.sampled_from(p.names))
        return ref, kinds[ref]
    if kind in ("list", "tuple"):
        items = ", ".join(e() for _ in range(draw(small)))
        return (f"[{items}]" if kind == "list" else f"({items},)" if items else "()"), kind
    if kind == "dict":
        keys = draw(st.lists(st.one_of(st.integers(-9, 9), st.text(max_size=3)), max_size=4))
        return "{" + ", ".join(f"{k!r}: {e()}" for k in keys) + "}", kind
    if kind == "set":
        items = ", ".join(draw(atoms) for _ in range(draw(small)))
        wrap = draw(st.sampled_from(["set([{}])", "frozenset([{}])"]))
        return wrap.format(items), kind
    if kind == "array":
        rows, cols = draw(small), draw(st.integers(1, 4))
        dt = draw(st.sampled_from(["float64", "int32", "complex128", "bool", "uint8"]))
        base = draw(st.sampled_from(_ARRAY)).format(n=rows * cols, dt=dt)
        return (f"{base}.reshape({rows}, {cols})" if draw(st.booleans()) else base), "array"
    if kind == "view":
        a = draw(st.sampled_from([n for n, k in kinds.items() if k == "array"]))
        i, j, k = draw(small), draw(small), draw(st.sampled_from([1, 2, -1]))
        return draw(st.sampled_from(_VIEWS)).format(a=a, i=i, j=j, k=k), "array"
    if kind == "df":
        n = draw(small)
        ints = draw(st.lists(st.integers(-99, 99), min_size=n, max_size=n))
        flts = draw(st.lists(st.floats(allow_infinity=False), min_size=n, max_size=n))
        cats = draw(st.lists(st.sampled_from("xyz"), min_size=n, max_size=n))
        df = (
            f"pd.DataFrame({{'a': {ints!r}, 'b': [{', '.join(map(_float_src, flts))}], "
            f"'c': pd.Categorical({cats!r})}})"
        )
        return (df + ".set_index(['a', 'c'])" if draw(st.booleans()) else df), "df"
    if kind == "series":
        flts = draw(st.lists(st.floats(allow_infinity=False), max_size=4))
        return f"pd.Series([{', '.join(map(_float_src, flts))}], name='s', dtype='float64')", kind
    if kind == "column":
        df = draw(st.sampled_from([n for n, k in kinds.items() if k == "df"]))
        return f"{df}['b']", "series"
    if kind == "obj":  # the kind says which can take an attribute later (_mutate)
        template = draw(st.sampled_from(_OBJS))
        mutable = "attr" if template[0] in "PB" else "slot" if template[0] == "S" else kind
        return template.format(e=e(), f=e()), mutable
    if kind == "func":
        return draw(st.sampled_from(_FUNCS)).format(e=e()), kind
    if kind == "bad":
        return draw(st.sampled_from(_BAD)), kind
    return draw(st.sampled_from(_FILES)), "file"


def _mutate(draw: Any, st: Any, atoms: Any, p: Program, kinds: dict[str, str]) -> None:
    targets = [n for n, k in kinds.items() if k in ("list", "dict", "attr", "slot")]
    if not targets:
        return
    target = draw(st.sampled_from(targets))
    value = _elem(draw, st, atoms, p)
    # Each mutation keeps what the place held before (in a pair with the new value): the
    # model only adds to what a variable holds, so a replaced reference must stay held.
    if kinds[target] == "list":
        line = f"{target}.append({value})"
    elif kinds[target] == "dict":
        line = f"{target}['m'] = ({target}.get('m'), {value})"
    elif kinds[target] == "attr":  # a dataclass or a class with a property
        line = f"{target}.extra = (getattr({target}, 'extra', None), {value})"
    else:
        line = f"{target}.b = ({target}.b, {value})"
    p.lines.append(line)
    if value in p.holds:  # (an alias holds its target and the target it: both taint)
        p.holds[target].add(value)


# --- one example: defined in a kernel, checkpointed, restored into a fresh one --------


@dataclasses.dataclass
class Outcome:
    names: list[str]  # the variables generated
    not_kept: dict[str, str]  # named in the checkpoint report: name -> why
    reopened: list[str]  # open files the restore note says were reopened
    mismatches: list[str]  # what differs (none: the property holds)
    seconds: float  # checkpoint request -> the restored kernel's first cell answered


def _diff(before: dict[str, Any], after: dict[str, Any], names: list[str]) -> list[str]:
    out = []
    for n in names:
        a, b = before["values"].get(n), after["values"].get(n)
        if a != b:
            out.append(f"{n}: {json.dumps(a)[:300]} -> {json.dumps(b)[:300]}")
    for key in ("relations", "shares"):
        lost = [r for r in before[key] if r not in after[key]]
        new = [r for r in after[key] if r not in before[key]]
        if lost or new:
            out.append(f"{key}: lost {lost[:8]}, new {new[:8]}")
    return out


def check(
    first: Any,
    second: Any,
    program: Program,
    path: str,
    probe: Callable[[Any], None] | None = None,
) -> Outcome:
    """Run ``program`` in a kernel of ``first``, checkpoint it with the agent, restore it
    into a fresh kernel of ``second`` (whose restore folder is ``first``'s state) and
    compare (harness Servers sharing one root folder). ``probe`` gets the restored
    kernel after the comparison, before it stops."""
    keep = [n for n in program.names if n not in program.unsaved]
    expr = (
        "__import__('budgethub_session.fidelity', fromlist=['describe_json'])"
        f".describe_json(globals(), {keep!r})"
    )
    first.create_notebook(path)
    ka = first.open_notebook(path)
    try:
        ka.ok(program.source())
        before = json.loads(ka.expression(expr))
        t0 = time.perf_counter()
        status, report = first.agent("POST", "checkpoint", {"within": 60})
        if status != 200:
            raise AssertionError(f"checkpoint: {status} {report}")
        entry = next(k for k in report["kernels"] if k["kernel_id"] == ka.kernel_id)
    finally:
        first.shutdown(ka)
    kb = second.open_notebook(path)
    try:
        note = kb.ok("None").stdout
        seconds = time.perf_counter() - t0
        after = json.loads(kb.expression(expr))
        present = kb.expression(f"[n for n in {program.names!r} if n in globals()]")
        if probe is not None:
            probe(kb)
    finally:
        second.shutdown(kb)
    mismatches = [] if entry["state"] == "saved" else [f"checkpoint: {entry}"]
    mismatches += _diff(before, after, keep)
    unsaved = entry.get("unsaved") or {}
    for n in program.names:
        expected = n in program.unsaved
        if expected != (n in unsaved):
            why = unsaved.get(n, "saved")
            mismatches.append(f"{n}: {'kept' if not expected else 'not kept'} expected, {why}")
        if expected and (n in present or f"{n} (" not in note):
            mismatches.append(f"{n}: not kept, but not named in the restore note: {note!r}")
        if not expected and n not in present:
            mismatches.append(f"{n}: saved but not restored: {note!r}")
    reopened = [n for n in program.files if n not in program.unsaved and f"{n} (file " in note]
    missing = program.files - program.unsaved - set(reopened)
    if missing:
        mismatches.append(f"open files not said to be reopened: {sorted(missing)}: {note!r}")
    return Outcome(program.names, dict(unsaved), reopened, mismatches, seconds)
