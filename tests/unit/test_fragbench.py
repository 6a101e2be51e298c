"""Fragmentation (scheduler_core.research.fragmentation) and the placement benchmark (fragbench)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.builders import TEST_DATA
from scheduler_core.research.cli import main
from scheduler_core.research.fragbench import (
    STRATEGIES,
    BenchContext,
    Cluster,
    ClusterState,
    FragmentationAware,
    run_benchmark,
    run_strategy,
    task_sequence,
)
from scheduler_core.research.fragmentation import (
    FragmentationModel,
    NodeFree,
    Placement,
    TaskShape,
    candidate_placements,
    choose_placement,
    fragmentation_delta,
    node_fragmentation,
    reduce_workload,
    task_fragmentation,
)
from scheduler_core.research.traces import read_nodes, read_pod_shapes, read_pods

PODS = TEST_DATA / "openb_pods_small.csv"
NODES = TEST_DATA / "openb_nodes_small.csv"

WHOLE = TaskShape(4000, 16384, gpus=1)
HALF = TaskShape(2000, 8192, gpu_milli=500)
CPU_ONLY = TaskShape(8000, 4096)


# --- fragmentation ------------------------------------------------------------


def test_no_fragmentation_when_every_shape_can_use_all_free_gpu() -> None:
    workload = [(WHOLE, 3.0), (HALF, 1.0), (CPU_ONLY, 5.0)]
    idle = NodeFree(64000, 262144, (1000, 1000, 1000, 1000))
    assert node_fragmentation(idle, workload) == 0.0
    # a half-used GPU is no fragment for a workload of halves
    assert node_fragmentation(NodeFree(64000, 262144, (500, 1000)), [(HALF, 1.0)]) == 0.0
    assert FragmentationModel(workload).fragmentation(idle) == 0.0


def test_fragmentation_of_a_fragmented_node() -> None:
    workload = [(WHOLE, 1.0), (HALF, 1.0)]
    # 300 milli left on a GPU: neither a whole GPU nor a half can use it
    assert node_fragmentation(NodeFree(64000, 262144, (1000, 300)), workload) == 300.0
    # 700 left: the half can use it, the whole GPU task can not
    assert task_fragmentation(NodeFree(64000, 262144, (700,)), HALF) == 0
    assert node_fragmentation(NodeFree(64000, 262144, (700,)), workload) == 350.0
    # free GPUs but no CPU left: all of it is stranded for every GPU shape
    assert node_fragmentation(NodeFree(1000, 262144, (1000, 1000)), workload) == 2000.0


def test_placing_a_half_next_to_a_half_adds_no_fragmentation() -> None:
    workload = [(HALF, 1.0)]
    free = NodeFree(64000, 262144, (500, 1000))
    deltas = {
        p.gpus: fragmentation_delta(free, p, workload) for p in candidate_placements(free, HALF)
    }
    assert deltas == {(0,): 0.0, (1,): 0.0}
    mixed = [(HALF, 1.0), (WHOLE, 1.0)]
    model = FragmentationModel(mixed)
    best = model.best_placement(free, HALF)
    assert best is not None and best[1].gpus == (0,)  # keep the whole GPU whole
    assert fragmentation_delta(free, Placement(HALF, (1,)), mixed) > 0


shapes = st.one_of(
    st.builds(
        TaskShape,
        st.integers(0, 16000),
        st.integers(0, 65536),
        st.integers(1, 4),
        st.just(0),
    ),
    st.builds(
        TaskShape, st.integers(0, 16000), st.integers(0, 65536), st.just(0), st.integers(1, 999)
    ),
    st.builds(TaskShape, st.integers(0, 16000), st.integers(0, 65536)),
)
nodes = st.builds(
    NodeFree,
    st.integers(0, 32000),
    st.integers(0, 131072),
    st.lists(st.sampled_from([0, 50, 190, 250, 500, 540, 810, 1000]), max_size=8).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(shapes, st.integers(1, 20)), min_size=1, max_size=8), nodes)
def test_model_matches_the_definition(
    workload_counts: list[tuple[TaskShape, int]], free: NodeFree
) -> None:
    workload = [(shape, float(count)) for shape, count in workload_counts]
    model = FragmentationModel(workload)
    assert model.fragmentation(free) == pytest.approx(node_fragmentation(free, workload), abs=1e-6)
    for shape, _ in workload:
        for placement in candidate_placements(free, shape):
            assert model.delta(free, placement) == pytest.approx(
                fragmentation_delta(free, placement, workload), abs=1e-6
            )


def test_benchmark_strategy_matches_the_definition() -> None:
    """budgethub's vectorised gains rank candidates exactly as fragmentation_delta does."""
    rng = random.Random(7)
    population = [
        TaskShape(
            rng.choice([1000, 4000, 12000]), rng.choice([2048, 16384, 49152]), gpus=g, gpu_milli=m
        )
        for g, m in [(1, 0), (0, 460), (0, 810), (2, 0), (0, 250), (0, 0)] * 3
    ]
    workload = reduce_workload(population)
    model = FragmentationModel(workload)
    cluster = Cluster.build([(f"n{i}", 64000, 262144, 4) for i in range(6)])
    state = ClusterState(cluster)
    for shape in population[:10]:  # make the nodes different
        node = rng.choice(list(np.flatnonzero(state.feasible(shape))))
        state.place(
            int(node), candidate_placements(state.node_free(int(node)), shape)[-1].gpus, shape
        )
    strategy = FragmentationAware(BenchContext(cluster, model, 0))
    for shape, _ in workload:
        feasible = np.flatnonzero(state.feasible(shape))
        gains = strategy.gains(state, shape, feasible)
        for row, node in enumerate(feasible):
            free = state.node_free(int(node))
            for placement in candidate_placements(free, shape):
                column = placement.gpus[0] if shape.gpu_milli else 0
                delta = fragmentation_delta(free, placement, workload)
                expected = (
                    -model.gpu_popularity * shape.gpu_demand_milli - model.total_popularity * delta
                )
                assert gains[row, column] == pytest.approx(expected, abs=1e-6)


