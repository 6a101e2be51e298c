"""`budgethub compare`: the summary table, report.json and a self-contained report.html."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from harness.builders import EXAMPLE
from scheduler_core.research.cli import main
from scheduler_core.research.evaluation import HEADLINE_COLUMNS

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


def test_the_table_prints_lost_work_and_goodput_beside_legacy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A notebook that starts over when preempted (test_lost_work): budget stops it at 2 h
    for the funded job and its first 2 h on 8 GPUs are lost; legacy, with equal
    priorities, lets it finish and makes the job wait. Goodput is occupancy less the lost
    share, 11 h on 8 GPUs of 24 h for both."""
    from tests.unit.test_lost_work import preempted_notebook

    path = tmp_path / "lost.json"
    path.write_text(json.dumps(preempted_notebook(resumable=False)))
    argv = ["compare", str(path), "--policies", "budget,legacy", "--jobs", "1"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    header = next(line for line in table if line.startswith("run"))
    first = header.index("debug p90") - (10 - len("debug p90"))

    def cells(line: str) -> dict[str, str]:
        """The table's cells by column title (the columns' widths)."""
        out, at = {}, first
        for title, width, _ in HEADLINE_COLUMNS:
            out[title] = line[at : at + width].strip()
            at += width
        return out

    assert cells(header)["goodput"] == "goodput" and cells(header)["lost %"] == "lost %"
    for policy, lost_h, busy_h in (("budget", 16, 13 * 8), ("legacy", 0, 11 * 8)):
        figures = report["results"][policy]["headline"]
        assert figures["occupancy"] == round(busy_h / 192, 4)
        assert figures["lost_gpu_h"] == lost_h
        assert figures["lost_share"] == round(lost_h / 192, 4)
        assert figures["goodput"] == round(11 * 8 / 192, 4)
        row = cells(next(line for line in table if line.startswith(policy)))
        assert (row["lost h"], row["lost %"], row["goodput"]) == (
            str(lost_h),
            f"{lost_h / 192:.1%}",
            f"{11 * 8 / 192:.1%}",
        )
