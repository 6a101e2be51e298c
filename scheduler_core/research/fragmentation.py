"""GPU fragmentation of a node with respect to a workload, and the placement that adds least.

The idea is that of Fragmentation Gradient Descent (Weng et al., "Beware of
Fragmentation", USENIX ATC'23): free GPU capacity is only worth something if
the tasks that will arrive can use it. A quarter of a GPU left on a node is
capacity for a workload of quarter-GPU notebooks and waste for a workload of
whole-GPU training jobs. So fragmentation is measured against a *target
workload*: a list of task shapes with their popularity (how often each shape
occurs; counts are fine, they are normalised).

Definitions, for a node with free CPU, free memory and free milli-GPU per GPU:

* a task shape *fits* when the node has its CPU and memory free and, for ``k``
  whole GPUs, ``k`` completely free GPUs, or, for a fraction ``d`` of one GPU,
  one GPU with at least ``d`` milli free;
* the GPU milli a shape can *use*: 0 when it does not fit; otherwise the free
  milli of every GPU it could take (for a fraction ``d``: GPUs with at least
  ``d`` free; for whole GPUs: the completely free GPUs);
* the shape's *fragmentation* of the node: the node's free GPU milli minus what
  the shape can use. A shape that needs no GPU fragments nothing (GPUs are not
  its business);
* the node's fragmentation: the popularity-weighted mean over the workload, in
  milli-GPU: "how much of this node's free GPU a random task can not use".

Placing a task moves the node to a new state; the placement rule is to choose,
among all nodes and all GPU choices on them, the one whose fragmentation
grows least (:func:`fragmentation_delta`). Because every placement of a task
removes the same free GPU, this is the same as keeping the most *expected
usable* GPU, which is what :class:`FragmentationModel` computes fast: with the
shapes grouped by GPU demand, the expected usable milli of a node is
``sum_i h(free_i) + W(full)``, where ``h(x) = x * (popularity of fraction
shapes with demand <= x that fit the node's CPU and memory)`` and ``W`` does
the same for whole-GPU shapes over the number of fully free GPUs. The
popularity that fits a given free CPU and memory is a lookup in a 2-D prefix
table built once per workload.

Everything here works on plain data (:class:`NodeFree`, :class:`TaskShape`),
so the live scheduler and the placement benchmark (fragbench.py) share it:
the scheduler builds one model per workload (e.g. the recent requests of a
pool), then calls :func:`choose_placement` with the free state of the nodes
where a fractional or whole-GPU request may go. CPU is in milli-cores and
memory in MiB, as integers, as in the trace (``.of()`` converts from cores
and GiB).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler_core.model import MILLI


@dataclass(frozen=True, slots=True)
class TaskShape:
    """What a task needs: CPU, memory and whole GPUs or a fraction of one GPU (or no GPU)."""

    cpu_milli: int
    memory_mib: int
    gpus: int = 0
    """Whole GPUs (each must be completely free)."""
    gpu_milli: int = 0
    """A fraction of one GPU, 1..999 milli; 0 when the task wants whole GPUs or none."""

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"{self} has a negative size")
        if not 0 <= self.gpu_milli < MILLI:
            raise ValueError(f"{self}: gpu_milli must be 0..{MILLI - 1} (use gpus for whole GPUs)")
        if self.gpus and self.gpu_milli:
            raise ValueError(f"{self}: wants whole GPUs and a fraction at once")

    @classmethod
    def of(cls, cpus: float, memory_gib: float, gpus: int = 0, gpu_milli: int = 0) -> TaskShape:
        """From the scheduler's units (cores, GiB), as in a Request."""
        return cls(round(cpus * MILLI), round(memory_gib * 1024), gpus, gpu_milli)

    @property
    def gpu_demand_milli(self) -> int:
        """Milli-GPU the task takes."""
        return self.gpus * MILLI + self.gpu_milli

    @property
    def gpu_weight(self) -> float:
        """GPU-equivalents the task takes."""
        return self.gpu_demand_milli / MILLI