# --- the benchmark --------------------------------------------------------------


def small_cluster() -> Cluster:
    return Cluster.build(
        [
            ("a", 96000, 393216, 8),
            ("b", 16000, 65536, 2),
            ("c", 64000, 262144, 4),
            ("d", 8000, 32768, 1),
        ]
    )


def population() -> list[TaskShape]:
    rng = random.Random(3)
    return [
        TaskShape(rng.choice([1000, 3152, 8000]), rng.choice([4096, 16384]), gpus=g, gpu_milli=m)
        for g, m in [(1, 0), (0, 460), (0, 810), (0, 230), (2, 0), (0, 0), (0, 650)] * 4
    ]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_strategies_never_over_commit(name: str) -> None:
    cluster = small_cluster()
    model = FragmentationModel(reduce_workload(population()))
    for seed in range(3):
        state = ClusterState(cluster)
        sequence = task_sequence(population(), cluster.capacity_gpus, seed, 130)
        results = run_strategy(
            cluster, sequence, STRATEGIES[name](BenchContext(cluster, model, seed)), state=state
        )
        assert set(results) == {100, 130}
        assert (state.gpu >= 0).all() and (state.gpu <= 1000).all()
        assert (state.free_cpu >= 0).all() and (state.free_memory >= 0).all()
        assert (state.free_gpu == state.gpu.sum(axis=1)).all()
        for node in range(cluster.size):  # absent GPUs stay empty
            assert (state.gpu[node, cluster.gpus[node] :] == 0).all()
        placed = sum(s.gpu_demand_milli for s in sequence) - results[130].failed_gpus * 1000
        assert cluster.capacity_gpus * 1000 - state.unallocated_milli == pytest.approx(placed)


def test_sequence_reaches_the_last_point_and_depends_on_the_seed() -> None:
    shapes = population()
    sequence = task_sequence(shapes, 17, seed=1, last_point=130)
    demand = sum(s.gpu_demand_milli for s in sequence)
    assert demand >= 17 * 1300 > demand - sequence[-1].gpu_demand_milli
    assert sequence == task_sequence(shapes, 17, seed=1, last_point=130)
    assert sequence != task_sequence(shapes, 17, seed=2, last_point=130)


def test_results_are_deterministic_per_seed() -> None:
    cluster = small_cluster()
    first = run_benchmark(cluster, population(), [0, 1]).to_json()
    second = run_benchmark(cluster, population(), [0, 1]).to_json()
    assert first == second
    assert set(first["results"]) == set(STRATEGIES)


