"""The `budgethub compare` report: report.json and a self-contained report.html.

The HTML opens with no network: CSS is inline and every plot is a PNG drawn by
matplotlib (Agg backend) and inlined as a base64 data URI; there is no script.
Plots: wait CDF per class per policy, owed vs delivered per team per policy,
GPU occupancy over time per policy.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from scheduler_core.metrics import CLASSES  # noqa: E402
from scheduler_core.research.evaluation import (  # noqa: E402
    RunOutcome,
    fmt_share,
    fmt_wait,
    headline,
    headline_table,
    report_object,
)

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; }
"""


def png_data_uri(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def wait_cdf_figure(runs: Sequence[RunOutcome]) -> Figure:
    """One panel per class (and all): the share of requests that waited at most x."""
    panels = ["all", *CLASSES]
    figure, grid = plt.subplots(2, 3, figsize=(13, 7), sharey=True)
    axes = list(grid.flat)
    for ax, klass in zip(axes, panels, strict=False):
        for run in runs:
            waits = np.maximum(np.asarray(run.waits.get(klass, []), dtype=np.float64), 1.0)
            if not len(waits):
                continue
            share = np.arange(1, len(waits) + 1) / len(waits)
            ax.step(waits, share, where="post", label=run.label)
        ax.set_xscale("log")
        ax.set_title(f"{klass} ({len(runs[0].waits.get(klass, [])) if runs else 0} requests)")
        ax.set_xlabel("wait (s; 0 drawn at 1 s)")
        ax.grid(alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.axis("off")
    for ax in grid[:, 0]:
        ax.set_ylabel("share of requests")
    handles, labels = axes[0].get_legend_handles_labels()
    axes[-1].legend(handles, labels, loc="center")
    figure.tight_layout()
    return figure


def fulfilment_figure(runs: Sequence[RunOutcome]) -> Figure:
    """One panel per policy: GPU-hours owed (outline) and delivered (filled) per team."""
    figure, axes = plt.subplots(len(runs), 1, figsize=(12, 2.6 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        teams = run.metrics["teams"]
        names = list(teams)
        x = np.arange(len(names))
        owed = [teams[n]["owed_gpu_h"] for n in names]
        delivered = [teams[n]["delivered_gpu_h"] for n in names]
        ax.bar(x, owed, width=0.7, fill=False, edgecolor="#444", label="owed")
        ax.bar(x, delivered, width=0.5, color="#4c72b0", label="delivered")
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("GPU-hours")
        fulfilment = fmt_share(run.metrics["fulfilment"])
        ax.set_title(f"{run.label}: fulfilment {fulfilment}", fontsize=10)
        ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def occupancy_figure(runs: Sequence[RunOutcome]) -> Figure:
    """GPU occupancy hour by hour, one line per policy."""
    figure, ax = plt.subplots(figsize=(12, 3.6))
    for run in runs:
        hourly = run.metrics.get("occupancy_hourly") or []
        days = np.arange(len(hourly)) / 24.0
        ax.plot(days, hourly, label=run.label, linewidth=0.9)
    lowest = min((min(r.metrics.get("occupancy_hourly") or [1.0]) for r in runs), default=0.0)
    ax.set_xlabel("day")
    ax.set_ylabel("GPU occupancy (hourly)")
    ax.set_ylim(max(0.0, lowest - 0.05), 1.01)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncols=len(runs))
    figure.tight_layout()
    return figure


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(scenario: str, runs: Sequence[RunOutcome], images: dict[str, str]) -> str:
    """The whole page, with ``images`` (title → data URI) inline."""
    summary = headline_table([(run.label, headline(run)) for run in runs])
    waits = _table(
        ["policy", *(f"{k} p50 / p90 / p99" for k in ("all", *CLASSES))],
        [
            [run.label]
            + [
                " / ".join(fmt_wait(run.metrics["wait_s"][k][q]) for q in ("p50", "p90", "p99"))
                for k in ("all", *CLASSES)
            ]
            for run in runs
        ],
    )
    team_names = list(runs[0].metrics["teams"]) if runs else []
    teams = _table(
        ["team", "share", *(run.label for run in runs)],
        [
            [name, f"{runs[0].metrics['teams'][name]['share']:.3f}"]
            + [fmt_share(run.metrics["teams"][name]["fulfilment"]) for run in runs]
            for name in team_names
        ],
    )
    figures = "".join(
        f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='{uri}'>"
        for title, uri in images.items()
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>budgethub compare: {html.escape(scenario)}</title><style>{CSS}</style></head>"
        f"<body><h1>budgethub compare: {html.escape(scenario)}</h1>"
        f"<h2>Summary</h2><pre>{html.escape(summary)}</pre>"
        f"<h2>Waits by class</h2>{waits}"
        f"<h2>Fulfilment per team (delivered / owed GPU-hours)</h2>{teams}"
        f"{figures}</body></html>\n"
    )


def write_report(
    directory: str | Path, scenario: str, runs: Sequence[RunOutcome], wall_s: float
) -> dict[str, Any]:
    """Write DIR/report.json and DIR/report.html; return the report object."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    report = report_object(scenario, runs, wall_s)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    images = {
        "Wait CDF per class": png_data_uri(wait_cdf_figure(runs)),
        "Owed vs delivered GPU-hours per team": png_data_uri(fulfilment_figure(runs)),
        "GPU occupancy over time": png_data_uri(occupancy_figure(runs)),
    }
    (out / "report.html").write_text(render_html(scenario, runs, images), encoding="utf-8")
    return report
