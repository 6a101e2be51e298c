"""The placement experiment of "Beware of Fragmentation" (ATC'23), for several strategies.

Tasks drawn from a trace's task population arrive one by one, with no
departures, until the GPUs they asked for reach 100 % and then 130 % of the
cluster's GPU capacity. Each strategy places every task on a node where its
CPU, memory and GPUs fit (a task that fits nowhere is skipped and counted). At
the two points the benchmark reports the cluster's *unallocated GPUs*: the sum
over all GPUs of their unallocated fraction. Fewer is better: at 100 % arrival
every unallocated GPU is capacity that fragmentation made unusable.

The task sequence of a seed is a series of independent random permutations of
the whole population (every pass holds each trace task once, so the shapes
arrive with the trace's frequencies), and every strategy sees the same
sequence. Random choices of a strategy (``random-fit``) are seeded from the
seed too, so a run is deterministic per seed.

Strategies, registered by name in :data:`STRATEGIES`:

* ``random-fit``: a uniformly random node where the task fits, and a random
  GPU there that can hold it.
* ``best-fit``: the node with the least resources left after placement,
  ``gpu/G + cpu/C + memory/M`` where G, C, M are the largest node's
  capacities; on the node, the GPU with least free milli that holds a fraction.
* ``dot-product``: Tetris' alignment (Grandl et al., SIGCOMM'14): the node that
  maximises the dot product of the task's demand and the node's free
  resources, both as fractions of the node's capacity; best-fit GPU on it.
* ``gpu-packing``: fractions go first to a GPU that is already partly used
  (tightest fit), then to a free GPU on a node already in use, then to an
  idle node; whole GPUs go to used nodes before idle ones (fewest free GPUs
  first); CPU-only tasks to the node with fewest free GPUs.
* ``budgethub``: ours, fragmentation-aware (fragmentation.py): the node and GPU
  where the task adds least to the node's fragmentation with respect to the
  population's shape distribution. Ties (exact: popularity is counted, so
  the arithmetic is integral) go to the node with least free GPU (pack, keep
  emptier nodes whole), then the GPU with least free milli, then the lowest
  node and GPU index.

Ties in the baselines go to the lowest node index. The strategies are
vectorised over nodes with numpy; ``budgethub`` evaluates every feasible
(node, GPU) candidate through the tables of :class:`FragmentationModel` in
time linear in the node's GPUs (see fragmentation.py for the formula), and
picks exactly what :func:`fragmentation.choose_placement` would (a unit test
holds the two together).

Measured on the full trace (1,213 GPU nodes, 6,212 GPUs, seeds 0-4, ~33 s on
two cores): mean unallocated GPUs at 100 % random-fit 842, best-fit 486,
dot-product 559, gpu-packing 343, budgethub 315 (-35 % against best-fit).
About 190 of budgethub's remaining GPUs are the 190-milli remainders next to
810-milli tasks (13 % of the trace), which only the ~1 % of tasks asking for
at most 190 milli can fill; no placement rule removes those.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from scheduler_core.model import MILLI
from scheduler_core.research.fragmentation import (
    FragmentationModel,
    NodeFree,
    TaskShape,
    reduce_workload,
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

POINTS = (100, 130)
"""Arrived GPU demand, in percent of capacity, at which unallocated GPUs are measured."""


@dataclass(frozen=True)
class Cluster:
    """Node capacities: milli-CPU, MiB of memory and whole GPUs per node."""

    names: tuple[str, ...]
    cpu_milli: IntArray
    memory_mib: IntArray
    gpus: IntArray

    @classmethod
    def build(cls, nodes: Iterable[tuple[str, int, int, int]]) -> Cluster:
        """From ``(name, cpu_milli, memory_mib, gpus)`` tuples."""
        rows = list(nodes)
        return cls(
            names=tuple(r[0] for r in rows),
            cpu_milli=np.array([r[1] for r in rows], dtype=np.int64),
            memory_mib=np.array([r[2] for r in rows], dtype=np.int64),
            gpus=np.array([r[3] for r in rows], dtype=np.int64),
        )

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def capacity_gpus(self) -> int:
        return int(self.gpus.sum())


class OverCommitError(RuntimeError):
    """A strategy chose a placement that does not fit (a bug, never expected)."""


class ClusterState:
    """Free resources of every node, changed only by :meth:`place`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        width = max(1, int(cluster.gpus.max(initial=0)))
        self.free_cpu: IntArray = cluster.cpu_milli.copy()
        self.free_memory: IntArray = cluster.memory_mib.copy()
        # Absent GPUs are columns with 0 free: they never fit and add nothing.
        self.gpu: IntArray = np.where(
            np.arange(width)[None, :] < cluster.gpus[:, None], MILLI, 0
        ).astype(np.int64)
        self.full: IntArray = cluster.gpus.copy()
        self.max_free: IntArray = self.gpu.max(axis=1)
        self.free_gpu: IntArray = self.gpu.sum(axis=1)

    def feasible(self, shape: TaskShape) -> BoolArray:
        """Nodes where the shape fits now."""
        mask: BoolArray = (self.free_cpu >= shape.cpu_milli) & (
            self.free_memory >= shape.memory_mib
        )
        if shape.gpus:
            mask &= self.full >= shape.gpus
        elif shape.gpu_milli:
            mask &= self.max_free >= shape.gpu_milli
        return mask

    def place(self, node: int, gpus: Sequence[int], shape: TaskShape) -> None:
        """Book the shape on the node's GPUs; OverCommitError if anything would go negative."""
        take = MILLI if shape.gpus else shape.gpu_milli
        wanted = shape.gpus if shape.gpus else (1 if shape.gpu_milli else 0)
        row = self.gpu[node]
        if len(set(gpus)) != wanted or any(row[g] < take for g in gpus):
            raise OverCommitError(f"{shape} on node {node} GPUs {tuple(gpus)}: {row.tolist()}")
        if self.free_cpu[node] < shape.cpu_milli or self.free_memory[node] < shape.memory_mib:
            raise OverCommitError(f"{shape} on node {node}: not enough CPU or memory")
        for g in gpus:
            row[g] -= take
        self.free_cpu[node] -= shape.cpu_milli
        self.free_memory[node] -= shape.memory_mib
        self.full[node] = int((row >= MILLI).sum())
        self.max_free[node] = int(row.max())
        self.free_gpu[node] = int(row.sum())

    def node_free(self, node: int) -> NodeFree:
        count = int(self.cluster.gpus[node])
        return NodeFree(
            int(self.free_cpu[node]),
            int(self.free_memory[node]),
            tuple(int(x) for x in self.gpu[node, :count]),
        )

    @property
    def unallocated_milli(self) -> int:
        return int(self.free_gpu.sum())