def test_json_output_shape(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["bench", "placement", "--pods", str(PODS), "--nodes", str(NODES), "--seeds", "2", "--json"]
    )
    out, err = capsys.readouterr()
    assert status == 0 and err == ""
    data = json.loads(out)
    capacity = sum(n.gpus for n in read_nodes(NODES))
    assert data["capacity_gpus"] == capacity == 10
    assert set(data["results"]) == {
        "random-fit",
        "best-fit",
        "dot-product",
        "gpu-packing",
        "budgethub",
    }
    for points in data["results"].values():
        assert set(points) == {"100", "130"}
        assert all(isinstance(v, float | int) and 0 <= v <= capacity for v in points.values())
    assert len(data["failed_tasks_per_seed"]["budgethub"]["100"]) == 2
    assert data["population"] == len(read_pods(PODS))


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["bench", "placement", "--pods", str(PODS), "--nodes", str(NODES), "--seeds", "1"]
    )
    out, _ = capsys.readouterr()
    assert status == 0
    assert all(name in out for name in STRATEGIES) and "unalloc@100%" in out


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "placement", "--pods", str(PODS), "--nodes", str(NODES)]
    assert main([*args, "--seeds", "0"]) == 2
    assert main([*args, "--strategies", "first-fit"]) == 2
    assert capsys.readouterr().err.count("\n") == 2


def test_live_helper_chooses_as_the_benchmark_strategy() -> None:
    """choose_placement on plain NodeFree data picks what the vectorised strategy picks."""
    cluster = small_cluster()
    shapes = population()
    model = FragmentationModel(reduce_workload(shapes))
    state = ClusterState(cluster)
    strategy = FragmentationAware(BenchContext(cluster, model, 0))
    for shape in task_sequence(shapes, cluster.capacity_gpus, seed=4, last_point=130):
        feasible = np.flatnonzero(state.feasible(shape))
        frees = [state.node_free(n) for n in range(cluster.size)]
        chosen = choose_placement(frees, shape, model)
        if not len(feasible):
            assert chosen is None
            continue
        node, gpus = strategy.choose(state, shape, feasible)
        assert chosen is not None and chosen == (node, Placement(shape, gpus))
        state.place(node, gpus, shape)
        strategy.placed(state, node)


def test_shapes_from_scheduler_units() -> None:
    assert TaskShape.of(3.152, 5.46875, gpu_milli=810) == TaskShape(3152, 5600, 0, 810)
    assert NodeFree.of(96, 384, [1000, 190]) == NodeFree(96000, 393216, (1000, 190))
    with pytest.raises(ValueError):
        TaskShape(1000, 1024, gpus=1, gpu_milli=500)


# --- shape-only pod lists (the trace's multi-GPU and GPU-sharing variants) ------------


SHAPE_ONLY = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
    "m-1,32000,131072,4,1000\n"
    "m-2,88000,327680,8,1000\n"
    "s-1,6000,12288,1,300\n"
    "s-2,6000,12288,1,700\n"
    "c-1,8000,4096,0,0\n"
)


def shape_only_pods(tmp_path: Path, text: str = SHAPE_ONLY) -> Path:
    path = tmp_path / "openb_pod_list_multigpu.csv"
    path.write_text(text)
    return path


def test_placement_takes_a_pod_list_with_only_the_shape_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = shape_only_pods(tmp_path)
    args = ["bench", "placement", "--pods", str(pods), "--nodes", str(NODES), "--seeds", "2"]
    assert main([*args, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    data = json.loads(out)
    assert data["population"] == 5 and data["capacity_gpus"] == 10
    assert set(data["results"]) == set(STRATEGIES)


def test_shapes_of_a_shape_only_list_are_those_of_the_full_list(tmp_path: Path) -> None:
    lines = PODS.read_text().splitlines()
    cut = "\n".join(",".join(line.split(",")[:5]) for line in lines) + "\n"
    assert read_pod_shapes(shape_only_pods(tmp_path, cut)) == [t.shape for t in read_pods(PODS)]
    assert read_pod_shapes(PODS) == [t.shape for t in read_pods(PODS)]
    assert read_pod_shapes(shape_only_pods(tmp_path))[2] == TaskShape(6000, 12288, gpu_milli=300)


def test_placement_still_needs_the_shape_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = shape_only_pods(tmp_path, SHAPE_ONLY.replace(",gpu_milli", "", 1))
    args = ["bench", "placement", "--pods", str(pods), "--nodes", str(NODES), "--seeds", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{pods}:1:gpu_milli: missing column 'gpu_milli'" in err
