"""Forecast accuracy on the family's workloads: what the Hub says at submit, against
what then happened.

Run: `.venv/bin/python -m bench.forecast [--gpus 88] [--loads 0.8,1.2] [--shares 0.05,0.35]
[--seeds 1] [--days 2] [--every 1]`.

Each run is a `bench.family` workload (`budgethub generate seed-like`, budget policy)
simulated as the family simulates it. At every submission (every ``--every``-th), before
the request is queued, the bench asks what the Hub would show on the form for it:

* **forecast** (`scheduler_core.forecast`, what the Hub shows now): funding and "starts
  now" from `decide` run dry on the live state with the request added; the start from
  the scheduler run forward, running sessions ending after their class's median length
  so far in the run (the profile's history), at least when their protection ends;
* **baseline** (the estimate the Hub showed before issue 40, kept here only to compare):
  the old outlook's own order (teams charged as if every request fitted) and its
  estimate, the time running sessions of the pool, ending as their protection ends,
  free the units of the request and of those ahead of it; now if it fits free slices
  and nothing is ahead.

Then the simulation goes on, and each request's first start and its funding at that
admission are read from the run. Printed per run and over all runs: the absolute error
of the predicted start (median and p90; a request the forecast gives no start, or that
never started, is counted apart), and the share of requests whose funding at admission
the forecast said at submit. Figures for `make bench`: FIGURES.
"""

from __future__ import annotations

import argparse
import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.family import Cell, Job, numbers, scenario_of
from scheduler_core.forecast import History, forecast, history_key, run_forward
from scheduler_core.model import Allocation, Health, Request
from scheduler_core.policy import queue_heads
from scheduler_core.ranking import PoolRanking
from scheduler_core.scheduler import Scheduler
from scheduler_core.simulator import Simulation
from scheduler_core.view import ClusterView

FIGURES = (
    "forecast.start_error_p50_s",
    "forecast.start_error_p90_s",
    "forecast.waited_error_p50_s",
    "forecast.waited_error_p90_s",
    "forecast.baseline_error_p50_s",
    "forecast.baseline_error_p90_s",
    "forecast.baseline_waited_error_p50_s",
    "forecast.baseline_waited_error_p90_s",
    "forecast.funding_agreement",
)


@dataclass
class Said:
    """What the form would have shown for one request at its submit."""

    submit: float
    start: float | None
    funded: bool
    baseline: float | None
    now: bool
    """The dry run starts it at once."""


@dataclass
class Tally:
    """Predictions against outcomes, for one run or for all."""

    started: list[tuple[float, float | None, float | None]] = field(default_factory=list)
    """Per request that started: (its wait, the forecast's error, the baseline's error);
    an error is None where that estimate gave no start."""
    never_started: int = 0
    agree: int = 0
    now_said: int = 0
    """Requests the forecast said start now."""
    now_right: int = 0
    """Of those, started at their submit with the funding said."""
    seconds: float = 0.0

    def add(self, other: Tally) -> None:
        self.started += other.started
        self.never_started += other.never_started
        self.agree += other.agree
        self.now_said += other.now_said
        self.now_right += other.now_right
        self.seconds += other.seconds

    def errors(self, which: int, waited: bool = False, both: bool = False) -> list[float]:
        """The forecast's (1) or the baseline's (2) absolute errors, of the requests that
        waited (started a minute or more after their submit) if ``waited``, of those both
        estimates gave a start to if ``both``."""
        out = []
        for e in self.started:
            error = e[which]
            if error is None or (waited and e[0] < 60) or (both and None in e):
                continue
            out.append(abs(error))
        return out

    def early(self) -> float:
        """The share of the forecast's starts that came before the actual one."""
        signed = [e[1] for e in self.started if e[1] is not None and e[1] != 0]
        return sum(1 for s in signed if s < 0) / len(signed) if signed else math.nan

    def missing(self, which: int) -> int:
        return sum(1 for e in self.started if e[which] is None)