Choice = tuple[int, tuple[int, ...]]
"""A node index and the indices of the GPUs taken there."""


class Strategy(Protocol):
    def choose(self, state: ClusterState, shape: TaskShape, nodes: IntArray) -> Choice:
        """Where to place the shape; ``nodes`` (non-empty) are the nodes where it fits."""
        ...

    def placed(self, state: ClusterState, node: int) -> None:
        """Called after every placement, so a strategy can refresh what it keeps per node."""
        ...


@dataclass(frozen=True)
class BenchContext:
    """What a strategy may know: the cluster, the target workload and the seed."""

    cluster: Cluster
    model: FragmentationModel
    seed: int


StrategyFactory = Callable[[BenchContext], Strategy]


def _whole_gpus(state: ClusterState, node: int, count: int) -> tuple[int, ...]:
    full = np.flatnonzero(state.gpu[node] >= MILLI)
    return tuple(int(g) for g in full[:count])


def _tightest_gpu(state: ClusterState, node: int, milli: int) -> tuple[int, ...]:
    """The GPU with least free milli that still holds ``milli`` (lowest index on ties)."""
    row = state.gpu[node]
    return (int(np.argmin(np.where(row >= milli, row, MILLI + 1))),)


def _default_gpus(state: ClusterState, node: int, shape: TaskShape) -> tuple[int, ...]:
    if shape.gpus:
        return _whole_gpus(state, node, shape.gpus)
    if shape.gpu_milli:
        return _tightest_gpu(state, node, shape.gpu_milli)
    return ()


