"""A kernel's checkpoint: its user namespace saved per group of variables that share
references, and loaded back.

In the Hub's words (docs/snapshots.md) a *checkpoint* is what a kernel writes (after
every cell, and when the agent asks before a preemption); a *snapshot* is the saved
state the Hub keeps and restores. No IPython here: :class:`Checkpointer` takes a
namespace dict, and the IPython extension (:mod:`budgethub_session.snapshot`) feeds
it after every cell.

Serializer: cloudpickle with pickle protocol 5. It pickles lambdas, functions and
classes defined in cells by value (plain pickle cannot; dill can too, but it is
slower, patches the pickle registry globally and has no out-of-band buffers), and
protocol 5 hands numpy/pandas buffers out of band, so a 200 MB array is hashed and
written without a copy. Two changes to cloudpickle's defaults: a function defined
in a cell keeps the live user namespace as its globals after a restore (cloudpickle
would give it a private copy of the globals it uses), and torch tensors go through
host memory and come back with a ``map_location`` that fits the new node.

Change detection: a group is re-serialized only when one of its members may have
changed (rebound, or named by the cell, or used by a function the cell names: the
caller decides), and rewritten only when the hash of its bytes (xxh3-128; sha256
without xxhash) differs from the last write. ``save(None)`` (the agent's final
flush) looks at every variable.
Groups: variables whose object graphs share a mutable object (``b = a``, a view of
an array, a list holding a DataFrame that is also a variable) are pickled together,
so the sharing survives the restore.

Fidelity (issue 42): an open file is reopened at restore at its path, mode and
position (never turned into a copy of its contents; pipes, sockets and deleted
files are named as not kept), a cell-defined class keeps its ``__slots__``, and a
numpy view shared within a group is rebuilt on its restored owner, so ``v.base is
a`` still holds. A readable text file's position is read only on the kernel's
thread (the agent's flush): ``TextIOWrapper.tell`` works its decoder, which a
running cell may be using; the background saves leave such a group to the flush.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import io
import json
import os
import pickle
import stat
import struct
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

try:  # xxh3 hashes ~7x faster than sha256 here; change detection needs no crypto
    import xxhash

    def _hasher() -> Any:
        return xxhash.xxh3_128()

    _HASH = "xxh3"
except ImportError:  # pragma: no cover - the images and the venv have xxhash

    def _hasher() -> Any:
        return hashlib.sha256()

    _HASH = "sha256"

__all__ = [
    "Checkpointer",
    "SaveResult",
    "load_manifest",
    "load_namespace",
    "read_group",
    "type_name",
]

MAGIC = b"BHCKPT1\n"
MANIFEST = "manifest.json"
NICE = 19  # the background saves' priority (Linux; setpriority on the thread)
WALK_LIMIT = 100_000  # objects visited per variable when looking for shared references


def type_name(obj: object) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


# --- the pickler -----------------------------------------------------------------


class _UserNamespace:
    """Stands for the live user namespace in a pickle (see _user_namespace)."""

    __slots__ = ()


_NS_PLACEHOLDER = _UserNamespace()
_load_lock = threading.Lock()
_load_ns: dict[str, Any] | None = None


def _user_namespace() -> dict[str, Any]:
    """At load time: the namespace being restored into (functions' globals)."""
    return _load_ns if _load_ns is not None else {}


MAP_LOCATION: str | None = None
"""Where restored torch tensors go; None: $BUDGETHUB_MAP_LOCATION, else what fits."""


def _target_device(saved: str) -> str:
    wanted = MAP_LOCATION or os.environ.get("BUDGETHUB_MAP_LOCATION")
    if wanted:
        return wanted
    if not saved.startswith("cuda"):
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    index = int(saved.split(":", 1)[1]) if ":" in saved else 0
    return f"cuda:{index}" if index < torch.cuda.device_count() else "cuda:0"


def _rebuild_tensor(
    data: Any, dtype: str, shape: tuple[int, ...], device: str, requires_grad: bool, param: bool
) -> Any:
    import torch

    flat = torch.from_numpy(data) if not isinstance(data, bytes | bytearray) else None
    if flat is None:
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    tensor = flat.view(getattr(torch, dtype)).reshape(shape).to(_target_device(device))
    if param:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def _reduce_tensor(obj: Any) -> Any:
    """A dense tensor as (its bytes in host memory, dtype, shape, device)."""
    torch = sys.modules["torch"]
    if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta":
        return NotImplemented
    host = obj.detach().to("cpu").contiguous()
    flat = host.reshape(-1).view(torch.uint8)
    try:
        data: Any = flat.numpy()  # out of band, no copy
    except Exception:  # torch built without numpy
        data = bytes(flat.untyped_storage())
    return (
        _rebuild_tensor,
        (
            data,
            str(obj.dtype).removeprefix("torch."),
            tuple(obj.shape),
            str(obj.device),
            bool(obj.requires_grad),
            isinstance(obj, torch.nn.Parameter),
        ),
    )


def _rebuild_view(
    root: Any, shape: Any, dtype: Any, offset: int, strides: Any, writeable: bool = True
) -> Any:
    import numpy as np

    view = np.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)
    if not writeable and view.flags.writeable:
        view.flags.writeable = False
    return view


