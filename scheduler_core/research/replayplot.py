"""The replay's plot: each request's live wait against its simulated wait.

A point per request started in both runs, coloured by class, on symmetric-log axes
(most waits are 0 or seconds, a few are hours); the line y = x is perfect agreement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from scheduler_core.metrics import CLASSES  # noqa: E402


def plot_waits(path: str, report: Mapping[str, Any]) -> None:
    """Write the plot of ``report`` (`commands.replay.replay_report`) to ``path`` (PNG)."""
    figure, ax = plt.subplots(figsize=(7, 6.5))
    biggest = 1.0
    for klass in CLASSES:
        points = [
            (row["live"]["wait"], row["simulated"]["wait"])
            for row in report["requests"]
            if row["class"] == klass and row["wait_error_s"] is not None
        ]
        if not points:
            continue
        live, simulated = zip(*points, strict=True)
        biggest = max(biggest, *live, *simulated)
        ax.scatter(live, simulated, s=10, alpha=0.6, label=f"{klass} ({len(points)})")
    line = [0.0, *(biggest ** (i / 200) for i in range(201))]  # straight on symlog axes
    ax.plot(line, line, color="#444", linewidth=0.8, label="same wait")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_yscale("symlog", linthresh=10)
    ax.set_xlabel("live wait (s)")
    ax.set_ylabel("simulated wait (s)")
    comparison = report["comparison"]
    agreement = comparison["order_agreement"]
    order = "-" if agreement is None else f"{agreement:.1%}"
    median = comparison["wait_abs_error_s"]["p50"]
    span = report["period"]
    ax.set_title(
        f"{span['since_iso']} to {span['until_iso']}: start order {order}, "
        f"median |error| {'-' if median is None else f'{median:.0f} s'}",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
