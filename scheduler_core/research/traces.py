"""Public cluster traces turned into scenarios (`budgethub trace import`).

One source so far, ``alibaba-openb``: the GPU trace Alibaba released with
"Beware of Fragmentation" (ATC'23), a pod list (``name, cpu_milli, memory_mib,
num_gpu, gpu_milli, gpu_spec, qos, pod_phase, creation_time, deletion_time,
scheduled_time``) and a node list (``sn, cpu_milli, memory_mib, gpu, model``).
Readers here check every cell and raise :class:`InputError` naming
``FILE:LINE:COLUMN``; the fragmentation benchmark reads the same files through them.

The trace's other pod lists (the multi-GPU and GPU-sharing variants that the
FGD paper evaluates on) have only ``name, cpu_milli, memory_mib, num_gpu,
gpu_milli``: task shapes without times or QoS. `read_pod_shapes` needs only
those columns (the placement benchmark: tasks arrive without departures), and
`read_pods`, which a scenario is built from, names every time and QoS column
such a file lacks. ``gpu_spec`` is never needed.

How the trace becomes a scenario (every rule deterministic, so the same files
always give byte-identical JSON):

* **Pools.** One GPU pool, ``gpu``, holds every node with GPUs, whatever its
  model: no task in the trace names a GPU model (``gpu_spec`` is empty in this
  release and is ignored), so for the trace's tasks all GPU nodes are
  interchangeable, which is what a pool means. Nodes keep their
  ``gpu_model``. Nodes without GPUs (present when the all-node list is given)
  form a ``cpu`` pool.
* **Nodes.** One entry per trace node, named by its ``sn``: ``cpus`` =
  cpu_milli / 1000, ``memory_gib`` = memory_mib / 1024, ``gpus``, ``gpu_model``
  (``GPU`` when the model cell is empty).
* **Teams.** The trace has no users or teams. There are ``teams`` teams
  (default 15, the number of allocations in Ai2's cluster), ``team-01`` ...;
  team *k* (from 1) gets a share proportional to ``1 / k**skew`` of every pool
  (default skew 1: a few large programmes and a tail of small groups; skew 0
  gives equal shares), rounded down to 6 decimals so that shares never sum
  over 1. A task goes to the team whose cumulative-share interval contains a
  stable hash of its name (BLAKE2b, not Python's salted ``hash``), so each
  team's demand is, in expectation, proportional to its share; the user is one
  of ``users_per_team`` (default 10, ~150 researchers as at Ai2) chosen by a
  second hash: ``team-01-u03``.
* **Which tasks.** Running, Succeeded and Failed pods are imported: all were
  scheduled and held their resources from ``scheduled_time`` to
  ``deletion_time`` (a failure is the job's, the demand on the cluster was
  real). Pending pods are skipped: they never ran, so the trace has no run
  length for them (they were withdrawn after a median 94 s of waiting). CPU-only
  pods are skipped when the node list has no CPU-only nodes (in a GPU pool they
  would be charged nothing). A pod that fits no node of its pool (CPU, memory
  or GPUs) is skipped, as it could only wait forever. The import summary on
  stderr counts every skip by reason.
* **Times.** ``submit`` = ``creation_time`` minus the earliest creation time
  of the imported pods (``scheduled_time`` stands in for a missing creation
  time; a pod with neither is skipped). ``duration`` = ``deletion_time`` −
  ``scheduled_time``, at least 1 s; a missing ``scheduled_time`` is taken as
  the creation time and a missing ``deletion_time`` as the end of the trace
  (the latest time in the file: the pod was still running when it was cut).
  ``horizon`` = the end of the trace (or the last ``submit + duration``, if
  later) from the earliest submit, so the scenario covers the whole trace.
* **Load.** As released, the trace's running tasks hold a small part of its
  own cluster at any time, so every policy starts everything at once and they
  cannot differ. ``time_scale`` (``--time-scale``, default 1) divides every
  arrival time (and the horizon's span of arrivals) by its value and keeps run
  lengths: at 10 the same tasks arrive ten times as densely, which is ten
  times the offered load on the same nodes. The order of arrivals is kept.
  All tasks of this release together ask for fewer GPUs than its cluster has,
  so a queue also takes fewer nodes: pass a subset of the node list (docs/benchmarks/compare.md).
* **Sizes.** ``cpus`` and ``memory_gib`` as for nodes, at least 1 milli-CPU and
  1 MiB (a scenario needs sizes > 0; one pod in the trace asks for no memory). ``num_gpu`` ≥ 1 with
  ``gpu_milli`` = 1000 is ``gpus: num_gpu``; one GPU with ``gpu_milli`` < 1000
  is ``gpu_fraction: gpu_milli/1000`` (a GPU-sharing task). Several GPUs with
  ``gpu_milli`` < 1000 (not in this release) become whole GPUs: budgethub
  shares at most one GPU per request, and rounding up never under-serves.
* **Class.** From ``qos``: LS (latency-sensitive) and Guaranteed (Kubernetes'
  reserved, requests = limits) are work someone waits on, so ``interactive``;
  the part of it that fits budgethub's debug envelope (at most
  ``debug_max_gpus`` GPU-equivalents and at most ``debug_min_runtime`` long,
  15 min) is what a user would submit as ``debug``. BE (best-effort) and
  Burstable (requests below limits, runs on whatever is spare) tolerate
  queueing and are ``batch``.
* **Minimum runtime.** The class's protection, capped at the task's duration
  (protecting longer than the work lasts means nothing): ``debug`` 15 min,
  ``interactive`` 1 h (the policy's default), ``batch`` 8 h (the most the
  policy grants, as Ai2's batch jobs ask). Requests are not ``resumable`` (the
  trace says nothing about checkpoints) and have priority 0.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler_core.errors import InputError
from scheduler_core.model import MILLI, RequestClass
from scheduler_core.research.fragmentation import TaskShape
from scheduler_core.settings import Settings

SHAPE_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""What a task's shape needs: every pod list of the trace family has these."""
SCENARIO_COLUMNS = ("qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
"""What a time-based scenario needs beside the shape: class, whether it ran, and when."""
POD_COLUMNS = (*SHAPE_COLUMNS, "gpu_spec", *SCENARIO_COLUMNS)
"""The header of the default pod list (``gpu_spec`` is read by nothing)."""
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")

QOS_CLASS: Mapping[str, RequestClass] = {
    "LS": RequestClass.INTERACTIVE,
    "Guaranteed": RequestClass.INTERACTIVE,
    "BE": RequestClass.BATCH,
    "Burstable": RequestClass.BATCH,
}
"""Request class of each QoS; interactive ones inside the debug envelope become debug."""

IMPORTED_PHASES = frozenset({"Running", "Succeeded", "Failed"})
SKIPPED_PHASES = frozenset({"Pending"})

_DEFAULTS = Settings()
MIN_RUNTIME: Mapping[RequestClass, float] = {
    RequestClass.DEBUG: _DEFAULTS.debug_min_runtime,
    RequestClass.INTERACTIVE: _DEFAULTS.default_min_runtime,
    RequestClass.BATCH: _DEFAULTS.max_min_runtime,
    RequestClass.DATAPREP: _DEFAULTS.default_min_runtime,
}
"""Protected minimum runtime asked for by class (then capped at the task's duration)."""

GPU_POOL = "gpu"
CPU_POOL = "cpu"


@dataclass(frozen=True, slots=True)
class TraceTask:
    """One pod of the trace, checked; times are seconds, None when the cell is empty."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    qos: str
    pod_phase: str
    creation_time: float | None
    deletion_time: float | None
    scheduled_time: float | None
    line: int = 0

    @property
    def shape(self) -> TaskShape:
        """The task's resource shape (several partial GPUs round up to whole ones)."""
        return task_shape(self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli)


def task_shape(cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int) -> TaskShape:
    """A pod's resource shape (several partial GPUs round up to whole ones)."""
    if num_gpu == 0:
        return TaskShape(cpu_milli, memory_mib)
    if num_gpu == 1 and gpu_milli < MILLI:
        return TaskShape(cpu_milli, memory_mib, gpu_milli=gpu_milli)
    return TaskShape(cpu_milli, memory_mib, gpus=num_gpu)


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One node of the trace's node list, checked."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    line: int = 0


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """The free choices of an import (see the module docstring)."""

    teams: int = 15
    skew: float = 1.0
    users_per_team: int = 10
    name: str = "alibaba-openb"
    time_scale: float = 1.0
    """Arrival times are divided by this; run lengths are kept (see "Load")."""


@dataclass(slots=True)
class ImportReport:
    """What an import kept and skipped, for the one-line summary on stderr."""

    tasks: int = 0
    imported: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    fallbacks: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        parts = [f"imported {self.imported} of {self.tasks} tasks"]
        if self.skipped:
            parts.append(
                "skipped " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            )
        if self.fallbacks:
            parts.append(
                "fallbacks " + ", ".join(f"{n} {why}" for why, n in sorted(self.fallbacks.items()))
            )
        return "; ".join(parts)


# --- reading -----------------------------------------------------------------


class _Rows:
    """The data rows of a CSV file as dicts, with the line each came from.

    Raises InputError for an empty file, a missing column, a row with too few or
    too many cells, and a file with a header but no rows.
    """

    def __init__(
        self,
        path: Path,
        columns: Sequence[str],
        what: str,
        purpose: tuple[Sequence[str], str] | None = None,
    ) -> None:
        self.path = path
        self.columns = columns
        self.what = what
        self.purpose = purpose
        """(columns, who needs them, ``{needed}`` standing for the columns): a header
        lacking only some of these says who needs them."""

    def where(self, line: int, column: str) -> str:
        return f"{self.path}:{line}:{column}"

    def __iter__(self) -> Iterator[tuple[int, dict[str, str]]]:
        try:
            raw = self.path.read_bytes()
        except OSError as error:
            raise InputError(self.where(0, self.columns[0]), error.strerror or str(error)) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            line, column = self._locate(raw, error.start)
            raise InputError(
                self.where(line, column),
                f"not UTF-8: byte {raw[error.start]:#04x} ({error.reason})",
            ) from None
        with io.StringIO(text, newline="") as handle:
            reader = csv.reader(handle)
            header: list[str] | None = None
            rows = 0
            try:
                for cells in reader:
                    if not cells or (len(cells) == 1 and not cells[0].strip()):
                        continue
                    if header is None:
                        header = [cell.strip() for cell in cells]
                        self._check_header(header, reader.line_num)
                        continue
                    if len(cells) != len(header):
                        column = header[min(len(cells), len(header) - 1)]
                        raise InputError(
                            self.where(reader.line_num, column),
                            f"the row has {len(cells)} cells, the header {len(header)}",
                        )
                    rows += 1
                    yield reader.line_num, dict(zip(header, cells, strict=True))
            except csv.Error as error:
                raise InputError(self.where(reader.line_num, "-"), f"not CSV: {error}") from None
        if header is None:
            raise InputError(
                self.where(1, self.columns[0]),
                f"the file is empty; expected a header ({', '.join(self.columns)})",
            )
        if rows == 0:
            raise InputError(self.where(2, self.columns[0]), f"no {self.what} after the header")

    def _check_header(self, header: Sequence[str], line: int) -> None:
        missing = [column for column in self.columns if column not in header]
        if not missing:
            return
        has = f"the header has {', '.join(header)}"
        needed, who = self.purpose or ((), "")
        if who and set(missing) <= set(needed):
            names = ", ".join(missing)
            every = "them" if len(missing) == len(needed) else ", ".join(needed)
            raise InputError(
                self.where(line, missing[0]),
                f"missing column{'s' if len(missing) > 1 else ''} {names}:"
                f" {who.format(needed=every)} ({has})",
            )
        raise InputError(self.where(line, missing[0]), f"missing column {missing[0]!r} ({has})")

    def _locate(self, raw: bytes, offset: int) -> tuple[int, str]:
        """Line (from 1) and column name of the byte at ``offset`` ("-" if unknown)."""
        line = raw.count(b"\n", 0, offset) + 1
        start = raw.rfind(b"\n", 0, offset) + 1
        cell = raw.count(b",", start, offset)
        header = raw.split(b"\n", 1)[0].decode("utf-8", errors="replace").strip().split(",")
        column = header[cell].strip() if line > 1 and cell < len(header) else "-"
        return line, column


def _number(rows: _Rows, line: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(rows.where(line, column), f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(rows.where(line, column), f"{text!r} is not a number >= 0")
    return value


def _required(rows: _Rows, line: int, column: str, text: str) -> str:
    text = text.strip()
    if not text:
        raise InputError(rows.where(line, column), "missing value")
    return text


def _amount(rows: _Rows, line: int, column: str, text: str) -> int:
    """A non-negative quantity in integer units (milli-CPU, MiB); fractions round."""
    return round(_number(rows, line, column, _required(rows, line, column, text)))


def _count(rows: _Rows, line: int, column: str, text: str) -> int:
    value = _number(rows, line, column, _required(rows, line, column, text))
    if not value.is_integer():
        raise InputError(rows.where(line, column), f"{text.strip()!r} is not a whole number")
    return int(value)


def _time(rows: _Rows, line: int, column: str, text: str) -> float | None:
    text = text.strip()
    return None if not text else _number(rows, line, column, text)


_SCENARIO_NEEDS = (
    SCENARIO_COLUMNS,
    "a time-based scenario needs {needed} beside the task shape;"
    " `budgethub bench placement` needs only the shape",
)


@dataclass(frozen=True, slots=True)
class _Shape:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int


def _shape_cells(rows: _Rows, line: int, row: Mapping[str, str], seen: dict[str, int]) -> _Shape:
    """The shape columns of one row, checked (``seen``: name -> line, updated)."""
    name = _required(rows, line, "name", row["name"])
    if name in seen:
        raise InputError(rows.where(line, "name"), f"{name!r} repeats line {seen[name]}")
    seen[name] = line
    num_gpu = _count(rows, line, "num_gpu", row["num_gpu"])
    gpu_milli = _count(rows, line, "gpu_milli", row["gpu_milli"])
    if gpu_milli > MILLI:
        raise InputError(rows.where(line, "gpu_milli"), f"{gpu_milli} is over {MILLI}")
    if num_gpu == 0 and gpu_milli != 0:
        raise InputError(rows.where(line, "gpu_milli"), "must be 0 when num_gpu is 0")
    if num_gpu > 0 and gpu_milli == 0:
        raise InputError(rows.where(line, "gpu_milli"), "must be 1 to 1000 when num_gpu > 0")
    return _Shape(
        name=name,
        cpu_milli=_amount(rows, line, "cpu_milli", row["cpu_milli"]),
        memory_mib=_amount(rows, line, "memory_mib", row["memory_mib"]),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
    )


def read_pod_shapes(path: str | Path) -> list[TaskShape]:
    """Task shapes of any pod list of the trace family: only SHAPE_COLUMNS are needed."""
    rows = _Rows(Path(path), SHAPE_COLUMNS, "tasks")
    seen: dict[str, int] = {}
    shapes = []
    for line, row in rows:
        cells = _shape_cells(rows, line, row, seen)
        shapes.append(task_shape(cells.cpu_milli, cells.memory_mib, cells.num_gpu, cells.gpu_milli))
    return shapes


def read_pods(path: str | Path) -> list[TraceTask]:
    """The tasks of an Alibaba ``openb_pod_list_*.csv`` with times; InputError on any bad cell.

    A file without SCENARIO_COLUMNS raises InputError naming each one missing.
    """
    rows = _Rows(Path(path), SHAPE_COLUMNS + SCENARIO_COLUMNS, "tasks", _SCENARIO_NEEDS)
    tasks: list[TraceTask] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        cells = _shape_cells(rows, line, row, seen)
        qos = _required(rows, line, "qos", row["qos"])
        if qos not in QOS_CLASS:
            raise InputError(
                rows.where(line, "qos"), f"{qos!r} is not one of {', '.join(QOS_CLASS)}"
            )
        phase = _required(rows, line, "pod_phase", row["pod_phase"])
        if phase not in IMPORTED_PHASES | SKIPPED_PHASES:
            known = ", ".join(sorted(IMPORTED_PHASES | SKIPPED_PHASES))
            raise InputError(rows.where(line, "pod_phase"), f"{phase!r} is not one of {known}")
        tasks.append(
            TraceTask(
                name=cells.name,
                cpu_milli=cells.cpu_milli,
                memory_mib=cells.memory_mib,
                num_gpu=cells.num_gpu,
                gpu_milli=cells.gpu_milli,
                qos=qos,
                pod_phase=phase,
                creation_time=_time(rows, line, "creation_time", row["creation_time"]),
                deletion_time=_time(rows, line, "deletion_time", row["deletion_time"]),
                scheduled_time=_time(rows, line, "scheduled_time", row["scheduled_time"]),
                line=line,
            )
        )
    return tasks


def read_nodes(path: str | Path) -> list[TraceNode]:
    """The nodes of an Alibaba ``openb_node_list_*.csv``; InputError on any bad cell."""
    rows = _Rows(Path(path), NODE_COLUMNS, "nodes")
    nodes: list[TraceNode] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        name = _required(rows, line, "sn", row["sn"])
        if name in seen:
            raise InputError(rows.where(line, "sn"), f"{name!r} repeats line {seen[name]}")
        seen[name] = line
        gpus = _count(rows, line, "gpu", row["gpu"])
        nodes.append(
            TraceNode(
                name=name,
                cpu_milli=_amount(rows, line, "cpu_milli", row["cpu_milli"]),
                memory_mib=_amount(rows, line, "memory_mib", row["memory_mib"]),
                gpus=gpus,
                model=(row["model"].strip() or "GPU") if gpus else "",
                line=line,
            )
        )
    return nodes


# --- the scenario ------------------------------------------------------------


def stable_fraction(salt: str, name: str) -> float:
    """A number in [0, 1) fixed by ``salt`` and ``name`` on every machine and run."""
    digest = hashlib.blake2b(f"{salt}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def team_weights(teams: int, skew: float) -> list[float]:
    """Normalised weights of teams 1..teams, proportional to ``1 / k**skew``."""
    raw = [1.0 / (k**skew) for k in range(1, teams + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def team_names(teams: int) -> list[str]:
    width = max(2, len(str(teams)))
    return [f"team-{k:0{width}d}" for k in range(1, teams + 1)]


def _seconds(value: float) -> float | int:
    """Whole seconds as ints, so the JSON reads ``427061`` rather than ``427061.0``."""
    return int(value) if float(value).is_integer() else value


def _fits(task: TraceTask, node: TraceNode) -> bool:
    """Whether the task fits the empty node (a fraction needs one GPU)."""
    return (
        task.cpu_milli <= node.cpu_milli
        and task.memory_mib <= node.memory_mib
        and max(task.shape.gpus, 1 if task.shape.gpu_milli else 0) <= node.gpus
    )


def request_class(qos: str, gpu_weight: float, duration: float, settings: Settings) -> RequestClass:
    """The request class of a task (see the module docstring)."""
    klass = QOS_CLASS[qos]
    if (
        klass is RequestClass.INTERACTIVE
        and gpu_weight <= settings.debug_max_gpus
        and duration <= settings.debug_min_runtime
    ):
        return RequestClass.DEBUG
    return klass


def alibaba_openb_scenario(
    tasks: Sequence[TraceTask],
    nodes: Sequence[TraceNode],
    options: ImportOptions | None = None,
) -> tuple[dict[str, Any], ImportReport]:
    """A scenario from the Alibaba trace, and what was kept and skipped."""
    options = options or ImportOptions()
    _check(options)
    scale = options.time_scale
    settings = _DEFAULTS
    report = ImportReport(tasks=len(tasks))

    gpu_nodes = [n for n in nodes if n.gpus > 0]
    cpu_nodes = [n for n in nodes if n.gpus == 0]
    pools = ([GPU_POOL] if gpu_nodes else []) + ([CPU_POOL] if cpu_nodes else [])
    pool_nodes = {GPU_POOL: gpu_nodes, CPU_POOL: cpu_nodes}

    times = [
        t
        for task in tasks
        for t in (task.creation_time, task.scheduled_time, task.deletion_time)
        if t is not None
    ]
    trace_end = max(times, default=0.0)
    kept = _kept_tasks(tasks, pool_nodes, pools, trace_end, report)

    start_of_trace = min((submit for _, _, submit, _ in kept), default=0.0)
    names = team_names(options.teams)
    weights = team_weights(options.teams, options.skew)
    cumulative = [sum(weights[: k + 1]) for k in range(len(weights))]
    requests: list[dict[str, Any]] = []
    horizon = (trace_end - start_of_trace) / scale
    for task, pool, trace_submit, duration in kept:
        submit = start_of_trace + (trace_submit - start_of_trace) / scale
        team_index = min(
            bisect_right(cumulative, stable_fraction("team", task.name)), options.teams - 1
        )
        team = names[team_index]
        user = int(stable_fraction("user", task.name) * options.users_per_team)
        request = _request_entry(task, pool, duration, settings)
        request.update(user=f"{team}-u{user:02d}", team=team)
        request["submit"] = _seconds(submit - start_of_trace)
        requests.append(request)
        horizon = max(horizon, submit - start_of_trace + duration)
    requests.sort(key=lambda r: (r["submit"], r["id"]))
    report.imported = len(requests)

    scenario: dict[str, Any] = {
        "name": options.name,
        "horizon": math.ceil(horizon),
        "policy": {"name": settings.name},
        "pools": [{"name": p, "kind": "gpu" if p == GPU_POOL else "cpu"} for p in pools],
        "nodes": [_node_entry(n) for n in nodes],
        "teams": [
            {"name": name, "share": {p: math.floor(w * 1e6) / 1e6 for p in pools}}
            for name, w in zip(names, weights, strict=True)
        ],
        "requests": requests,
    }
    return scenario, report


def _check(options: ImportOptions) -> None:
    """Raise InputError naming the flag of the first option out of range."""
    if options.teams < 1:
        raise InputError("--teams", f"{options.teams} is not a number of teams >= 1")
    if options.users_per_team < 1:
        raise InputError("--users-per-team", f"{options.users_per_team} is not >= 1")
    if not math.isfinite(options.skew) or options.skew < 0:
        raise InputError("--team-skew", f"{options.skew} is not a number >= 0")
    if not math.isfinite(options.time_scale) or options.time_scale <= 0:
        raise InputError("--time-scale", f"{options.time_scale} is not a number > 0")


def _kept_tasks(
    tasks: Sequence[TraceTask],
    pool_nodes: Mapping[str, Sequence[TraceNode]],
    pools: Sequence[str],
    trace_end: float,
    report: ImportReport,
) -> list[tuple[TraceTask, str, float, float]]:
    """The tasks that ran and fit a node of their pool, each with its pool, its submit
    time in the trace and its run length; what is skipped or filled in is counted in
    ``report``."""
    kept: list[tuple[TraceTask, str, float, float]] = []
    for task in tasks:
        if task.pod_phase in SKIPPED_PHASES:
            report.skipped[f"{task.pod_phase.lower()} (never ran)"] += 1
            continue
        pool = CPU_POOL if task.num_gpu == 0 else GPU_POOL
        if pool not in pools:
            report.skipped[f"needing the missing {pool} pool"] += 1
            continue
        if not any(_fits(task, node) for node in pool_nodes[pool]):
            report.skipped["fitting no node"] += 1
            continue
        submit = task.creation_time if task.creation_time is not None else task.scheduled_time
        if submit is None:
            report.skipped["without times"] += 1
            continue
        if task.creation_time is None:
            report.fallbacks["creation_time from scheduled_time"] += 1
        start = task.scheduled_time
        if start is None:
            report.fallbacks["scheduled_time from creation_time"] += 1
            start = submit
        end = task.deletion_time
        if end is None:
            report.fallbacks["deletion_time at trace end"] += 1
            end = trace_end
        kept.append((task, pool, submit, max(1.0, end - start)))
    return kept


def _request_entry(
    task: TraceTask, pool: str, duration: float, settings: Settings
) -> dict[str, Any]:
    """A kept task's request, keys in the scenario's order (user, team and submit time
    are the caller's)."""
    shape = task.shape
    klass = request_class(task.qos, shape.gpu_weight, duration, settings)
    request: dict[str, Any] = {"id": task.name, "user": "", "team": "", "submit": 0, "pool": pool}
    if shape.gpus:
        request["gpus"] = shape.gpus
    elif shape.gpu_milli:
        request["gpu_fraction"] = shape.gpu_milli / MILLI
    # A scenario needs sizes > 0; a pod that asked for none gets the smallest unit.
    request["cpus"] = max(task.cpu_milli, 1) / MILLI
    request["memory_gib"] = max(task.memory_mib, 1) / 1024
    request["min_runtime"] = _seconds(min(MIN_RUNTIME[klass], duration))
    request["duration"] = _seconds(duration)
    request["class"] = klass.value
    return request


def _node_entry(node: TraceNode) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": node.name,
        "pool": GPU_POOL if node.gpus else CPU_POOL,
        "gpus": node.gpus,
    }
    if node.gpus:
        entry["gpu_model"] = node.model
    entry["cpus"] = node.cpu_milli / MILLI
    entry["memory_gib"] = node.memory_mib / 1024
    return entry


def import_alibaba_openb(
    pods: str | Path, nodes: str | Path, options: ImportOptions | None = None
) -> tuple[dict[str, Any], ImportReport]:
    """Read the two CSV files and build the scenario (InputError on bad input)."""
    return alibaba_openb_scenario(read_pods(pods), read_nodes(nodes), options)


Importer = Callable[
    [str | Path, str | Path, ImportOptions | None], tuple[dict[str, Any], ImportReport]
]

TRACE_IMPORTERS: Mapping[str, Importer] = {"alibaba-openb": import_alibaba_openb}
"""Trace sources by name, as `budgethub trace import SOURCE` spells them."""


def dump_scenario(scenario: Mapping[str, Any]) -> str:
    """The scenario as JSON: one line per node, team and request, so diffs stay readable."""
    out = io.StringIO()
    out.write("{\n")
    items = list(scenario.items())
    for index, (key, value) in enumerate(items):
        out.write(f"  {json.dumps(key)}: ")
        if isinstance(value, list) and value:
            out.write("[\n")
            out.write(",\n".join(f"    {json.dumps(item)}" for item in value))
            out.write("\n  ]")
        else:
            out.write(json.dumps(value))
        out.write(",\n" if index < len(items) - 1 else "\n")
    out.write("}\n")
    return out.getvalue()