def _rebuild_root(data: Any, dtype: Any, shape: Any, order: Any, writeable: bool) -> Any:
    """An array on the buffer itself (numpy's own reduce adds a hidden reshape view, so
    a view rebuilt on it would have that view, not the variable, as its ``.base``)."""
    import numpy as np

    if isinstance(data, pickle.PickleBuffer):
        data = data.raw()
    array = np.ndarray(shape, dtype, buffer=data, order=order)
    if not writeable and array.flags.writeable:
        array.flags.writeable = False
    return array


def _array_root(a: Any, ndarray: type) -> Any:
    while isinstance(a.base, ndarray):
        a = a.base
    return a


def _bufferable(a: Any) -> bool:
    """Can views of ``a`` be rebuilt on its buffer (``np.ndarray(buffer=a)``)?"""
    return not a.dtype.hasobject and bool(a.flags.c_contiguous or a.flags.f_contiguous)


# --- open files: reopened at restore, never turned into something else ----------

_FILE_TYPES = (io.TextIOWrapper, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.FileIO)
_STD_STREAMS = ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__")


class DeferredToFlush(pickle.PicklingError):
    """A background save met a readable text file: its position is read by the flush."""


class NotReopened:
    """Stands for a file that could not be reopened at restore (the variable is dropped)."""

    __slots__ = ("spec", "why")

    def __init__(self, spec: dict[str, Any], why: str) -> None:
        self.spec, self.why = spec, why


_reopen_failures: list[NotReopened] = []  # filled during read_group, under _load_lock


def _raw_file(obj: Any) -> Any:
    f = obj.buffer if isinstance(obj, io.TextIOWrapper) else obj
    return f if isinstance(f, io.FileIO) else f.raw


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def file_spec(obj: Any, background: bool = False) -> dict[str, Any]:
    """How to reopen ``obj`` (path, mode, position, text settings), or PicklingError why not."""
    raw = _raw_file(obj)
    name = raw.name
    if not isinstance(name, str):
        raise pickle.PicklingError(
            f"opened from file descriptor {name}, not a path: it cannot be reopened"
        )
    text = isinstance(obj, io.TextIOWrapper)
    spec: dict[str, Any] = {
        "kind": "text" if text else "raw" if isinstance(obj, io.FileIO) else "buffered",
        "name": name,
        "path": os.path.abspath(name),
        "mode": getattr(obj, "mode", None) or raw.mode.replace("b", ""),
        "closed": obj.closed,
        "position": None,
    }
    if text:
        spec.update(
            encoding=obj.encoding,
            errors=obj.errors,
            line_buffering=obj.line_buffering,
            write_through=obj.write_through,
        )
    if obj.closed:
        return spec
    fd = raw.fileno()
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise pickle.PicklingError(f"{name} is {_file_kind(st.st_mode)}: it cannot be reopened")
    if st.st_nlink == 0:
        raise pickle.PicklingError(f"{name} was deleted while open: it cannot be reopened")
    try:  # the file itself, even if renamed since, and whatever the cwd was
        spec["path"] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    if background and text and obj.readable():
        raise DeferredToFlush(name)
    if obj.seekable():
        try:
            spec["position"] = obj.tell()
        except OSError as error:
            raise pickle.PicklingError(f"{name}: its position cannot be read ({error})") from None
    return spec


def describe_file(spec: dict[str, Any]) -> str:
    if spec["closed"]:
        return f"file {spec['name']} (closed, mode {spec['mode']!r}): comes back closed"
    return (
        f"file {spec['path']} (mode {spec['mode']!r}, position {spec['position']}): "
        "reopened at restore"
    )


