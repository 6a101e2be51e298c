"""`budgethub compare`: the summary table, report.json and a self-contained report.html."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from harness.builders import EXAMPLE
from scheduler_core.research.cli import main

POLICIES = ["budget", "legacy", "fairshare", "quota", "fifo"]


def test_report_files_are_written_with_plots_inline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "report"
    assert main(["compare", str(EXAMPLE), "--report", str(out_dir), "--jobs", "1"]) == 0
    table = capsys.readouterr().out
    for policy in POLICIES:
        assert re.search(rf"^{policy}\s", table, re.MULTILINE), table
    assert "debug p90" in table and "occup." in table and "preempt" in table

    report = json.loads((out_dir / "report.json").read_text())
    assert report["scenario"] == "debug-fast-start"
    assert report["policies"] == POLICIES
    for policy in POLICIES:
        metrics = report["results"][policy]["metrics"]
        assert report["results"][policy]["policy"] == policy
        assert set(metrics) >= {
            "wait_s",
            "occupancy",
            "unallocated_share",
            "preemptions",
            "lost_gpu_seconds",
            "teams",
            "stranded_gpu_h",
            "occupancy_hourly",
        }
        assert set(metrics["wait_s"]) == {"all", "debug", "interactive", "batch", "dataprep"}

    page = (out_dir / "report.html").read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 3
    for image in images:
        assert base64.b64decode(image).startswith(b"\x89PNG\r\n\x1a\n")
    assert "<script" not in page
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)
    assert "<style>" in page


def test_json_prints_the_report_object_only(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", str(EXAMPLE), "--policies", "legacy,fifo", "--json", "--jobs", "1"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policies"] == ["legacy", "fifo"]
    assert report["results"]["fifo"]["headline"]["preemptions"] == 0


@pytest.mark.slow
def test_policies_run_in_worker_processes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", str(EXAMPLE), "--policies", "budget,quota", "--json", "--jobs", "2"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(report["results"]) == ["budget", "quota"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--policies", "budget,nope"], "--policies"),
        (["--policies", "budget,budget"], "--policies"),
        (["--jobs", "0"], "--jobs"),
    ],
)
def test_bad_arguments_exit_2_naming_them(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(EXAMPLE), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err


def test_missing_scenario_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path / "none.json")]) == 2
    assert "none.json" in capsys.readouterr().err
