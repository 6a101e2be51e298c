"""The newest `budgethub replay` report, for the budget service's admin page (issue 51).

Reports are the JSON files ``budgethub replay --json`` writes (with the plot's PNG
beside them, same name) into one directory: ``BudgetScheduler.replay_reports``, which
the Hub hands the service as ``BUDGETHUB_REPLAY_REPORTS``. The admin page links to the
newest and offers, for each what-if run, to apply the settings it tried.

Why only some settings can be applied: the page applies a what-if through the admin
route that already exists (the settings form, with its checks and its audit entry), and
that route sets what an admin may set on a running Hub (`spawner.admin.LIMITS`); any
other setting a what-if tried (the policy, a minimum runtime) is named as the
configuration file's.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import make_url

from spawner.admin import LIMITS

REPORTS_ENV = "BUDGETHUB_REPLAY_REPORTS"
"""The environment variable that names the reports' directory to the service."""

log = logging.getLogger("budgethub.service")


def default_directory(store_url: str) -> str:
    """``replay/`` beside a SQLite file store; none for another store ("")."""
    url = make_url(store_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return ""
    return str(Path(str(url.database)).resolve().parent / "replay")


@dataclass(frozen=True)
class WhatIf:
    """One what-if run of a report and what applying it would set."""

    label: str
    policy: str
    tried: dict[str, Any]
    """Every setting the run tried (Settings field → value)."""
    applicable: dict[str, float]
    """Those the admin route sets (seconds), as the settings form posts them."""
    elsewhere: list[str]
    """Those only the configuration file sets (the policy too, when it differs)."""
    headline: dict[str, Any]


@dataclass(frozen=True)
class Report:
    """What the admin page says of a report."""

    name: str
    generated: float
    since: float | None
    until: float | None
    comparison: dict[str, Any]
    live: dict[str, Any]
    what_ifs: list[WhatIf]
    plot: str | None
    """The plot's file name, when one was written beside the report."""


def reports(directory: str) -> list[Path]:
    """The report files in ``directory``, newest first (by modification time)."""
    if not directory:
        return []
    try:
        found = [p for p in Path(directory).iterdir() if p.suffix == ".json" and p.is_file()]
    except OSError:
        return []
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name), reverse=True)


def newest(directory: str) -> Report | None:
    """The newest readable report in ``directory`` (None: none). A file that is not a
    replay report is skipped, with a warning."""
    for path in reports(directory):
        try:
            return read(path)
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("replay report %s skipped: %s", path, error)
    return None


def read(path: Path) -> Report:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "comparison" not in data or "outcomes" not in data:
        raise ValueError("not a budgethub replay report (no comparison or outcomes)")
    period = data.get("period") or {}
    outcomes = list(data["outcomes"])
    live_policy = str(data.get("policy", ""))
    live: dict[str, Any] = next((o for o in outcomes if o.get("label") == "live"), {})
    what_ifs = [
        what_if(row, live_policy)
        for row in outcomes
        if row.get("label") not in ("live", "replay") and (row.get("set") or row.get("policy"))
    ]
    plot = path.with_suffix(".png")
    return Report(
        name=path.name,
        generated=float(data.get("generated") or path.stat().st_mtime),
        since=period.get("since"),
        until=period.get("until"),
        comparison=dict(data["comparison"]),
        live=dict(live.get("headline") or {}),
        what_ifs=what_ifs,
        plot=plot.name if plot.is_file() else None,
    )


def what_if(row: dict[str, Any], live_policy: str) -> WhatIf:
    tried = dict(row.get("set") or {})
    applicable: dict[str, float] = {}
    elsewhere = []
    for key, value in tried.items():
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if key in LIMITS and number is not None and math.isfinite(number):
            applicable[key] = float(number)
        else:
            elsewhere.append(key)
    policy = str(row.get("policy", ""))
    if policy and live_policy and policy != live_policy:
        elsewhere.insert(0, "policy")
    return WhatIf(
        label=str(row.get("label", "")),
        policy=policy,
        tried=tried,
        applicable=applicable,
        elsewhere=elsewhere,
        headline=dict(row.get("headline") or {}),
    )


def report_file(directory: str, name: str) -> Path | None:
    """A file of the reports' directory by its listed name (a report or its plot); None
    for any other name, so no path outside the directory is ever read."""
    if not directory:
        return None
    for path in reports(directory):
        if name in (path.name, path.with_suffix(".png").name):
            wanted = path.with_name(name)
            return wanted if wanted.is_file() else None
    return None


def directory_from_env() -> str:
    return os.environ.get(REPORTS_ENV, "")