def _open_file(spec: dict[str, Any]) -> Any:
    mode = spec["mode"]
    if spec["closed"]:  # same type, name and mode, closed: no need for the path
        fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    else:
        if "+" in mode:
            flags = os.O_RDWR
        elif any(c in mode for c in "wxa"):
            flags = os.O_WRONLY
        else:
            flags = os.O_RDONLY
        if "a" in mode:
            flags |= os.O_APPEND
        # Never O_CREAT, O_TRUNC or O_EXCL: the file is reopened as it is, not emptied.
        fd = os.open(spec["path"], flags | os.O_CLOEXEC)
    try:
        f = open(  # noqa: SIM115 - the restored variable owns it
            fd,
            mode,
            buffering=0 if spec["kind"] == "raw" else -1,
            encoding=spec.get("encoding"),
            errors=spec.get("errors"),
        )
    except BaseException:
        os.close(fd)
        raise
    _raw_file(f).name = spec["name"]
    if spec["kind"] == "text" and (spec["line_buffering"] or spec["write_through"]):
        f.reconfigure(line_buffering=spec["line_buffering"], write_through=spec["write_through"])
    if spec["closed"]:
        f.close()
    elif spec["position"] is not None:
        f.seek(spec["position"])
    return f


def _reopen_file(spec: dict[str, Any]) -> Any:
    """At load: the file reopened, or a NotReopened that drops the variables holding it."""
    try:
        return _open_file(spec)
    except Exception as error:
        failed = NotReopened(spec, f"{type(error).__name__}: {error}")
        _reopen_failures.append(failed)
        return failed


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    def __init__(
        self,
        file: Any,
        namespace: dict[str, Any] | None,
        buffer_callback: Any,
        roots: set[int] = frozenset(),  # type: ignore[assignment]
        files: list[tuple[int, dict[str, Any]]] | None = None,
        background: bool = False,
    ) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self._namespace = namespace
        self._roots = roots
        self._files = files if files is not None else []
        self._background = background
        if namespace is not None:
            # Functions whose globals are the user namespace share one stand-in,
            # pickled as a call to _user_namespace(): the live namespace on load.
            self.globals_ref[id(namespace)] = _NS_PLACEHOLDER

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        reduced = super()._dynamic_function_reduce(func)
        if self._namespace is not None and func.__globals__ is self._namespace:
            reduced[2][1]["__globals__"] = {}  # looked up live, not copied
        return reduced

    def _array_reduce(self, obj: Any, np: Any) -> Any:
        if isinstance(obj.base, np.ndarray):
            # A view of an array shared in this group stays a view of it (numpy
            # alone would pickle a copy).
            root = _array_root(obj, np.ndarray)
            if id(root) in self._roots and _bufferable(root):
                start = obj.__array_interface__["data"][0]
                offset = start - root.__array_interface__["data"][0]
                return (
                    _rebuild_view,
                    (root, obj.shape, obj.dtype, offset, obj.strides, bool(obj.flags.writeable)),
                )
        elif id(obj) in self._roots and _bufferable(obj):
            order = "C" if obj.flags.c_contiguous else "F"
            data = pickle.PickleBuffer(obj)
            return (_rebuild_root, (data, obj.dtype, obj.shape, order, bool(obj.flags.writeable)))
        return NotImplemented

    def reducer_override(self, obj: Any) -> Any:
        if obj is _NS_PLACEHOLDER:
            return (_user_namespace, ())
        t = type(obj)
        torch = sys.modules.get("torch")
        if torch is not None and t in (torch.Tensor, torch.nn.Parameter):
            return _reduce_tensor(obj)
        if self._roots and t.__name__ == "ndarray" and t is sys.modules["numpy"].ndarray:
            reduced = self._array_reduce(obj, sys.modules["numpy"])
            if reduced is not NotImplemented:
                return reduced
        if t in _FILE_TYPES:  # cloudpickle would turn it into a StringIO of its contents
            for attr in _STD_STREAMS:
                if obj is getattr(sys, attr, None):
                    return (getattr, (sys, attr))
            spec = file_spec(obj, self._background)
            self._files.append((id(obj), spec))
            return (_reopen_file, (spec,))
        reduced = super().reducer_override(obj)
        if (
            isinstance(obj, type)
            and isinstance(reduced, tuple)
            and reduced[0] is cloudpickle.cloudpickle._make_skeleton_class
            and "__slots__" in obj.__dict__
        ):
            # cloudpickle builds the class without its __slots__ and the instances
            # come back with a __dict__; the skeleton gets them (and their descriptors).
            reduced[1][3]["__slots__"] = obj.__dict__["__slots__"]
        return reduced


