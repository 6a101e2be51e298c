"""`budgethub sweep`: one row per combination, the plot, and bad --set values (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.builders import EXAMPLE
from scheduler_core.research.cli import main


def test_table_has_one_row_per_combination(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "sweep.png"
    argv = ["sweep", str(EXAMPLE), "--set", "lookback=1d,3d", "--set", "max_min_runtime=2h,4h,8h"]
    assert main([*argv, "--plot", str(plot), "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("lookback=")]
    assert len(rows) == 6
    assert rows[0].startswith("lookback=1d max_min_runtime=2h")
    assert rows[-1].startswith("lookback=3d max_min_runtime=8h")
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_json_lists_every_run(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", str(EXAMPLE), "--policy", "fairshare", "--json", "--jobs", "1"]
    assert main([*argv, "--set", "fairshare_half_life=1d,14d", "--set", "placement=first-fit"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "fairshare"
    assert out["settings"] == ["fairshare_half_life", "placement"]
    assert [run["settings"] for run in out["runs"]] == [
        {"fairshare_half_life": "1d", "placement": "first-fit"},
        {"fairshare_half_life": "14d", "placement": "first-fit"},
    ]
    assert all("wait_s" in run["metrics"] for run in out["runs"])


def test_one_setting_plots_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "one.png"
    argv = ["sweep", str(EXAMPLE), "--set", "debug_max_gpus=1,2", "--plot", str(plot)]
    assert main([*argv, "--jobs", "1"]) == 0
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("lookbak=1d,3d", "--set lookbak"),
        ("lookback=1d,soon", "--set lookback"),
        ("max_min_runtime=-2h", "--set max_min_runtime"),
        ("debug_max_gpus=1.5", "--set debug_max_gpus"),
        ("placement=anywhere", "--set placement"),
        ("lookback", "--set"),
        ("lookback=", "--set lookback"),
        ("name=fifo", "--set name"),
    ],
)
def test_bad_set_exits_2_naming_it(
    setting: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sweep", str(EXAMPLE), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"budgethub sweep: {named}")


def test_a_setting_given_twice_or_none_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(EXAMPLE), "--set", "lookback=1d", "--set", "lookback=2d"]) == 2
    assert main(["sweep", str(EXAMPLE)]) == 2
    assert main(["sweep", str(EXAMPLE), "--set", "lookback=1d", "--policy", "nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 3