class _Stateless:
    def placed(self, state: ClusterState, node: int) -> None:
        return None


class RandomFit(_Stateless):
    def __init__(self, context: BenchContext) -> None:
        self.rng = random.Random(f"random-fit:{context.seed}")

    def choose(self, state: ClusterState, shape: TaskShape, nodes: IntArray) -> Choice:
        node = int(nodes[self.rng.randrange(len(nodes))])
        row = state.gpu[node]
        if shape.gpus:
            full = [int(g) for g in np.flatnonzero(row >= MILLI)]
            return node, tuple(sorted(self.rng.sample(full, shape.gpus)))
        if shape.gpu_milli:
            holding = [int(g) for g in np.flatnonzero(row >= shape.gpu_milli)]
            return node, (self.rng.choice(holding),)
        return node, ()


class BestFit(_Stateless):
    def __init__(self, context: BenchContext) -> None:
        cluster = context.cluster
        self.gpu_scale = max(1, int(cluster.gpus.max(initial=0))) * MILLI
        self.cpu_scale = max(1, int(cluster.cpu_milli.max(initial=0)))
        self.memory_scale = max(1, int(cluster.memory_mib.max(initial=0)))

    def choose(self, state: ClusterState, shape: TaskShape, nodes: IntArray) -> Choice:
        left = (
            (state.free_gpu[nodes] - shape.gpu_demand_milli) / self.gpu_scale
            + (state.free_cpu[nodes] - shape.cpu_milli) / self.cpu_scale
            + (state.free_memory[nodes] - shape.memory_mib) / self.memory_scale
        )
        node = int(nodes[int(np.argmin(left))])
        return node, _default_gpus(state, node, shape)


class DotProduct(_Stateless):
    def __init__(self, context: BenchContext) -> None:
        cluster = context.cluster
        self.gpu_capacity = (cluster.gpus * MILLI).astype(np.float64)
        self.cpu_capacity = np.maximum(cluster.cpu_milli, 1).astype(np.float64)
        self.memory_capacity = np.maximum(cluster.memory_mib, 1).astype(np.float64)

    def choose(self, state: ClusterState, shape: TaskShape, nodes: IntArray) -> Choice:
        gpu_cap = self.gpu_capacity[nodes]
        cpu_cap = self.cpu_capacity[nodes]
        memory_cap = self.memory_capacity[nodes]
        with np.errstate(divide="ignore", invalid="ignore"):
            gpu_term = np.where(
                gpu_cap > 0, shape.gpu_demand_milli * state.free_gpu[nodes] / gpu_cap**2, 0.0
            )
        score = (
            gpu_term
            + shape.cpu_milli * state.free_cpu[nodes] / cpu_cap**2
            + shape.memory_mib * state.free_memory[nodes] / memory_cap**2
        )
        node = int(nodes[int(np.argmax(score))])
        return node, _default_gpus(state, node, shape)


