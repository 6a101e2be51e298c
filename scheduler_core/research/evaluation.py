"""Running one scenario under several policies or settings, in parallel, for compare and sweep.

Each run is a `RunSpec` (a label, a policy, settings overrides) and comes back
as a `RunOutcome`: the result metrics, the waits by class (for CDF plots) and the
wall time. Runs go to worker processes (``spawn``: nothing is inherited, and a
worker reads the scenario file itself, since a parsed scenario holds read-only
mappings that do not pickle); a progress bar of simulated time goes to stderr
when it is a terminal.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from scheduler_core.metrics import CLASSES, result
from scheduler_core.scenario import Scenario, load_scenario
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import Simulation
from scheduler_core.view import Decisions

Axis = tuple[str, list[str], list[Any]]
"""A swept setting: its name, the values as written, and as parsed."""

STEPS = 200
"""Progress is reported in this many steps of simulated time per run."""


@dataclass(frozen=True)
class RunSpec:
    """One run: ``policy`` on the scenario with ``overrides`` applied to its settings."""

    label: str
    policy: str | None = None
    """None keeps the scenario's own policy."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """Setting name → parsed value (see settings.setting_from_text)."""


@dataclass
class RunOutcome:
    label: str
    policy: str
    settings: dict[str, Any]
    """The overrides this run used, as given."""
    metrics: dict[str, Any]
    waits: dict[str, list[float]]
    """Class (and ``all``) → sorted waits in seconds, as the metrics count them."""
    sim_wall_s: float


def configured(scenario: Scenario, spec: RunSpec) -> Scenario:
    """The scenario with the run's policy and settings."""
    changes = dict(spec.overrides)
    if spec.policy is not None:
        changes["name"] = spec.policy
    return replace(scenario, settings=scenario.settings.replace(**changes)) if changes else scenario


def waits_by_class(outcome: Mapping[str, Any], horizon: float) -> dict[str, list[float]]:
    """Sorted waits per class and overall; a request that never started counts to the horizon."""
    found: dict[str, list[float]] = {klass: [] for klass in ("all", *CLASSES)}
    for request in outcome["requests"]:
        wait = request["wait"]
        if wait is None:
            if request["submit"] > horizon:
                continue
            wait = horizon - request["submit"]
        found.setdefault(request["class"], []).append(float(wait))
        found["all"].append(float(wait))
    return {klass: sorted(values) for klass, values in found.items()}


def run_one(
    scenario: Scenario, spec: RunSpec, progress: Callable[[float], None] | None = None
) -> RunOutcome:
    """Simulate one run; ``progress`` is told the simulated fraction done, now and then."""
    configured_scenario = configured(scenario, spec)
    horizon = configured_scenario.horizon
    observer = None
    if progress is not None:
        step = horizon / STEPS
        reached = [0.0]
        report = progress

        def observe(scheduler: Scheduler, decisions: Decisions, now: float) -> None:
            if now - reached[0] >= step:
                reached[0] = now
                report(min(1.0, now / horizon))

        observer = observe
    started = time.perf_counter()
    outcome = result(Simulation(configured_scenario, observer).run())
    wall = time.perf_counter() - started
    if progress is not None:
        progress(1.0)
    return RunOutcome(
        spec.label,
        configured_scenario.settings.name,
        dict(spec.overrides),
        outcome["metrics"],
        waits_by_class(outcome, horizon),
        round(wall, 2),
    )


_progress_queue: Any = None
"""In a worker process: where it reports (run index, fraction done)."""


def _init_worker(progress_queue: Any) -> None:
    global _progress_queue
    _progress_queue = progress_queue


def _work(path: str, index: int, spec: RunSpec) -> RunOutcome:
    scenario = load_scenario(path)
    progress_queue = _progress_queue

    def report(fraction: float) -> None:
        if progress_queue is not None:
            progress_queue.put((index, fraction))

    return run_one(scenario, spec, report)


def show_progress() -> bool:
    """A progress bar is drawn only on a terminal."""
    return sys.stderr.isatty()


def run_all(path: str, specs: Sequence[RunSpec], jobs: int | None = None) -> list[RunOutcome]:
    """Every run of ``specs`` on the scenario file, in their order.

    ``jobs`` worker processes (default: one per run, at most one per CPU); with
    one job everything runs here. Put the longest runs first: they start first.
    The caller has checked that the scenario loads.
    """
    jobs = jobs or min(len(specs), os.cpu_count() or 1)
    bar = tqdm(
        total=len(specs) * STEPS,
        disable=not show_progress(),
        desc="simulating",
        unit="step",
        file=sys.stderr,
        leave=False,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}",
    )
    done = [0.0] * len(specs)

    def advance(index: int, fraction: float) -> None:
        steps = int(fraction * STEPS) - int(done[index] * STEPS)
        done[index] = max(done[index], fraction)
        if steps > 0:
            bar.update(steps)

    def reporter(index: int) -> Callable[[float], None]:
        return lambda fraction: advance(index, fraction)

    try:
        if jobs <= 1:
            scenario = load_scenario(path)
            return [run_one(scenario, spec, reporter(i)) for i, spec in enumerate(specs)]
        return _run_parallel(path, specs, jobs, advance)
    finally:
        bar.close()


