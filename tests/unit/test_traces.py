"""Importing the Alibaba GPU trace as a scenario (scheduler_core.research.traces)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from harness.builders import TEST_DATA
from scheduler_core.errors import InputError
from scheduler_core.research.cli import main
from scheduler_core.research.traces import (
    ImportOptions,
    dump_scenario,
    import_alibaba_openb,
    read_nodes,
    read_pods,
)

PODS = TEST_DATA / "openb_pods_small.csv"
NODES = TEST_DATA / "openb_nodes_small.csv"
TRACE = Path(os.environ.get("BUDGETHUB_OPENB") or "/nonexistent")
"""The released trace's folder (`cluster-trace-gpu-v2023/csv` of Alibaba's clusterdata),
named by ``BUDGETHUB_OPENB``; the tests on it are skipped without it (README, "The
Alibaba trace under load")."""

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def gpu_only_nodes(tmp_path: Path) -> Path:
    path = tmp_path / "gpu_nodes.csv"
    lines = NODES.read_text().splitlines()
    path.write_text("\n".join(line for line in lines if not line.startswith("cpu-")) + "\n")
    return path


def by_id(scenario: dict[str, object]) -> dict[str, dict[str, object]]:
    requests = scenario["requests"]
    assert isinstance(requests, list)
    return {r["id"]: r for r in requests}


def test_fixture_imports_to_the_expected_requests() -> None:
    scenario, report = import_alibaba_openb(PODS, NODES)
    requests = by_id(scenario)
    sizes = {
        rid: {k: v for k, v in r.items() if k not in {"id", "user", "team"}}
        for rid, r in requests.items()
    }
    assert sizes == {
        # whole GPU, latency-sensitive and longer than 15 min: interactive, 1 h protected
        "pod-a": {"submit": 0, "pool": "gpu", "gpus": 1, "cpus": 12.0, "memory_gib": 16.0,
                  "min_runtime": 3600, "duration": 4000, "class": "interactive"},
        # GPU-sharing, LS, short and small: debug; duration from scheduled_time
        "pod-b": {"submit": 100, "pool": "gpu", "gpu_fraction": 0.46, "cpus": 6.0,
                  "memory_gib": 12.0, "min_runtime": 290, "duration": 290, "class": "debug"},
        # Burstable: batch, 8 h protection
        "pod-c": {"submit": 200, "pool": "gpu", "gpus": 8, "cpus": 88.0, "memory_gib": 320.0,
                  "min_runtime": 28800, "duration": 90000, "class": "batch"},
        # CPU-only, BE, Failed but it ran: cpu pool, batch, protection capped at its duration
        "pod-d": {"submit": 300, "pool": "cpu", "cpus": 8.0, "memory_gib": 30517 / 1024,
                  "min_runtime": 999, "duration": 999, "class": "batch"},
        # Guaranteed without deletion_time: runs to the end of the trace (90300)
        "pod-e": {"submit": 400, "pool": "gpu", "gpu_fraction": 0.25, "cpus": 4.0,
                  "memory_gib": 8.0, "min_runtime": 3600, "duration": 89800,
                  "class": "interactive"},
        # two whole GPUs, LS, 5 min: within the debug envelope
        "pod-g": {"submit": 600, "pool": "gpu", "gpus": 2, "cpus": 3.0, "memory_gib": 4.0,
                  "min_runtime": 300, "duration": 300, "class": "debug"},
    }  # fmt: skip
    assert report.tasks == 8 and report.imported == 6
    assert dict(report.skipped) == {"pending (never ran)": 1, "fitting no node": 1}
    assert dict(report.fallbacks) == {"deletion_time at trace end": 1}
    assert scenario["horizon"] == 90200
    assert scenario["pools"] == [{"name": "gpu", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"}]
    assert scenario["nodes"] == [
        {"name": "node-1", "pool": "gpu", "gpus": 8, "gpu_model": "G2", "cpus": 96.0,
         "memory_gib": 384.0},
        {"name": "node-2", "pool": "gpu", "gpus": 2, "gpu_model": "P100", "cpus": 16.0,
         "memory_gib": 64.0},
        {"name": "cpu-1", "pool": "cpu", "gpus": 0, "cpus": 32.0, "memory_gib": 64.0},
    ]  # fmt: skip


def test_teams_users_and_shares() -> None:
    scenario, _ = import_alibaba_openb(PODS, NODES, ImportOptions(teams=4, skew=0.0))
    teams = scenario["teams"]
    assert [t["name"] for t in teams] == ["team-01", "team-02", "team-03", "team-04"]
    assert all(t["share"] == {"gpu": 0.25, "cpu": 0.25} for t in teams)
    for request in by_id(scenario).values():
        assert request["team"] in {t["name"] for t in teams}
        assert str(request["user"]).startswith(f"{request['team']}-u")
    skewed, _ = import_alibaba_openb(PODS, NODES, ImportOptions(teams=15))
    shares = [t["share"]["gpu"] for t in skewed["teams"]]
    assert shares == sorted(shares, reverse=True) and sum(shares) <= 1.0
    single, _ = import_alibaba_openb(PODS, NODES, ImportOptions(teams=1))
    assert {r["team"] for r in single["requests"]} == {"team-01"}


def test_gpu_only_node_list_skips_cpu_only_tasks(tmp_path: Path) -> None:
    scenario, report = import_alibaba_openb(PODS, gpu_only_nodes(tmp_path))
    assert scenario["pools"] == [{"name": "gpu", "kind": "gpu"}]
    assert set(by_id(scenario)) == {"pod-a", "pod-b", "pod-c", "pod-e", "pod-g"}
    assert report.skipped["needing the missing cpu pool"] == 2
    assert all(set(t["share"]) == {"gpu"} for t in scenario["teams"])


def test_import_is_deterministic_and_valid_json() -> None:
    first = dump_scenario(import_alibaba_openb(PODS, NODES)[0])
    second = dump_scenario(import_alibaba_openb(PODS, NODES)[0])
    assert first == second
    assert json.loads(first) == import_alibaba_openb(PODS, NODES)[0]


def test_scenario_loads_in_the_simulator() -> None:
    scenario_module = pytest.importorskip("scheduler_core.scenario")
    scenario, _ = import_alibaba_openb(PODS, NODES)
    parsed = scenario_module.parse_scenario(json.loads(dump_scenario(scenario)))
    assert len(parsed.requests) == 6


def test_cli_prints_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["trace", "import", "alibaba-openb", "--pods", str(PODS), "--nodes", str(NODES)])
    out, err = capsys.readouterr()
    assert status == 0
    assert json.loads(out)["name"] == "alibaba-openb"
    assert err.count("\n") == 1 and "imported 6 of 8 tasks" in err


def test_time_scale_packs_arrivals_and_keeps_run_lengths() -> None:
    plain, _ = import_alibaba_openb(PODS, NODES)
    packed, _ = import_alibaba_openb(PODS, NODES, ImportOptions(time_scale=4.0))
    before, after = by_id(plain), by_id(packed)
    assert before.keys() == after.keys()
    for rid, request in before.items():
        assert after[rid]["submit"] == pytest.approx(request["submit"] / 4, abs=1e-3)
        assert after[rid]["duration"] == request["duration"]
    assert [r["id"] for r in packed["requests"]] == [r["id"] for r in plain["requests"]]
    assert all(r["submit"] + r["duration"] <= packed["horizon"] for r in packed["requests"])


@pytest.mark.parametrize("value", ["0", "-2", "nan"])
def test_cli_refuses_a_bad_time_scale(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["trace", "import", "alibaba-openb", "--pods", str(PODS), "--nodes", str(NODES)]
        + ["--time-scale", value]
    )
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert "--time-scale" in err and "is not a number > 0" in err


# --- bad input ----------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "pods.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_missing_column_names_the_header(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER.replace(",qos", "") + "p,1,1,0,0,,Running,1,2,1\n")
    with pytest.raises(InputError) as error:
        read_pods(path)
    assert error.value.where == f"{path}:1:qos"


SHAPE_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
"""The header of the trace's multi-GPU and GPU-sharing pod lists."""


def test_a_shape_only_list_names_the_columns_a_scenario_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, SHAPE_HEADER + "p,1000,1024,2,1000\n")
    status = main(["trace", "import", "alibaba-openb", "--pods", str(path), "--nodes", str(NODES)])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1
    assert f"{path}:1:qos: missing columns " in err
    assert "qos, pod_phase, creation_time, deletion_time, scheduled_time" in err
    assert "time-based scenario" in err and "bench placement" in err


def test_a_list_lacking_some_time_columns_names_just_those(tmp_path: Path) -> None:
    header = HEADER.replace(",creation_time", "").replace(",scheduled_time", "")
    path = write(tmp_path, header + "p,1,1,0,0,,BE,Running,2\n")
    with pytest.raises(InputError) as error:
        read_pods(path)
    assert error.value.where == f"{path}:1:creation_time"
    assert error.value.reason.startswith("missing columns creation_time, scheduled_time: ")


def test_gpu_spec_is_not_needed(tmp_path: Path) -> None:
    path = write(
        tmp_path, HEADER.replace(",gpu_spec", "") + "p,1000,1024,1,1000,LS,Running,1,2,1\n"
    )
    (task,) = read_pods(path)
    assert task.qos == "LS" and task.num_gpu == 1


def test_bad_number_names_line_and_column(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEADER
        + "p1,1000,1024,1,1000,,LS,Running,1,2,1\n"
        + "p2,lots,1024,1,1000,,LS,Running,1,2,1\n",
    )
    with pytest.raises(InputError) as error:
        read_pods(path)
    assert error.value.where == f"{path}:3:cpu_milli"
    assert "'lots' is not a number" in error.value.reason


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("p,1000,1024,1.5,1000,,LS,Running,1,2,1", "num_gpu"),
        ("p,1000,1024,1,1200,,LS,Running,1,2,1", "gpu_milli"),
        ("p,1000,-5,1,1000,,LS,Running,1,2,1", "memory_mib"),
        ("p,1000,1024,1,1000,,XX,Running,1,2,1", "qos"),
        ("p,1000,1024,1,1000,,LS,Lost,1,2,1", "pod_phase"),
        ("p,1000,1024,1,1000,,LS,Running,soon,2,1", "creation_time"),
        ("p,1000,1024,1,1000,,LS,Running,1,2", "scheduled_time"),
        (",1000,1024,1,1000,,LS,Running,1,2,1", "name"),
    ],
)
def test_bad_cells(tmp_path: Path, row: str, column: str) -> None:
    path = write(tmp_path, HEADER + row + "\n")
    with pytest.raises(InputError) as error:
        read_pods(path)
    assert error.value.where == f"{path}:2:{column}"


