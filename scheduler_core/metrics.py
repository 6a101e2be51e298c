"""Reducing a simulator run to the §5 result object.

Percentiles use the nearest-rank method. A request that never started counts
with the wait it had reached at the horizon (a lower bound), so a policy that
starves work is not flattered by leaving it out. Team figures are hour by hour
in GPU pools: owed = min(share × capacity, the team's outstanding demand that
hour), where demand is the GPU-equivalents of its submitted, unfinished
requests (running or waiting); used counts every GPU-second the team ran,
funded or not; delivered = min(used, owed); fulfilment = Σ delivered / Σ owed.
A parent team's figures cover its sub-teams.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from scheduler_core.model import PoolKind
from scheduler_core.simulator import SimRun
from scheduler_core.teams import TeamTree

HOUR = 3600.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted ``values`` (q in 0..100)."""
    if not values:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(values)))
    return values[rank - 1]


def wait_summary(waits: Iterable[float]) -> dict[str, Any]:
    ordered = sorted(waits)
    if not ordered:
        return {"n": 0, "p50": None, "p90": None, "p99": None}
    return {
        "n": len(ordered),
        "p50": _round(percentile(ordered, 50)),
        "p90": _round(percentile(ordered, 90)),
        "p99": _round(percentile(ordered, 99)),
    }


def _round(value: float, digits: int = 3) -> float:
    return round(value, digits)