@dataclass(frozen=True, slots=True)
class NodeFree:
    """What is free on one node: CPU, memory and milli-GPU per GPU (0..1000 each)."""

    cpu_milli: int
    memory_mib: int
    gpu_milli: tuple[int, ...] = ()

    @classmethod
    def of(cls, cpus: float, memory_gib: float, gpu_milli: Iterable[int] = ()) -> NodeFree:
        """From the scheduler's units (cores, GiB) and free milli per GPU."""
        return cls(round(cpus * MILLI), round(memory_gib * 1024), tuple(gpu_milli))

    @property
    def total_gpu_milli(self) -> int:
        return sum(self.gpu_milli)

    @property
    def full_gpus(self) -> int:
        """GPUs that are completely free."""
        return sum(1 for free in self.gpu_milli if free >= MILLI)


@dataclass(frozen=True, slots=True)
class Placement:
    """A task shape on one node: the indices of the GPUs it takes there."""

    shape: TaskShape
    gpus: tuple[int, ...] = ()
    """``shape.gpus`` indices of free GPUs, one index for a fraction, none without GPUs."""


Workload = Sequence[tuple[TaskShape, float]]
"""Task shapes with their popularity (any non-negative weights, e.g. counts)."""


def reduce_workload(shapes: Iterable[TaskShape]) -> list[tuple[TaskShape, float]]:
    """The distinct shapes of a task population with their counts, in a fixed order."""
    counts = Counter(shapes)
    return sorted(
        ((shape, float(count)) for shape, count in counts.items()),
        key=lambda item: (item[0].gpus, item[0].gpu_milli, item[0].cpu_milli, item[0].memory_mib),
    )


def fits(free: NodeFree, shape: TaskShape) -> bool:
    """Whether a task of this shape can be placed on the node now."""
    if shape.cpu_milli > free.cpu_milli or shape.memory_mib > free.memory_mib:
        return False
    if shape.gpus:
        return free.full_gpus >= shape.gpus
    if shape.gpu_milli:
        return any(x >= shape.gpu_milli for x in free.gpu_milli)
    return True


def usable_gpu_milli(free: NodeFree, shape: TaskShape) -> int:
    """The node's free GPU milli that a task of this shape could use (0 if it does not fit)."""
    if not fits(free, shape):
        return 0
    if shape.gpus:
        return sum(x for x in free.gpu_milli if x >= MILLI)
    if shape.gpu_milli:
        return sum(x for x in free.gpu_milli if x >= shape.gpu_milli)
    return free.total_gpu_milli


def task_fragmentation(free: NodeFree, shape: TaskShape) -> int:
    """Free GPU milli on the node that this shape can not use; 0 for shapes without GPUs."""
    if not shape.gpu_demand_milli:
        return 0
    return free.total_gpu_milli - usable_gpu_milli(free, shape)


def node_fragmentation(free: NodeFree, workload: Workload) -> float:
    """Expected free GPU milli on the node that a task drawn from the workload can not use."""
    total = sum(popularity for _, popularity in workload)
    if total <= 0:
        return 0.0
    weighted = sum(p * task_fragmentation(free, shape) for shape, p in workload if p)
    return weighted / total


def apply_placement(free: NodeFree, placement: Placement) -> NodeFree:
    """The node's free resources after the placement; ValueError if it does not fit."""
    shape = placement.shape
    gpu = list(free.gpu_milli)
    wanted = shape.gpus if shape.gpus else (1 if shape.gpu_milli else 0)
    if len(placement.gpus) != wanted or len(set(placement.gpus)) != wanted:
        raise ValueError(f"{placement} names {len(placement.gpus)} GPUs, needs {wanted}")
    for index in placement.gpus:
        if not 0 <= index < len(gpu):
            raise ValueError(f"{placement}: GPU {index} does not exist")
        take = MILLI if shape.gpus else shape.gpu_milli
        if gpu[index] < take:
            raise ValueError(f"{placement}: GPU {index} has {gpu[index]} milli free")
        gpu[index] -= take
    cpu = free.cpu_milli - shape.cpu_milli
    memory = free.memory_mib - shape.memory_mib
    if cpu < 0 or memory < 0:
        raise ValueError(f"{placement}: not enough CPU or memory")
    return NodeFree(cpu, memory, tuple(gpu))