def serialize(
    values: dict[str, Any],
    namespace: dict[str, Any] | None,
    roots: set[int] | None = None,
    files: list[tuple[int, dict[str, Any]]] | None = None,
    background: bool = False,
) -> tuple[memoryview, list[memoryview], str]:
    """(pickle bytes, out-of-band buffers, a hash of both) of a group.

    ``roots``: ids of the arrays owning memory that two arrays of the group use (their
    views stay views); None: those among the top-level values. ``files`` collects the
    open files met, as (id, how to reopen it).
    """
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    np = sys.modules.get("numpy")
    if roots is None:
        roots = set()
        if np is not None and len(values) > 1:
            counts: dict[int, int] = {}
            for v in values.values():
                if type(v) is np.ndarray:
                    r = id(_array_root(v, np.ndarray))
                    counts[r] = counts.get(r, 0) + 1
            roots = {r for r, n in counts.items() if n > 1}
    _Pickler(out, namespace, buffers.append, roots, files, background).dump(values)
    data = out.getbuffer()
    raws = [b.raw() for b in buffers]
    digest = _hasher()
    digest.update(data)
    for raw in raws:
        digest.update(raw)
    return data, raws, f"{_HASH}:{digest.hexdigest()[:32]}"


def _open_private(path: Path) -> io.BufferedWriter:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "wb")


def write_group(
    path: Path, data: memoryview, raws: list[memoryview], names: list[str], fsync: bool
) -> int:
    header = json.dumps(
        {"names": names, "pickle": data.nbytes, "buffers": [r.nbytes for r in raws]}
    ).encode()
    tmp = path.with_name(path.name + ".tmp")
    with _open_private(tmp) as f:
        f.write(MAGIC)
        f.write(struct.pack("<I", len(header)))
        f.write(header)
        f.write(data)
        for raw in raws:
            f.write(raw)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
        size = f.tell()
    os.replace(tmp, path)
    return size


def _read_exact(f: io.BufferedReader, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = f.readinto(view[got:])
        if not n:
            raise EOFError(f"{f.name}: truncated ({got} of {size} bytes)")
        got += n
    return buf


_REBUILDERS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (_user_namespace, _rebuild_tensor, _rebuild_view, _rebuild_root, _reopen_file)
}
"""What a group file's pickle calls by name in this module."""

_FORMER_MODULE = "budgethub_session.snapshot"
"""This module's name before it was renamed (the IPython extension's name now): the
group files of a checkpoint written then name its rebuild functions there."""


class _Unpickler(pickle.Unpickler):
    """Finds this module's rebuild functions under its former name too, so a snapshot
    taken by an image of the earlier version still restores."""

    def find_class(self, module: str, name: str) -> Any:
        if module == _FORMER_MODULE and name in _REBUILDERS:
            return _REBUILDERS[name]
        return super().find_class(module, name)


def read_group(
    path: Path, namespace: dict[str, Any], failed: list[NotReopened] | None = None
) -> dict[str, Any]:
    """The variables of one group file; functions in it get ``namespace`` as globals.

    ``failed`` collects the files that could not be reopened (their stand-ins are in
    the values: the caller drops the variables holding them).
    """
    global _load_ns
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{path}: not a budgethub checkpoint file")
        (n,) = struct.unpack("<I", f.read(4))
        header = json.loads(f.read(n))
        data = _read_exact(f, header["pickle"])
        buffers = [_read_exact(f, size) for size in header["buffers"]]
    builtins = namespace.get("__builtins__")
    with _load_lock:
        _load_ns = namespace
        _reopen_failures.clear()
        try:
            values = _Unpickler(io.BytesIO(data), buffers=buffers).load()
        finally:
            _load_ns = None
            if failed is not None:
                failed.extend(_reopen_failures)
            _reopen_failures.clear()
            if builtins is not None:  # cloudpickle's setstate resets it
                namespace["__builtins__"] = builtins
            else:
                namespace.pop("__builtins__", None)
    if not isinstance(values, dict):
        raise ValueError(f"{path}: holds a {type_name(values)}, not a group of variables")
    return values


def load_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        with open(directory / MANIFEST, encoding="utf-8") as f:
            manifest = json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("variables"), dict):
        raise ValueError(f"{directory / MANIFEST}: not a budgethub manifest")
    return manifest