def _run_parallel(
    path: str,
    specs: Sequence[RunSpec],
    jobs: int,
    advance: Callable[[int, float], None],
) -> list[RunOutcome]:
    context = multiprocessing.get_context("spawn")
    progress_queue = context.Queue()
    with context.Pool(jobs, initializer=_init_worker, initargs=(progress_queue,)) as pool:
        pending = [pool.apply_async(_work, (path, i, spec)) for i, spec in enumerate(specs)]
        while not all(job.ready() for job in pending):
            try:
                index, fraction = progress_queue.get(timeout=0.2)
            except queue.Empty:
                continue
            advance(index, fraction)
        return [job.get() for job in pending]


def worst_team(metrics: Mapping[str, Any]) -> tuple[str | None, float | None]:
    """The team delivered the smallest part of what it was owed."""
    owed = {n: t["fulfilment"] for n, t in metrics["teams"].items() if t["fulfilment"] is not None}
    if not owed:
        return None, None
    name = min(owed, key=lambda n: (owed[n], n))
    return name, owed[name]


def headline(outcome: RunOutcome) -> dict[str, Any]:
    """The figures compare and sweep print: waits, occupancy, fulfilment, preemptions, and
    the work they threw away (lost GPU-h, its share of the GPU time, goodput)."""
    metrics = outcome.metrics
    waits = metrics["wait_s"]
    name, worst = worst_team(metrics)
    teams = [t["fulfilment"] for t in metrics["teams"].values() if t["fulfilment"] is not None]
    return {
        "debug_p90_s": waits["debug"]["p90"],
        "all_p50_s": waits["all"]["p50"],
        "all_p90_s": waits["all"]["p90"],
        "occupancy": metrics["occupancy"],
        "unallocated_share": metrics["unallocated_share"],
        "fulfilment": metrics["fulfilment"],
        "worst_team": name,
        "worst_fulfilment": worst,
        "teams_at_95": sum(1 for f in teams if f >= 0.95),
        "teams": len(teams),
        "preemptions": metrics["preemptions"],
        "lost_gpu_h": round(metrics["lost_gpu_seconds"] / 3600, 1),
        "lost_share": metrics["lost_share"],
        "lost_gpu_h_by_class": metrics["lost_gpu_h_by_class"],
        "goodput": metrics["goodput"],
        "stranded_gpu_h": metrics["stranded_gpu_h"],
        "sim_wall_s": outcome.sim_wall_s,
    }


def fmt_wait(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


def fmt_share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def lost_by_class(lost: dict[str, float]) -> str:
    """GPU-h lost to preemption of batch, interactive and debug work."""
    return "/".join(f"{lost.get(k, 0.0):.0f}" for k in ("batch", "interactive", "debug"))


HEADLINE_COLUMNS: tuple[tuple[str, int, Callable[[dict[str, Any]], str]], ...] = (
    ("debug p90", 10, lambda h: fmt_wait(h["debug_p90_s"])),
    ("all p50", 9, lambda h: fmt_wait(h["all_p50_s"])),
    ("all p90", 9, lambda h: fmt_wait(h["all_p90_s"])),
    ("occup.", 8, lambda h: fmt_share(h["occupancy"])),
    ("lost h", 8, lambda h: f"{h['lost_gpu_h']:.0f}"),
    ("lost %", 7, lambda h: fmt_share(h["lost_share"])),
    ("lost h b/i/d", 16, lambda h: lost_by_class(h["lost_gpu_h_by_class"])),
    ("goodput", 8, lambda h: fmt_share(h["goodput"])),
    ("unalloc.", 9, lambda h: fmt_share(h["unallocated_share"])),
    ("fulfil", 8, lambda h: fmt_share(h["fulfilment"])),
    ("worst team", 20, lambda h: f"{h['worst_team'] or '-'} {fmt_share(h['worst_fulfilment'])}"),
    (">=95%", 7, lambda h: f"{h['teams_at_95']}/{h['teams']}"),
    ("preempt", 8, lambda h: str(h["preemptions"])),
    ("strand h", 9, lambda h: f"{h['stranded_gpu_h']:.0f}"),
    ("wall s", 7, lambda h: f"{h['sim_wall_s']:.0f}"),
)
"""Column title, width and cell of the headline table."""


def headline_table(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """One line per (label, headline), under a header line."""
    width = max([len("run"), *(len(label) for label, _ in rows)]) + 2
    lines = [f"{'run':<{width}}" + "".join(f"{t:>{w}}" for t, w, _ in HEADLINE_COLUMNS)]
    for label, figures in rows:
        cells = "".join(f"{cell(figures):>{w}}" for _, w, cell in HEADLINE_COLUMNS)
        lines.append(f"{label:<{width}}{cells}")
    return "\n".join(lines)


def report_object(scenario: str, runs: Sequence[RunOutcome], wall_s: float) -> dict[str, Any]:
    """What report.json holds (and ``compare --json`` prints): per policy, the full metrics."""
    return {
        "scenario": scenario,
        "policies": [run.label for run in runs],
        "wall_s": round(wall_s, 2),
        "results": {
            run.label: {
                "policy": run.policy,
                "settings": run.settings,
                "sim_wall_s": run.sim_wall_s,
                "headline": headline(run),
                "metrics": run.metrics,
            }
            for run in runs
        },
    }