def test_empty_files(tmp_path: Path) -> None:
    empty = write(tmp_path, "")
    with pytest.raises(InputError) as error:
        read_pods(empty)
    assert error.value.where == f"{empty}:1:name"
    header_only = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\n", "nodes.csv")
    with pytest.raises(InputError) as error:
        read_nodes(header_only)
    assert error.value.where == f"{header_only}:2:sn"


def test_cli_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, HEADER + "p,1000,1024,one,1000,,LS,Running,1,2,1\n")
    status = main(["trace", "import", "alibaba-openb", "--pods", str(path), "--nodes", str(NODES)])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and f"{path}:2:num_gpu" in err


# --- the real trace -------------------------------------------------------------


@pytest.mark.skipif(not TRACE.is_dir(), reason="BUDGETHUB_OPENB names no folder with the trace")
@pytest.mark.parametrize(
    ("node_file", "imported"),
    [("openb_node_list_all_node.csv", 8152 - 897), ("openb_node_list_gpu_node.csv", 6203)],
)
def test_real_trace_imports(node_file: str, imported: int) -> None:
    pods = TRACE / "openb_pod_list_default.csv"
    nodes = TRACE / node_file
    scenario, report = import_alibaba_openb(pods, nodes)
    assert report.tasks == 8152
    assert report.skipped["pending (never ran)"] == 897
    assert len(scenario["requests"]) == report.imported == imported
    if node_file.endswith("gpu_node.csv"):
        # 1,088 CPU-only pods, 36 of them pending
        assert report.skipped["needing the missing cpu pool"] == 1088 - 36
    assert len(scenario["nodes"]) == len(read_nodes(nodes))
    assert sum(n["gpus"] for n in scenario["nodes"]) == 6212
    capacity: dict[str, set[tuple[float, float, int]]] = {}
    for node in scenario["nodes"]:
        capacity.setdefault(node["pool"], set()).add(
            (node["cpus"], node["memory_gib"], node["gpus"])
        )
    for request in scenario["requests"]:
        gpus = request.get("gpus", 1 if "gpu_fraction" in request else 0)
        assert any(
            request["cpus"] <= cpus and request["memory_gib"] <= memory and gpus <= node_gpus
            for cpus, memory, node_gpus in capacity[request["pool"]]
        ), request
        assert 0 < request["min_runtime"] <= request["duration"]
        assert request["submit"] + request["duration"] <= scenario["horizon"]
    assert min(r["submit"] for r in scenario["requests"]) == 0
    assert math.isclose(sum(t["share"]["gpu"] for t in scenario["teams"]), 1.0, abs_tol=1e-4)