class GpuPacking(_Stateless):
    def __init__(self, context: BenchContext) -> None:
        self.capacity_milli = context.cluster.gpus * MILLI

    def choose(self, state: ClusterState, shape: TaskShape, nodes: IntArray) -> Choice:
        in_use = state.free_gpu[nodes] < self.capacity_milli[nodes]
        if shape.gpu_milli:
            rows = state.gpu[nodes]
            holds = rows >= shape.gpu_milli
            tier = np.where(rows < MILLI, 0, np.where(in_use[:, None], 1, 2))
            big = np.int64(1 << 40)
            # Lexicographic key (tier, free on the GPU, node index, GPU index) as one integer.
            key = np.where(
                holds,
                ((tier * (MILLI + 1) + rows) * (len(state.gpu) + 1) + nodes[:, None])
                * rows.shape[1]
                + np.arange(rows.shape[1])[None, :],
                big,
            )
            flat = int(np.argmin(key))
            row, column = divmod(flat, rows.shape[1])
            return int(nodes[row]), (column,)
        if shape.gpus:
            key = np.where(in_use, 0, 1 << 20) + state.full[nodes]
            node = int(nodes[int(np.argmin(key))])
            return node, _whole_gpus(state, node, shape.gpus)
        key = state.free_gpu[nodes] * (1 << 24) + state.free_cpu[nodes]
        return int(nodes[int(np.argmin(key))]), ()


class FragmentationAware:
    """budgethub: least growth of fragmentation with respect to the target workload."""

    def __init__(self, context: BenchContext) -> None:
        model = context.model
        fractions = len(model.fraction_demands)
        fit = np.array(model.fit_table, dtype=np.float64).reshape(
            len(model.fit_table), len(model.cpu_thresholds) + 1, len(model.memory_thresholds) + 1
        )
        # Popularity fitting (cpu rank, memory rank), cumulative over the classes sorted by
        # demand: [..., r] sums the r smallest fraction (or whole) demands.
        self.fraction_table = self._cumulative(fit[:fractions])
        self.whole_table = self._cumulative(fit[fractions:])
        self.cpu_thresholds = np.array(model.cpu_thresholds, dtype=np.int64)
        self.memory_thresholds = np.array(model.memory_thresholds, dtype=np.int64)
        # How many fraction demands are <= x milli, and whole demands <= f GPUs.
        self.fraction_rank = np.searchsorted(
            np.array(model.fraction_demands, dtype=np.int64), np.arange(MILLI + 1), "right"
        )
        width = max(1, int(context.cluster.gpus.max(initial=0)))
        self.whole_rank = np.searchsorted(
            np.array(model.whole_demands, dtype=np.int64), np.arange(width + 1), "right"
        )
        self.usable: FloatArray | None = None

    @staticmethod
    def _cumulative(classes: FloatArray) -> FloatArray:
        table = np.zeros(classes.shape[1:] + (classes.shape[0] + 1,))
        np.cumsum(np.moveaxis(classes, 0, -1), axis=-1, out=table[..., 1:])
        return table

    def _ranks(
        self, state: ClusterState, nodes: IntArray, cpu: int, memory: int
    ) -> tuple[IntArray, IntArray]:
        """Table rows for each node's CPU and memory once ``cpu`` and ``memory`` are taken
        (negative free maps to row 0, where nothing fits)."""
        i = np.searchsorted(self.cpu_thresholds, state.free_cpu[nodes] - cpu, "right")
        j = np.searchsorted(self.memory_thresholds, state.free_memory[nodes] - memory, "right")
        return i, j

    def _per_gpu(self, i: IntArray, j: IntArray, free: IntArray) -> FloatArray:
        """Expected usable milli of each GPU with ``free`` milli (nodes × GPUs)."""
        result: FloatArray = (
            free * self.fraction_table[i[:, None], j[:, None], self.fraction_rank[free]]
        )
        return result

    def _whole(self, i: IntArray, j: IntArray, full: IntArray) -> FloatArray:
        """Expected usable milli of ``full`` completely free GPUs for whole-GPU shapes."""
        result: FloatArray = MILLI * full * self.whole_table[i, j, self.whole_rank[full]]
        return result

    def expected_usable(self, state: ClusterState, nodes: IntArray) -> FloatArray:
        """FragmentationModel.expected_usable for the given nodes, vectorised."""
        i, j = self._ranks(state, nodes, 0, 0)
        result: FloatArray = self._per_gpu(i, j, state.gpu[nodes]).sum(axis=1) + self._whole(
            i, j, state.full[nodes]
        )
        return result

    def placed(self, state: ClusterState, node: int) -> None:
        if self.usable is not None:
            nodes = np.array([node], dtype=np.int64)
            self.usable[node] = self.expected_usable(state, nodes)[0]

    def gains(self, state: ClusterState, shape: TaskShape, nodes: IntArray) -> FloatArray:
        """Change of expected usable GPU per candidate: nodes × GPUs for a fraction, else
        nodes × 1; -inf where the candidate does not fit. Larger is better."""
        if self.usable is None:
            self.usable = self.expected_usable(state, np.arange(state.cluster.size))
        i, j = self._ranks(state, nodes, shape.cpu_milli, shape.memory_mib)
        free = state.gpu[nodes]
        per_gpu = self._per_gpu(i, j, free)
        total = per_gpu.sum(axis=1) - self.usable[nodes]
        full = state.full[nodes]
        if shape.gpus:
            lost = shape.gpus * MILLI * self.fraction_table[i, j, -1]
            gain: FloatArray = (total - lost + self._whole(i, j, full - shape.gpus))[:, None]
            return gain
        if not shape.gpu_milli:
            gain = (total + self._whole(i, j, full))[:, None]
            return gain
        holds = free >= shape.gpu_milli
        left = np.where(holds, free - shape.gpu_milli, 0)
        whole_kept = self._whole(i, j, full)
        whole_lost = self._whole(i, j, np.maximum(full - 1, 0)) - whole_kept
        after = (
            (total + whole_kept)[:, None]
            - per_gpu
            + self._per_gpu(i, j, left)
            + np.where(free >= MILLI, whole_lost[:, None], 0.0)
        )
        gain = np.where(holds, after, -np.inf)
        return gain

    def choose(self, state: ClusterState, shape: TaskShape, nodes: IntArray) -> Choice:
        gain = self.gains(state, shape, nodes)
        rows, columns = np.nonzero(gain == gain.max())
        pick = 0
        if len(rows) > 1:
            node_free = state.free_gpu[nodes[rows]]
            gpu_free = state.gpu[nodes[rows], columns] if shape.gpu_milli else columns
            pick = int(np.lexsort((columns, rows, gpu_free, node_free))[0])
        node = int(nodes[rows[pick]])
        if shape.gpu_milli:
            return node, (int(columns[pick]),)
        return node, _whole_gpus(state, node, shape.gpus) if shape.gpus else ()