@dataclass
class LoadResult:
    restored: list[str] = field(default_factory=list)
    not_restored: dict[str, str] = field(default_factory=dict)  # name: "type: why"
    reopened: dict[str, str] = field(default_factory=dict)  # name: "file ...: reopened"
    bytes: int = 0
    seconds: float = 0.0


def _holds(value: Any, targets: set[int]) -> NotReopened | None:
    """The stand-in of a file not reopened that ``value`` reaches, if any (bounded walk)."""
    seen: set[int] = set()
    stack = [value]
    while stack and len(seen) < WALK_LIMIT:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _ATOMIC) or isinstance(o, type | types.ModuleType):
            continue
        seen.add(id(o))
        if id(o) in targets:
            return o  # type: ignore[no-any-return]
        stack.extend(gc.get_referents(o))
    return None


def _drop_unopened(
    values: dict[str, Any], failed: list[NotReopened], kinds: dict[str, str]
) -> dict[str, str]:
    """Variables that hold a file that could not be reopened: name -> why (not bound)."""
    targets = {id(f) for f in failed}
    out = {}
    for name, value in values.items():
        stub = _holds(value, targets)
        if stub is not None:
            what = "is" if stub is value else "holds"
            out[name] = (
                f"{kinds.get(name, '?')}: {what} the file {stub.spec['path']} "
                f"(mode {stub.spec['mode']!r}), which could not be reopened ({stub.why})"
            )
    return out


def load_namespace(directory: Path, namespace: dict[str, Any]) -> LoadResult:
    """Load every variable of a notebook's checkpoint directory into ``namespace``."""
    t0 = time.perf_counter()
    result = LoadResult()
    manifest = load_manifest(directory)
    if manifest is None:
        return result
    files: dict[str, list[str]] = {}
    for name, entry in manifest["variables"].items():
        files.setdefault(entry["file"], []).append(name)
    for rel, names in sorted(files.items()):
        path = directory / rel
        entries = {name: manifest["variables"][name] for name in names}
        kinds = {name: e.get("type", "?") for name, e in entries.items()}
        failed: list[NotReopened] = []
        try:
            values = read_group(path, namespace, failed)
        except Exception as error:  # a missing module, a truncated file: say which
            for name in names:
                result.not_restored[name] = f"{kinds[name]}: could not be loaded ({error})"
            continue
        result.bytes += path.stat().st_size
        dropped = _drop_unopened(values, failed, kinds) if failed else {}
        result.not_restored.update(dropped)
        for name in names:
            if name in values and name not in dropped:
                namespace[name] = values[name]
                result.restored.append(name)
                if entries[name].get("files"):
                    result.reopened[name] = "; ".join(entries[name]["files"])
    for name, why in (manifest.get("unsaved") or {}).items():
        result.not_restored[name] = why
    result.restored.sort()
    result.seconds = time.perf_counter() - t0
    return result


# --- shared references -----------------------------------------------------------

_ATOMIC = (int, float, complex, str, bytes, bool, type(None), range, slice)
_IMMUTABLE = (tuple, frozenset)
_PLAIN = frozenset({tuple, frozenset, list, dict, set, types.CellType, functools.partial})


def _library_ids(namespace: dict[str, Any]) -> set[int]:
    """ids of objects bound at module level in imported modules (not __main__).

    Library singletons (pd.NA, loggers, registries, default instances) are reachable
    from many variables; they are pickled by reference or are shared by design, and
    must not glue unrelated variables into one group.
    """
    ids: set[int] = set()
    for module in list(sys.modules.values()):
        d = getattr(module, "__dict__", None)
        if not isinstance(d, dict) or d is namespace:
            continue
        ids.update(map(id, list(d.values())))
    return ids