def candidate_placements(free: NodeFree, shape: TaskShape) -> list[Placement]:
    """Every distinct way to place the shape on the node (GPUs with equal free are equal).

    Whole GPUs: the lowest-indexed completely free ones. A fraction: for each
    distinct free amount that fits, the lowest-indexed GPU with it.
    """
    if shape.cpu_milli > free.cpu_milli or shape.memory_mib > free.memory_mib:
        return []
    if shape.gpus:
        full = [i for i, x in enumerate(free.gpu_milli) if x >= MILLI]
        return [Placement(shape, tuple(full[: shape.gpus]))] if len(full) >= shape.gpus else []
    if shape.gpu_milli:
        seen: set[int] = set()
        out: list[Placement] = []
        for index, x in enumerate(free.gpu_milli):
            if x >= shape.gpu_milli and x not in seen:
                seen.add(x)
                out.append(Placement(shape, (index,)))
        return out
    return [Placement(shape)]


def fragmentation_delta(free: NodeFree, placement: Placement, workload: Workload) -> float:
    """How much the node's fragmentation grows (milli-GPU) if the placement is made."""
    after = apply_placement(free, placement)
    return node_fragmentation(after, workload) - node_fragmentation(free, workload)


class FragmentationModel:
    """A workload compiled for fast, repeated fragmentation queries.

    Gives the same numbers as :func:`node_fragmentation` and
    :func:`fragmentation_delta` (up to float rounding), in time proportional to
    the node's GPUs and the number of distinct GPU demands, not the number of
    shapes; results are cached per distinct node state. The tables are public
    so that vectorised callers (the placement benchmark) can use them.
    """

    CACHE_LIMIT = 1 << 16

    def __init__(self, workload: Workload) -> None:
        shapes = [(s, float(p)) for s, p in workload if p > 0]
        if any(p < 0 for _, p in workload):
            raise ValueError("workload popularity must be >= 0")
        self.total_popularity = sum(p for _, p in shapes)
        self.gpu_popularity = sum(p for s, p in shapes if s.gpu_demand_milli)
        self.fraction_demands: tuple[int, ...] = tuple(
            sorted({s.gpu_milli for s, _ in shapes if s.gpu_milli})
        )
        self.whole_demands: tuple[int, ...] = tuple(sorted({s.gpus for s, _ in shapes if s.gpus}))
        gpu_shapes = [(s, p) for s, p in shapes if s.gpu_demand_milli]
        self.cpu_thresholds: tuple[int, ...] = tuple(sorted({s.cpu_milli for s, _ in gpu_shapes}))
        self.memory_thresholds: tuple[int, ...] = tuple(
            sorted({s.memory_mib for s, _ in gpu_shapes})
        )
        classes = len(self.fraction_demands) + len(self.whole_demands)
        rows, cols = len(self.cpu_thresholds) + 1, len(self.memory_thresholds) + 1
        table = [[[0.0] * cols for _ in range(rows)] for _ in range(classes)]
        for shape, popularity in gpu_shapes:
            g = self._class_of(shape)
            i = self.cpu_thresholds.index(shape.cpu_milli) + 1
            j = self.memory_thresholds.index(shape.memory_mib) + 1
            table[g][i][j] += popularity
        for grid in table:  # 2-D prefix sums: grid[i][j] = shapes of ranks < i, < j
            for i in range(rows):
                for j in range(cols):
                    grid[i][j] += (
                        (grid[i - 1][j] if i else 0.0)
                        + (grid[i][j - 1] if j else 0.0)
                        - (grid[i - 1][j - 1] if i and j else 0.0)
                    )
        self.fit_table: list[list[list[float]]] = table
        """``fit_table[g][i][j]``: popularity of class-``g`` shapes that need at most the
        ``i``-th smallest CPU and the ``j``-th smallest memory (0 = none); classes are
        the fraction demands in ascending order, then the whole demands."""
        self._cache: dict[NodeFree, float] = {}

    def _class_of(self, shape: TaskShape) -> int:
        if shape.gpu_milli:
            return self.fraction_demands.index(shape.gpu_milli)
        return len(self.fraction_demands) + self.whole_demands.index(shape.gpus)

    def class_popularity(self, cpu_milli: int, memory_mib: int) -> list[float]:
        """Per class, the popularity of its shapes whose CPU and memory fit in what is given."""
        if cpu_milli < 0 or memory_mib < 0:
            return [0.0] * len(self.fit_table)
        i = bisect_right(self.cpu_thresholds, cpu_milli)
        j = bisect_right(self.memory_thresholds, memory_mib)
        return [grid[i][j] for grid in self.fit_table]

    def expected_usable(self, free: NodeFree) -> float:
        """Sum over shapes of popularity × the GPU milli the shape could use (unnormalised).

        Cached per distinct node state (a bounded cache, cleared when full).
        """
        cached = self._cache.get(free)
        if cached is not None:
            return cached
        weights = self.class_popularity(free.cpu_milli, free.memory_mib)
        fractions = len(self.fraction_demands)
        usable = 0.0
        for x in free.gpu_milli:
            if x <= 0:
                continue
            fitting = bisect_right(self.fraction_demands, x)
            usable += x * sum(weights[:fitting])
        full = free.full_gpus
        if full:
            fitting = bisect_right(self.whole_demands, full)
            usable += MILLI * full * sum(weights[fractions : fractions + fitting])
        if len(self._cache) >= self.CACHE_LIMIT:
            self._cache.clear()
        self._cache[free] = usable
        return usable

    def fragmentation(self, free: NodeFree) -> float:
        """Same as :func:`node_fragmentation` with this model's workload."""
        if self.total_popularity <= 0:
            return 0.0
        unusable = self.gpu_popularity * free.total_gpu_milli - self.expected_usable(free)
        return unusable / self.total_popularity

    def delta(self, free: NodeFree, placement: Placement) -> float:
        """Same as :func:`fragmentation_delta` with this model's workload."""
        return self.fragmentation(apply_placement(free, placement)) - self.fragmentation(free)

    def usable_gain(self, free: NodeFree, placement: Placement) -> float:
        """Change of :meth:`expected_usable` if the placement is made.

        For one shape it ranks placements exactly as :meth:`delta` does, reversed
        (``delta = -(gpu_popularity * demand + gain) / total_popularity``), and with
        integer popularity it is exact, so ties are real ties.
        """
        return self.expected_usable(apply_placement(free, placement)) - self.expected_usable(free)

    def _best(self, free: NodeFree, shape: TaskShape) -> tuple[float, int, Placement] | None:
        best: tuple[float, int, Placement] | None = None
        for placement in candidate_placements(free, shape):
            loss = -self.usable_gain(free, placement)
            tightness = sum(free.gpu_milli[i] for i in placement.gpus)
            if best is None or (loss, tightness) < (best[0], best[1]):
                best = (loss, tightness, placement)
        return best

    def best_placement(self, free: NodeFree, shape: TaskShape) -> tuple[float, Placement] | None:
        """The placement on this node that grows fragmentation least, with that growth.

        Ties go to the GPU with least free milli (best fit), then the lowest index.
        None when the shape does not fit.
        """
        best = self._best(free, shape)
        return None if best is None else (self.delta(free, best[2]), best[2])


def choose_placement(
    nodes: Sequence[NodeFree], shape: TaskShape, model: FragmentationModel
) -> tuple[int, Placement] | None:
    """The node (index into ``nodes``) and placement that grow fragmentation least.

    Ties go to the node with least free GPU milli (pack, keep emptier nodes whole),
    then the GPU with least free milli, then the lowest node index: the rule of the
    ``budgethub`` strategy in the placement benchmark. None when nothing fits.
    """
    best: tuple[tuple[float, int, int, int], Placement] | None = None
    for index, free in enumerate(nodes):
        found = model._best(free, shape)
        if found is None:
            continue
        loss, tightness, placement = found
        key = (loss, free.total_gpu_milli, tightness, index)
        if best is None or key < best[0]:
            best = (key, placement)
    return None if best is None else (best[0][3], best[1])