STRATEGIES: Mapping[str, StrategyFactory] = {
    "random-fit": RandomFit,
    "best-fit": BestFit,
    "dot-product": DotProduct,
    "gpu-packing": GpuPacking,
    "budgethub": FragmentationAware,
}
"""Placement strategies by name; every benchmark run uses all of them unless told otherwise."""


# --- the experiment ------------------------------------------------------------


def task_sequence(
    population: Sequence[TaskShape], capacity_gpus: int, seed: int, last_point: int = POINTS[-1]
) -> list[TaskShape]:
    """Random passes over the population until the GPU demand reaches ``last_point`` %."""
    if not any(shape.gpu_demand_milli for shape in population):
        raise ValueError("no task in the population asks for a GPU")
    target = math.ceil(capacity_gpus * MILLI * last_point / 100)
    rng = random.Random(seed)
    sequence: list[TaskShape] = []
    demand = 0
    while demand < target:
        order = list(population)
        rng.shuffle(order)
        for shape in order:
            sequence.append(shape)
            demand += shape.gpu_demand_milli
            if demand >= target:
                break
    return sequence


@dataclass(frozen=True)
class PointResult:
    """The cluster when the arrived GPU demand first reached a point."""

    unallocated_gpus: float
    arrived_tasks: int
    failed_tasks: int
    failed_gpus: float