def reach(
    obj: Any,
    namespace: dict[str, Any],
    skip: set[int],
    arrays: dict[int, int] | None = None,
) -> tuple[frozenset[int], bool]:
    """ids of the mutable objects reachable from ``obj`` (bounded), and if it was cut short.

    ``arrays`` counts the arrays met per id of the array owning their memory.
    """
    np = sys.modules.get("numpy")
    ndarray = np.ndarray if np is not None else ()
    seen: set[int] = set()
    ids: set[int] = set()
    # Reached through the user's own containers, objects and closures (drained first),
    # or through anything else: a tuple counts as shared only on the first kind of path
    # (``b = a``), never inside library objects, whose tuples are shared by design.
    plain = [obj]
    stack: list[Any] = []
    while plain or stack:
        user = bool(plain)
        o = plain.pop() if user else stack.pop()
        i = id(o)
        if i in seen:
            continue
        seen.add(i)
        if len(seen) > WALK_LIMIT:
            return frozenset(ids), True
        if isinstance(o, _ATOMIC) or o is namespace:
            continue
        if (i in skip and o is not obj) or isinstance(o, type | types.ModuleType):
            continue
        if ndarray and isinstance(o, ndarray):
            base = o
            while isinstance(base.base, ndarray):
                base = base.base
            ids.add(id(base.base if base.base is not None else base))
            if arrays is not None:
                arrays[id(base)] = arrays.get(id(base), 0) + 1
            continue
        if isinstance(o, types.FunctionType):
            ids.add(i)
            if o.__globals__ is namespace:  # a cell's function: its defaults and closure
                (plain if user else stack).extend(gc.get_referents(o))
            continue
        if isinstance(o, types.BuiltinFunctionType | types.WrapperDescriptorType):
            continue
        if user and (type(o) in _PLAIN or type(o).__module__ == "__main__"):
            if not isinstance(o, _IMMUTABLE) or len(o):  # () is one object everywhere
                ids.add(i)
            plain.extend(gc.get_referents(o))
            continue
        if not isinstance(o, _IMMUTABLE):
            ids.add(i)
        stack.extend(gc.get_referents(o))
    return frozenset(ids), False


# --- the checkpointer ------------------------------------------------------------


@dataclass
class _Group:
    names: tuple[str, ...]
    file: str
    fingerprint: str
    bytes: int
    types: dict[str, str]
    files: dict[str, list[str]] = field(default_factory=dict)  # name: open files, described


@dataclass
class SaveResult:
    saved: list[str]  # every variable now on disk
    written: list[str]  # the variables whose group file this save (re)wrote
    unsaved: dict[str, str]  # name: "module.Type: why"
    bytes: int  # on disk, all groups
    written_bytes: int
    seconds: float
    reopened: dict[str, str] = field(default_factory=dict)  # name: its open files, reopened


def _group_id(names: Iterable[str]) -> str:
    return hashlib.sha256("\0".join(sorted(names)).encode()).hexdigest()[:12]


