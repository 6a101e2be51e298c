"""The `budgethub sweep --plot` figure: debug p90 wait and worst-team fulfilment per combination.

Two settings give two heat maps (first setting down, second across), one
setting gives two line charts, more give bar charts over the combinations.
matplotlib runs on the Agg backend; nothing is shown, the PNG is written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from scheduler_core.research.evaluation import Axis, RunOutcome, headline  # noqa: E402


def _debug_p90_minutes(figures: dict[str, Any]) -> float:
    wait = figures["debug_p90_s"]
    return math.nan if wait is None else float(wait) / 60


def _worst_fulfilment_percent(figures: dict[str, Any]) -> float:
    worst = figures["worst_fulfilment"]
    return math.nan if worst is None else 100 * float(worst)


PANELS: tuple[tuple[str, Callable[[dict[str, Any]], float]], ...] = (
    ("debug p90 wait (min)", _debug_p90_minutes),
    ("worst-team fulfilment (%)", _worst_fulfilment_percent),
)


def plot_sweep(path: str, axes: Sequence[Axis], runs: Sequence[RunOutcome], title: str) -> None:
    """Write the sweep's figure to ``path`` (PNG)."""
    figures = [headline(run) for run in runs]
    figure, panels = plt.subplots(1, len(PANELS), figsize=(12, 4.6))
    for ax, (name, value) in zip(panels, PANELS, strict=True):
        values = np.asarray([value(h) for h in figures], dtype=np.float64)
        if len(axes) == 2:
            _heatmap(ax, axes, values.reshape(len(axes[0][1]), len(axes[1][1])))
        elif len(axes) == 1:
            ax.plot(axes[0][1], values, marker="o")
            ax.set_xlabel(axes[0][0])
            ax.grid(alpha=0.3)
        else:
            ax.bar(range(len(runs)), values)
            ax.set_xticks(range(len(runs)), [r.label for r in runs], rotation=60, ha="right")
            ax.tick_params(axis="x", labelsize=7)
        ax.set_title(name)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _heatmap(ax: Axes, axes: Sequence[Axis], grid: Any) -> None:
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.figure.colorbar(image, ax=ax)
    ax.set_yticks(range(len(axes[0][1])), axes[0][1])
    ax.set_xticks(range(len(axes[1][1])), axes[1][1])
    ax.set_ylabel(axes[0][0])
    ax.set_xlabel(axes[1][0])
    finite = grid[np.isfinite(grid)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (row, col), cell in np.ndenumerate(grid):
        if np.isfinite(cell):
            color = "black" if cell > middle else "white"
            ax.text(col, row, f"{cell:.1f}", ha="center", va="center", color=color, fontsize=9)
