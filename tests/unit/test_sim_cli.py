"""`budgethub sim`: the formats, the summary table, and bad scenarios (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.builders import EXAMPLE
from scheduler_core.research.cli import main


def write(tmp_path: Path, data: Any) -> str:
    path = tmp_path / "scenario.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def base() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def test_result_has_the_section_5_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", str(EXAMPLE), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"] == "debug-fast-start"
    assert out["policy"] == "budget"
    assert isinstance(out["sim_wall_s"], float)
    ids = [r["id"] for r in out["requests"]]
    assert ids == ["r1", "r2", "r3", "r4"]
    for record in out["requests"]:
        assert set(record) >= {
            "id",
            "submit",
            "wait",
            "starts",
            "ends",
            "nodes",
            "funded",
            "preemptions",
            "finished",
        }
        assert len(record["starts"]) == len(record["nodes"]) == len(record["funded"])
    metrics = out["metrics"]
    assert set(metrics) >= {
        "wait_s",
        "occupancy",
        "unallocated_share",
        "preemptions",
        "lost_gpu_seconds",
        "teams",
    }
    assert set(metrics["wait_s"]["all"]) == {"n", "p50", "p90", "p99"}
    assert metrics["wait_s"]["all"]["n"] == 4
    assert metrics["wait_s"]["debug"]["n"] == 2
    for team in metrics["teams"].values():
        assert set(team) >= {"share", "owed_gpu_h", "delivered_gpu_h", "used_gpu_h", "fulfilment"}
    r4 = next(r for r in out["requests"] if r["id"] == "r4")
    assert r4["nodes"] == [["prep-1"]]  # the storage label
    r3 = next(r for r in out["requests"] if r["id"] == "r3")
    assert r3["nodes"] == [["mig-1"]]


def test_summary_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", str(EXAMPLE)]) == 0
    text = capsys.readouterr().out
    assert "occupancy" in text and "robotics" in text and "p90" in text


def test_policy_override_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", str(EXAMPLE), "--policy", "nope"]) == 2
    assert "--policy" in capsys.readouterr().err


def mutate(path: str, value: Any) -> dict[str, Any]:
    data = base()
    target: Any = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = keys[-1]
    if value is DELETE:
        del target[last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return data


DELETE = object()

BAD = [
    ("requests.0.gpus", -1, "requests[0].gpus", "at least 0"),
    ("teams.2.share", {"h100": 0.5, "cpu": 0.5}, "teams[2].share", "sum to 1.1"),
    ("requests.1.pool", "a100", "requests[1].pool", "unknown pool 'a100'"),
    ("requests.2.team", "ghost", "requests[2].team", "unknown team 'ghost'"),
    ("requests.0.gpus", 16, "requests[0]", "could ever hold it"),
    ("requests.3.labels", {"storage": "nowhere"}, "requests[3]", "could ever hold it"),
    ("nodes.0.pool", "tpu", "nodes[0].pool", "unknown pool"),
    ("requests.1.class", "urgent", "requests[1].class", "must be one of"),
    ("requests.0.duration", DELETE, "requests[0].duration", "missing"),
    ("policy.lookback", "a week", "policy.lookback", "not a duration"),
    ("policy.colour", "blue", "policy.colour", "unknown setting"),
    ("policy.name", "magic", "policy.name", "unknown policy"),
    ("events.0.node", "h100-999", "events[0].node", "unknown node"),
    ("nodes.2.mig.0", ["9g.99gb"], "nodes[2].mig.0[0]", "compute slices"),
    ("requests.1.gpu_fraction", 1.5, "requests[1].gpu_fraction", "between 0 and 1"),
    ("horizon", "soon", "horizon", "must be a number"),
    (
        "requests.1",
        {
            "id": "r2",
            "team": "robotics",
            "pool": "h100",
            "gpus": 4,
            "duration": 60,
            "class": "debug",
        },
        "requests[1].gpus",
        "at most 2 GPUs",
    ),
]


@pytest.mark.parametrize(("path", "value", "where", "reason"), BAD)
def test_bad_scenarios_exit_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: str,
    value: Any,
    where: str,
    reason: str,
) -> None:
    assert main(["sim", write(tmp_path, mutate(path, value))]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert f"{where}:" in lines[0]
    assert reason in lines[0]


def test_malformed_json_names_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, '{"name": "x",\n  "horizon": 10,,\n}')
    assert main(["sim", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{path}:2:" in err and "not JSON" in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err