def baseline_order(view: ClusterView, now: float) -> list[str]:
    """The old outlook's order (before issue 40): per pool, teams by rank, each request
    charged to its team as if it fitted; no debug lane, no day slices."""
    index = view.index
    queues = queue_heads(view, index)
    order: list[str] = []
    for pool in sorted(queues):
        team_queues = {team: q for team, q in queues[pool].items() if q}
        protected = index.protected.get(pool, ()) if index is not None else None
        ranking = PoolRanking(view, pool, now, protected)
        heads = dict.fromkeys(team_queues, 0)
        heap = [(ranking.key(t), q[0].request.submit, t) for t, q in team_queues.items()]
        heapq.heapify(heap)
        while heap:
            key, _, team = heapq.heappop(heap)
            if ranking.key(team) > key:
                entry = team_queues[team][heads[team]]
                heapq.heappush(heap, (ranking.key(team), entry.request.submit, team))
                continue
            entry = team_queues[team][heads[team]]
            heads[team] += 1
            order.append(entry.request.id)
            if ranking.can_fund(team, entry.units):
                ranking.charge(team, entry.units)
            if heads[team] < len(team_queues[team]):
                following = team_queues[team][heads[team]]
                heapq.heappush(heap, (ranking.key(team), following.request.submit, team))
    return order


def baseline_estimate(
    core: Scheduler, view: ClusterView, request: Request, now: float
) -> float | None:
    """The old form's estimate (`QueueView.outlook` before issue 40)."""
    asked = ClusterView(**{**view.__dict__, "pending": (*view.pending, request), "index": None})
    order = [
        r
        for r in baseline_order(asked, now)
        if r == request.id or (r in core.pending and core.pending[r].pool == request.pool)
    ]
    ahead = [core.pending[r] for r in order[: order.index(request.id)]]
    if not ahead and _fits_free(core, view, request):
        return now
    kind = core.pools[request.pool].kind
    need = request.charge_rate(kind) + sum(r.charge_rate(kind) for r in ahead)
    ends = sorted(
        (a.protected_until, a.charge_rate if a.funded else a.request.charge_rate(kind))
        for a in core.running.values()
        if a.pool == request.pool
    )
    freed = 0.0
    for end, units in ends:
        freed += units
        if freed >= need:
            return max(end, now)
    return None


def _fits_free(core: Scheduler, view: ClusterView, request: Request) -> bool:
    free = view.free or {}
    for node in core.nodes.values():
        room = free.get(node.name)
        if node.pool == request.pool and node.health is Health.READY and room is not None:
            if room.copy().slices_for(request) is not None:
                return True
    return False


class Watched:
    """A family run with the form's forecast taken at every (``every``-th) submission."""

    def __init__(self, job: Job, every: int, after: float = 0.0) -> None:
        self.simulation = Simulation(scenario_of(job))
        self.core = self.simulation.scheduler
        self.every = every
        self.said: dict[str, Said] = {}
        self.lengths: dict[str, list[float]] = {}
        self._history: History | None = None
        self._count = 0
        self.seconds = 0.0
        submit, finish = self.core.submit, self.core.finish

        def watched_submit(request: Request, stops: int = 0) -> Request:
            now = self.simulation.clock.now()
            if request.id not in self.said and stops == 0 and now >= after:
                self._count += 1
                if self._count % self.every == 0:
                    self.ask(request)
            return submit(request, stops)

        def watched_finish(request_id: str) -> Allocation:
            allocation = finish(request_id)
            length = self.simulation.clock.now() - allocation.start
            self.lengths.setdefault(history_key(allocation.request), []).append(length)
            self._history = None
            return allocation

        self.core.submit = watched_submit  # type: ignore[method-assign]
        self.core.finish = watched_finish  # type: ignore[method-assign]

    def history(self) -> History:
        if self._history is None:
            pairs = [(k, v) for k, values in self.lengths.items() for v in values]
            self._history = History.of(pairs)
        return self._history

    def ask(self, request: Request) -> None:
        core, now = self.core, self.simulation.clock.now()
        started = time.perf_counter()
        view = core.view(now)
        said = forecast(view, now, request)
        if said.starts_now:
            start: float | None = now
        else:
            start = run_forward(core, now, self.history(), request, [request.id]).get(request.id)
        self.seconds += time.perf_counter() - started
        old = baseline_estimate(core, core.view(now), request, now)
        self.said[request.id] = Said(now, start, said.funded, old, said.starts_now)

    def run(self) -> Tally:
        records = self.simulation.run().records
        tally = Tally(seconds=self.seconds)
        for rid, said in self.said.items():
            record = records[rid]
            if not record.starts:
                tally.never_started += 1
                continue
            actual = record.starts[0]
            tally.agree += said.funded == record.funded[0]
            new = None if said.start is None else said.start - actual
            old = None if said.baseline is None else said.baseline - actual
            tally.started.append((actual - said.submit, new, old))
            if said.now:
                tally.now_said += 1
                tally.now_right += actual == said.submit and said.funded == record.funded[0]
        return tally


def quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def minutes(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds / 60:,.1f} min"


HEADER = (
    "| run | asked | started | waited | error p50 / p90, all started | error p50 / p90, "
    "those that waited | the same, where both gave a start | no estimate | funding agrees "
    "| said 'starts now' / right |"
)


def pair(t: Tally, which: int, waited: bool, both: bool = False) -> str:
    values = t.errors(which, waited, both)
    return f"{minutes(quantile(values, 0.5))} / {minutes(quantile(values, 0.9))}"


def rows(label: str, t: Tally) -> list[str]:
    """Two rows: the forecast, then the baseline (before issue 40)."""
    started = len(t.started)
    waited = sum(1 for e in t.started if e[0] >= 60)
    agree = f"{100 * t.agree / started:.1f} %" if started else "-"
    asked = started + t.never_started
    head = f"| {label} | {asked} | {started} | {waited} |"
    return [
        f"{head} {pair(t, 1, False)} | {pair(t, 1, True)} | {pair(t, 1, True, True)} "
        f"| {t.missing(1)} | {agree} | {t.now_said} / {t.now_right} |",
        f"| (before) | | | | {pair(t, 2, False)} | {pair(t, 2, True)} | {pair(t, 2, True, True)} "
        f"| {t.missing(2)} | | |",
    ]


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(
        prog="python -m bench.forecast",
        description="the form's forecast at submit against what the family's runs did",
    )
    out.add_argument("--gpus", type=numbers(int), default=[88], help="88")
    out.add_argument("--loads", type=numbers(float), default=[0.8, 1.2], help="0.8,1.2")
    out.add_argument("--shares", type=numbers(float), default=[0.05, 0.35], help="0.05,0.35")
    out.add_argument("--seeds", type=numbers(int), default=[1], help="generator seeds (1)")
    out.add_argument("--days", type=int, default=3, help="simulated days per run (3)")
    out.add_argument(
        "--after",
        type=float,
        default=1.0,
        help="ask only for submissions after this many days, when the run has a history (1)",
    )
    out.add_argument("--every", type=int, default=1, help="forecast every Nth submission (1)")
    return out


def collect(argv: list[str] | None = None) -> dict[str, float]:
    args = parser().parse_args(argv)
    if args.every < 1 or args.days < 1:
        parser().error("--every and --days must be at least 1")
    total = Tally()
    print(HEADER)
    print("|" + " --- |" * 10)
    for gpus in args.gpus:
        for load in args.loads:
            for share in args.shares:
                for seed in args.seeds:
                    cell = Cell(gpus, load, share)
                    job = Job(cell, seed, "budget", args.days, 0)
                    tally = Watched(job, args.every, args.after * 86400).run()
                    total.add(tally)
                    print("\n".join(rows(f"{cell.label()}, seed {seed}", tally)), flush=True)
    print("\n".join(rows("all", total)))
    per = total.seconds / max(1, len(total.started) + total.never_started) * 1e3
    print(f"forecast cost: {per:.1f} ms per submission (dry run and forward run), mean")
    print(f"forecast starts before the actual one: {100 * total.early():.0f} % of those off")
    agreement = total.agree / len(total.started) if total.started else math.nan
    return {
        "forecast.start_error_p50_s": quantile(total.errors(1), 0.5),
        "forecast.start_error_p90_s": quantile(total.errors(1), 0.9),
        "forecast.waited_error_p50_s": quantile(total.errors(1, True), 0.5),
        "forecast.waited_error_p90_s": quantile(total.errors(1, True), 0.9),
        "forecast.baseline_error_p50_s": quantile(total.errors(2), 0.5),
        "forecast.baseline_error_p90_s": quantile(total.errors(2), 0.9),
        "forecast.baseline_waited_error_p50_s": quantile(total.errors(2, True), 0.5),
        "forecast.baseline_waited_error_p90_s": quantile(total.errors(2, True), 0.9),
        "forecast.funding_agreement": agreement,
    }


def main(argv: list[str] | None = None) -> int:
    collect(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