def _components(names: Iterable[str], reached: dict[str, frozenset[int]]) -> list[list[str]]:
    """Connected components of "shares a mutable object", each sorted."""
    parent = {n: n for n in names}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    owner: dict[int, str] = {}
    for name in sorted(parent):
        for i in reached[name]:
            other = owner.setdefault(i, name)
            if other != name:
                a, b = find(name), find(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    components: dict[str, list[str]] = {}
    for name in sorted(parent):
        components.setdefault(find(name), []).append(name)
    return list(components.values())


class Checkpointer:
    """Keeps ``directory`` (one notebook's checkpoint) in step with a namespace.

    ``save(bindings, candidates)`` is called with the user variables and the names
    that may have changed (None: all); a background :class:`Worker` calls it after
    each cell, the agent's flush calls it with None. It is thread-safe (one save at
    a time).
    """

    def __init__(
        self,
        directory: Path,
        notebook: str,
        namespace: dict[str, Any] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.notebook = notebook
        self.namespace = namespace
        self.lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        self._reach: dict[str, frozenset[int]] = {}
        self._arrays: dict[str, dict[int, int]] = {}  # name: arrays met per owner's id
        self._unsaved: dict[str, str] = {}
        self._retry: set[str] = set()  # changed under the pickler: try again next save
        self._skip: set[int] = set()
        self._skip_modules = -1
        self.saves = 0
        self.save_seconds = 0.0  # all saves together (the benchmarks read these)
        self.written_bytes = 0
        self._adopt()

    def _adopt(self) -> None:
        """Take over the groups of an earlier kernel of this notebook (same files)."""
        try:
            manifest = load_manifest(self.directory)
        except (ValueError, OSError):
            return
        for gid, g in ((manifest or {}).get("groups") or {}).items():
            try:
                self._groups[gid] = _Group(
                    tuple(g["names"]), g["file"], g["fingerprint"], int(g["bytes"]), {}
                )
            except (KeyError, TypeError, ValueError):
                continue

    def _skip_ids(self, namespace: dict[str, Any] | None) -> set[int]:
        if len(sys.modules) != self._skip_modules:
            self._skip = _library_ids(namespace or {})
            self._skip_modules = len(sys.modules)
        return self._skip

    def save(
        self,
        bindings: dict[str, Any],
        candidates: set[str] | None = None,
        *,
        fsync: bool = False,
        background: bool = False,
    ) -> SaveResult:
        """``background``: not on the kernel's thread (a readable text file waits)."""
        with self.lock:
            return self._save(bindings, candidates, fsync, background)

    def _walk(self, bindings: dict[str, Any], candidates: set[str] | None) -> set[str]:
        """Refresh what each changed variable reaches; the names to re-serialize."""
        names = set(bindings)
        changed = names if candidates is None else ((set(candidates) | self._retry) & names)
        self._retry = set()
        # Names the adopted manifest knew but this kernel never saw are dropped below.
        for name in list(self._reach):
            if name not in names:
                del self._reach[name]
                self._arrays.pop(name, None)
        for name in list(self._unsaved):
            if name not in names or name in changed:
                del self._unsaved[name]
        skip = self._skip_ids(self.namespace)
        for name in changed | (names - set(self._reach)):  # changed, or never walked
            arrays: dict[int, int] = {}
            self._reach[name], _cut = reach(bindings[name], self.namespace or {}, skip, arrays)
            self._arrays[name] = arrays
            changed.add(name)
        return changed

    def _roots(self, members: list[str]) -> set[int]:
        """Owners of the memory of two or more arrays of a group: their views stay views."""
        counts: dict[int, int] = {}
        for m in members:
            for i, n in self._arrays.get(m, {}).items():
                counts[i] = counts.get(i, 0) + n
        return {i for i, n in counts.items() if n > 1}

    def _save(
        self,
        bindings: dict[str, Any],
        candidates: set[str] | None,
        fsync: bool,
        background: bool = False,
    ) -> SaveResult:
        t0 = time.perf_counter()
        changed = self._walk(bindings, candidates)
        names = [n for n in bindings if n not in self._unsaved]
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        groups: dict[str, _Group] = {}
        written: list[str] = []
        written_bytes = 0
        pending = _components(names, self._reach)
        while pending:
            members = pending.pop()
            gid = _group_id(members)
            old = self._groups.get(gid)
            if old is not None and not (changed & set(members)) and old.types:
                groups[gid] = old
                continue
            group = self._serialize(bindings, members, old, pending, fsync, background)
            if group is not None:
                groups[gid] = group
                if group is not old:
                    written.extend(members)
                    written_bytes += group.bytes
        for gid, old in self._groups.items():
            if gid not in groups:
                try:
                    (self.directory / old.file).unlink()
                except FileNotFoundError:
                    pass
        self._groups = groups
        self._write_manifest(fsync)
        self.saves += 1
        self.save_seconds += time.perf_counter() - t0
        self.written_bytes += written_bytes
        return SaveResult(
            saved=sorted(n for g in groups.values() for n in g.names),
            written=sorted(written),
            unsaved=dict(sorted(self._unsaved.items())),
            bytes=sum(g.bytes for g in groups.values()),
            written_bytes=written_bytes,
            seconds=time.perf_counter() - t0,
            reopened=dict(
                sorted((n, "; ".join(fs)) for g in groups.values() for n, fs in g.files.items())
            ),
        )

    def _serialize(
        self,
        bindings: dict[str, Any],
        members: list[str],
        old: _Group | None,
        pending: list[list[str]],
        fsync: bool,
        background: bool,
    ) -> _Group | None:
        """The group of ``members`` as now on disk (written if its bytes changed); None
        when it is not on disk (unsaved members go to _unsaved, the rest to pending)."""
        values = {n: bindings[n] for n in members}
        files: list[tuple[int, dict[str, Any]]] = []
        try:
            data, raws, fingerprint = serialize(
                values, self.namespace, self._roots(members), files, background
            )
        except Exception as error:
            if _mutated(error) or isinstance(error, DeferredToFlush):
                # The next cell changed it while this thread pickled it (try again with
                # the next save), or the flush is to read a text file's position: keep
                # the last good write.
                if not isinstance(error, DeferredToFlush):
                    self._retry.update(members)
                elif old is None:  # never written: named until the flush writes it
                    for m in members:
                        self._unsaved[m] = (
                            f"{type_name(values[m])}: holds the open text file {error}, whose "
                            "position only the agent's flush reads; saved at the next flush"
                        )
                return old
            if len(members) == 1:
                self._unsaved[members[0]] = f"{type_name(values[members[0]])}: {_why(error)}"
                return None
            bad = []  # who cannot be pickled? the others are saved without them
            for m in members:
                try:
                    serialize({m: values[m]}, self.namespace, None, None, background)
                except DeferredToFlush:
                    continue
                except Exception as alone:
                    self._unsaved[m] = f"{type_name(values[m])}: {_why(alone)}"
                    bad.append(m)
            rest = [m for m in members if m not in bad]
            if not bad:  # each pickles alone, not together: save them one by one
                pending.extend([m] for m in rest)
            elif rest:
                pending.append(rest)
            return None
        kinds = {n: type_name(v) for n, v in values.items()}
        described = self._files(members, files)
        if old is not None and old.fingerprint == fingerprint:
            old.types, old.files = kinds, described
            return old
        file = f"g-{_group_id(members)}.pkl"
        size = write_group(self.directory / file, data, raws, members, fsync)
        return _Group(tuple(members), file, fingerprint, size, kinds, described)

    def _files(
        self, members: list[str], files: list[tuple[int, dict[str, Any]]]
    ) -> dict[str, list[str]]:
        """The open files of a group, by the variables that reach them."""
        out: dict[str, list[str]] = {}
        for i, spec in files:
            holders = [m for m in members if i in self._reach.get(m, ())] or members
            for m in holders:
                out.setdefault(m, []).append(describe_file(spec))
        return out

    def _write_manifest(self, fsync: bool) -> None:
        variables = {}
        for gid, g in self._groups.items():
            for name in g.names:
                variables[name] = {
                    "file": g.file,
                    "type": g.types.get(name, "?"),
                    "bytes": g.bytes,
                    "group": gid,
                }
                if name in g.files:
                    variables[name]["files"] = g.files[name]
        manifest = {
            "notebook": self.notebook,
            "updated": time.time(),
            "variables": dict(sorted(variables.items())),
            "unsaved": dict(sorted(self._unsaved.items())),
            "groups": {
                gid: {
                    "names": list(g.names),
                    "file": g.file,
                    "fingerprint": g.fingerprint,
                    "bytes": g.bytes,
                }
                for gid, g in sorted(self._groups.items())
            },
        }
        path = self.directory / MANIFEST
        tmp = path.with_name(MANIFEST + ".tmp")
        with _open_private(tmp) as f:
            f.write(json.dumps(manifest, indent=1).encode())
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if fsync:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _mutated(error: BaseException) -> bool:
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "changed size during iteration" in text or "mutated during iteration" in text
    )


def _why(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class Worker:
    """One background thread that runs the saves queued after cells, newest last.

    Cells that end while a save is running are merged into the next save (union of
    their candidates, the newest bindings), so a slow save never queues up work.
    """

    def __init__(self, checkpointer: Checkpointer, on_error: Callable[[BaseException], None]):
        self.checkpointer = checkpointer
        self.on_error = on_error
        self._cond = threading.Condition()
        self._bindings: dict[str, Any] | None = None
        self._candidates: set[str] | None = set()
        self._busy = False
        self._closed = False
        self.last: SaveResult | None = None
        self._thread = threading.Thread(target=self._run, name="budgethub-checkpoint", daemon=True)
        self._thread.start()

    def submit(self, bindings: dict[str, Any], candidates: set[str] | None) -> None:
        with self._cond:
            if self._bindings is None:
                self._candidates = candidates
            elif self._candidates is not None:
                self._candidates = None if candidates is None else self._candidates | candidates
            self._bindings = bindings
            self._cond.notify()

    def discard_pending(self) -> None:
        """Drop a queued save (a full save is about to cover it)."""
        with self._cond:
            self._bindings, self._candidates = None, set()
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Until nothing is queued or running (True), or the timeout passes (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._busy or self._bindings is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        # Linux nices threads one by one: the cells keep the CPU when cores are
        # contended, the saves take what is left (they coalesce when they fall behind;
        # the agent's flush runs on the kernel's own thread, at its priority).
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except (AttributeError, OSError):
            pass
        while True:
            with self._cond:
                while self._bindings is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                bindings, candidates = self._bindings, self._candidates
                self._bindings, self._candidates = None, set()
                self._busy = True
            try:
                assert bindings is not None
                self.last = self.checkpointer.save(bindings, candidates, background=True)
            except BaseException as error:  # reported, never kills the thread
                self.on_error(error)
            finally:
                del bindings
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