class HourlySeries:
    """Per-hour integrals of piecewise-constant rates, added one interval at a time."""

    def __init__(self, hours: int) -> None:
        self.hours = hours
        self.direct = [0.0] * (hours + 1)
        self.step = [0.0] * (hours + 2)

    def add(self, start: float, end: float, rate: float) -> None:
        if end <= start or rate == 0.0:
            return
        first, last = int(start // HOUR), int(end // HOUR)
        first, last = min(first, self.hours), min(last, self.hours)
        if first == last:
            self.direct[first] += rate * (end - start)
            return
        self.direct[first] += rate * ((first + 1) * HOUR - start)
        self.direct[last] += rate * (end - last * HOUR)
        self.step[first + 1] += rate * HOUR
        self.step[last] -= rate * HOUR

    def values(self) -> list[float]:
        out = []
        running = 0.0
        for hour in range(self.hours):
            running += self.step[hour]
            out.append(self.direct[hour] + running)
        return out


def result(run: SimRun) -> dict[str, Any]:
    """The §5 result object for a finished run."""
    scenario = run.scenario
    horizon = scenario.horizon
    kinds = {p.name: p.kind for p in scenario.pools}
    gpu_pools = [p for p, k in kinds.items() if k is PoolKind.GPU]
    capacity: dict[str, float] = defaultdict(float)
    for node in scenario.nodes:
        capacity[node.pool] += node.gpu_capacity if kinds[node.pool] is PoolKind.GPU else node.cpus

    requests_out = []
    waits_by_class: dict[str, list[float]] = defaultdict(list)
    all_waits: list[float] = []
    never_started = 0
    for request in scenario.requests:
        record = run.records[request.id]
        wait = record.wait
        if wait is None:
            never_started += 1
            if request.submit <= horizon:
                counted = horizon - request.submit
                all_waits.append(counted)
                waits_by_class[record.klass].append(counted)
        else:
            all_waits.append(wait)
            waits_by_class[record.klass].append(wait)
        requests_out.append(
            {
                "id": record.id,
                "submit": record.submit,
                "wait": None if wait is None else _round(wait),
                "starts": [_round(t) for t in record.starts],
                "ends": [_round(t) for t in record.ends],
                "nodes": record.nodes,
                "funded": record.funded,
                "preemptions": record.preemptions,
                "finished": record.finished,
                "class": record.klass,
                "team": record.team,
            }
        )

    used = 0.0
    unallocated = 0.0
    for segment in run.segments:
        if kinds[segment.pool] is PoolKind.GPU:
            amount = segment.rate * (segment.end - segment.start)
            used += amount
            if not segment.funded:
                unallocated += amount
    gpu_capacity = sum(capacity[p] for p in gpu_pools)

    metrics: dict[str, Any] = {
        "wait_s": {"all": wait_summary(all_waits)}
        | {klass: wait_summary(waits) for klass, waits in sorted(waits_by_class.items())},
        "occupancy": _round(used / (gpu_capacity * horizon), 4) if gpu_capacity else None,
        "unallocated_share": _round(unallocated / used, 4) if used else 0.0,
        "preemptions": sum(r.preemptions for r in run.records.values()),
        "lost_gpu_seconds": _round(run.lost_units, 1),
        "never_started": never_started,
        "finished": sum(1 for r in run.records.values() if r.finished),
        "cycles": run.cycles,
    }
    metrics["teams"] = team_metrics(run, gpu_pools, capacity)
    owed = sum(t["owed_gpu_h"] for n, t in metrics["teams"].items() if t["top_level"])
    delivered = sum(t["delivered_gpu_h"] for n, t in metrics["teams"].items() if t["top_level"])
    metrics["fulfilment"] = _round(delivered / owed, 4) if owed else None
    return {
        "scenario": scenario.name,
        "policy": scenario.settings.name,
        "sim_wall_s": _round(run.wall_s, 3),
        "requests": requests_out,
        "metrics": metrics,
    }


def team_metrics(
    run: SimRun, gpu_pools: list[str], capacity: dict[str, float]
) -> dict[str, dict[str, Any]]:
    scenario = run.scenario
    horizon = scenario.horizon
    hours = max(1, math.ceil(horizon / HOUR))
    tree = TeamTree.build(scenario.teams)
    pools = set(gpu_pools)
    demand: dict[tuple[str, str], HourlySeries] = {}
    usage: dict[tuple[str, str], HourlySeries] = {}
    charged: dict[str, float] = defaultdict(float)

    def series(table: dict[tuple[str, str], HourlySeries], key: tuple[str, str]) -> HourlySeries:
        found = table.get(key)
        if found is None:
            found = table[key] = HourlySeries(hours)
        return found

    for record in run.records.values():
        if record.pool not in pools:
            continue
        end = record.finish_time if record.finish_time is not None else horizon
        series(demand, (record.team, record.pool)).add(
            record.submit, min(end, horizon), record.weight
        )
    for segment in run.segments:
        if segment.pool not in pools:
            continue
        series(usage, (segment.team, segment.pool)).add(segment.start, segment.end, segment.rate)
        if segment.funded:
            charged[segment.team] += segment.rate * (segment.end - segment.start)

    demand_h = {key: s.values() for key, s in demand.items()}
    usage_h = {key: s.values() for key, s in usage.items()}
    zero = [0.0] * hours
    out: dict[str, dict[str, Any]] = {}
    total_capacity = sum(capacity[p] for p in pools)
    for name in tree.teams:
        members = tree.subtree(name)
        owed_total = delivered_total = used_total = 0.0
        weighted_share = 0.0
        for pool in pools:
            share = tree.share(name, pool)
            weighted_share += share * capacity[pool]
            cap_hour = share * capacity[pool] * HOUR
            team_demand = _sum_series(demand_h.get((m, pool), zero) for m in members)
            team_used = _sum_series(usage_h.get((m, pool), zero) for m in members)
            for wanted, ran in zip(team_demand, team_used, strict=True):
                owed = min(cap_hour, wanted)
                owed_total += owed
                delivered_total += min(ran, owed)
                used_total += ran
        out[name] = {
            "share": _round(weighted_share / total_capacity, 4) if total_capacity else 0.0,
            "owed_gpu_h": _round(owed_total / HOUR, 2),
            "delivered_gpu_h": _round(delivered_total / HOUR, 2),
            "used_gpu_h": _round(used_total / HOUR, 2),
            "charged_gpu_h": _round(sum(charged[m] for m in members) / HOUR, 2),
            "fulfilment": _round(delivered_total / owed_total, 4) if owed_total else None,
            "top_level": tree.teams[name].parent is None,
        }
    return out


def _sum_series(series: Iterable[list[float]]) -> list[float]:
    """Hour-by-hour sums of equally long series."""
    return [sum(values) for values in zip(*series, strict=True)]
