"""The budget service's reading of replay reports (spawner/readmodel/service/replays.py):
where they are by default, the newest readable one, what a what-if can apply through
the admin route, and no file but a listed report (or its plot) is ever served."""

from __future__ import annotations

import json
import os
from pathlib import Path

from spawner.readmodel.service import replays


def report(path: Path, generated: float, outcomes: list[dict[str, object]], mtime: float) -> None:
    path.write_text(
        json.dumps(
            {
                "generated": generated,
                "policy": "budget",
                "period": {"since": 100.0, "until": 200.0},
                "comparison": {"order_agreement": 0.97},
                "outcomes": outcomes,
            }
        )
    )
    os.utime(path, (mtime, mtime))


LIVE = {"label": "live", "policy": "budget", "set": {}, "headline": {"debug_p90_s": 12.0}}
REPLAY = {"label": "replay", "policy": "budget", "set": {}, "headline": {"debug_p90_s": 11.0}}


def test_default_directory_is_beside_a_sqlite_store(tmp_path: Path) -> None:
    assert replays.default_directory(f"sqlite:///{tmp_path}/s.sqlite") == str(tmp_path / "replay")
    assert replays.default_directory("sqlite://") == ""
    assert replays.default_directory("postgresql+psycopg://u@h/db") == ""


def test_the_newest_readable_report_and_what_its_what_ifs_can_apply(tmp_path: Path) -> None:
    assert replays.newest(str(tmp_path / "none")) is None and replays.newest("") is None
    tried = [
        LIVE,
        REPLAY,
        {"label": "lookback=2d", "policy": "budget", "set": {"lookback": 172800.0}},
        {
            "label": "min_runtime=4h, max_min_runtime=2h",
            "policy": "budget",
            "set": {"default_min_runtime": 14400.0, "max_min_runtime": 7200.0},
        },
        {"label": "legacy", "policy": "legacy", "set": {}},
    ]
    report(tmp_path / "old.json", 1.0, [LIVE, REPLAY], mtime=1000)
    report(tmp_path / "new.json", 2.0, tried, mtime=2000)
    (tmp_path / "newest.json").write_text("{not json")  # newer still, and skipped
    (tmp_path / "other.json").write_text('{"some": "thing"}')
    os.utime(tmp_path / "other.json", (1500, 1500))
    (tmp_path / "new.png").write_bytes(b"\x89PNG")
    found = replays.newest(str(tmp_path))
    assert found is not None
    assert (found.name, found.generated, found.plot, found.since) == (
        "new.json",
        2.0,
        "new.png",
        100.0,
    )
    assert found.live == {"debug_p90_s": 12.0}
    by_label = {w.label: w for w in found.what_ifs}
    assert list(by_label) == ["lookback=2d", "min_runtime=4h, max_min_runtime=2h", "legacy"]
    assert by_label["lookback=2d"].applicable == {"lookback": 172800.0}
    assert by_label["lookback=2d"].elsewhere == []
    both = by_label["min_runtime=4h, max_min_runtime=2h"]
    assert both.applicable == {"max_min_runtime": 7200.0}
    assert both.elsewhere == ["default_min_runtime"]
    assert by_label["legacy"].applicable == {} and by_label["legacy"].elsewhere == ["policy"]


def test_only_a_listed_report_or_its_plot_is_served(tmp_path: Path) -> None:
    reports = tmp_path / "replay"
    reports.mkdir()
    report(reports / "a.json", 1.0, [LIVE], mtime=1000)
    (reports / "a.png").write_bytes(b"\x89PNG")
    (reports / "notes.txt").write_text("private")
    (tmp_path / "store.sqlite").write_text("secret")
    directory = str(reports)
    assert replays.report_file(directory, "a.json") == reports / "a.json"
    assert replays.report_file(directory, "a.png") == reports / "a.png"
    for name in ("notes.txt", "../store.sqlite", "b.png", "", "."):
        assert replays.report_file(directory, name) is None, name
    assert replays.report_file("", "a.json") is None