def run_strategy(
    cluster: Cluster,
    sequence: Sequence[TaskShape],
    strategy: Strategy,
    points: Sequence[int] = POINTS,
    state: ClusterState | None = None,
) -> dict[int, PointResult]:
    """Place the sequence in order; the cluster's state at each point of arrived demand."""
    state = state or ClusterState(cluster)
    targets = [(p, cluster.capacity_gpus * MILLI * p / 100) for p in sorted(points)]
    results: dict[int, PointResult] = {}
    demand = failed = failed_milli = 0
    for arrived, shape in enumerate(sequence, start=1):
        nodes = np.flatnonzero(state.feasible(shape))
        if len(nodes):
            node, gpus = strategy.choose(state, shape, nodes)
            state.place(node, gpus, shape)
            strategy.placed(state, node)
        else:
            failed += 1
            failed_milli += shape.gpu_demand_milli
        demand += shape.gpu_demand_milli
        while targets and demand >= targets[0][1]:
            point = targets.pop(0)[0]
            results[point] = PointResult(
                state.unallocated_milli / MILLI, arrived, failed, failed_milli / MILLI
            )
        if not targets:
            break
    return results


@dataclass
class BenchResult:
    """Per strategy and point, one value per seed."""

    capacity_gpus: int
    nodes: int
    seeds: list[int]
    population: int
    runs: dict[str, list[dict[int, PointResult]]] = field(default_factory=dict)
    wall_s: float = 0.0

    def mean_unallocated(self, strategy: str, point: int) -> float:
        values = [run[point].unallocated_gpus for run in self.runs[strategy]]
        return round(sum(values) / len(values), 3)

    def to_json(self) -> dict[str, Any]:
        """``{"capacity_gpus", "results": {strategy: {"100": mean, "130": mean}}, ...}``."""

        def per_seed(attribute: str) -> dict[str, dict[str, list[float | int]]]:
            return {
                name: {
                    str(p): [getattr(run[p], attribute) for run in runs] for p in sorted(runs[0])
                }
                for name, runs in self.runs.items()
            }

        return {
            "capacity_gpus": self.capacity_gpus,
            "results": {
                name: {str(p): self.mean_unallocated(name, p) for p in sorted(runs[0])}
                for name, runs in self.runs.items()
            },
            "nodes": self.nodes,
            "population": self.population,
            "seeds": self.seeds,
            "unallocated_gpus_per_seed": per_seed("unallocated_gpus"),
            "failed_tasks_per_seed": per_seed("failed_tasks"),
            "failed_gpus_per_seed": per_seed("failed_gpus"),
            "arrived_tasks_per_seed": per_seed("arrived_tasks"),
            "wall_s": round(self.wall_s, 2),
        }


def run_benchmark(
    cluster: Cluster,
    population: Sequence[TaskShape],
    seeds: Sequence[int],
    strategies: Sequence[str] = tuple(STRATEGIES),
    points: Sequence[int] = POINTS,
    progress: Callable[[], object] | None = None,
) -> BenchResult:
    """Every strategy on the same task sequence per seed; ``progress`` is called per run."""
    unknown = [name for name in strategies if name not in STRATEGIES]
    if unknown:
        raise KeyError(unknown[0])
    model = FragmentationModel(reduce_workload(population))
    result = BenchResult(
        capacity_gpus=cluster.capacity_gpus,
        nodes=cluster.size,
        seeds=list(seeds),
        population=len(population),
        runs={name: [] for name in strategies},
    )
    for seed in seeds:
        sequence = task_sequence(population, cluster.capacity_gpus, seed, max(points))
        context = BenchContext(cluster, model, seed)
        for name in strategies:
            strategy = STRATEGIES[name](context)
            result.runs[name].append(run_strategy(cluster, sequence, strategy, points))
            if progress is not None:
                progress()
    return result
