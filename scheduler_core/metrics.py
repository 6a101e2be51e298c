"""Reducing a simulator run to the result object.

Percentiles use the nearest-rank method. A request that never started counts
with the wait it had reached at the horizon (a lower bound), so a policy that
starves work is not flattered by leaving it out. Team figures are hour by hour
in GPU pools: owed = min(share × capacity, the team's outstanding demand that
hour), where demand is the GPU-equivalents of its submitted, unfinished
requests (running or waiting); used counts every GPU-second the team ran,
funded or not; delivered = min(used, owed); fulfilment = Σ delivered / Σ owed.
``daily_fulfilment`` sums the same hours by day (days of 24 h from time 0, the
last one possibly shorter) before capping: per team, pool and day, owed = Σ of
the day's hourly owed and delivered = min(GPU-hours used that day, owed);
daily_fulfilment = Σ delivered / Σ owed (``daily_delivered_gpu_h`` is that Σ
delivered; Σ owed is ``owed_gpu_h``). A team whose usual job is larger than its
share can reach it by running the whole job for part of the day, which the
hourly figure never credits beyond the share. A parent team's figures cover
its sub-teams. The run's ``fulfilment`` and ``daily_fulfilment`` sum the
top-level teams.

Extra fields beyond the basic result: ``wait_s`` always has ``all`` and the four classes
(``n`` 0 and null percentiles for a class with no requests); ``occupancy_hourly``
is the GPU pools' busy fraction hour by hour; ``stranded_gpu_h`` is GPU time
stranded by fragmentation: the free GPU-equivalents of a pool (on ready nodes),
integrated over the times when some waiting request of that pool needed no more
GPU-equivalents than were free in the pool in total, yet fewer nodes than it
asks for each had its per-node part free (GPU-equivalents count, whatever kind
of slice is free). ``stranded_share`` is that over all GPU time in the horizon.

Lost work (``lost_gpu_seconds``, ``lost_gpu_h_by_class``, ``lost_share``) is GPU time
that preemptions throw away, counted by the simulator (scheduler_core.simulator): of a
run in a GPU pool that ends in a preemption, the time that left no progress (a run
that checkpoints keeps its work up to its last checkpoint, a snapshotted one all of
it, any other none), and a snapshot's taking; of a run after a preemption, its restart
(``restart_cost``, and a snapshot's restore) once it finishes. Snapshot times scale
with the session's memory (model.SNAPSHOT_TAKE_S_PER_GIB and the restore's figures,
from `python -m bench.snapshot`), at the GPU-equivalents of the request. A gang's lost place
and the wait to start again are not GPU time run and are not counted. A run still going
at the horizon is not lost. ``lost_share`` is lost GPU time over all GPU time in the
horizon (the denominator of ``occupancy``), and ``goodput = occupancy - lost_share``:
the share of the GPU time that went to work that was not thrown away. Idle time in a
session counts as busy in both. ``lost_gpu_h_by_stop``, beside the metrics (a run
rebuilt from a store's events, as the replay does, knows no stop's reason), splits the
same GPU-hours by the stop that threw them away (`simulator.stop_key`: its reason, the
victim funded or borrowed, its class, and whether it checkpoints, is snapshotted or
loses its whole run).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from scheduler_core.model import Health, PoolKind
from scheduler_core.simulator import RequestRecord, Segment, SimRun
from scheduler_core.teams import TeamTree

HOUR = 3600.0
HOURS_PER_DAY = 24
CLASSES = ("debug", "interactive", "batch", "dataprep")
"""Request classes that always appear in ``wait_s``."""
_EPS = 1e-9


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


def _segment_order(segment: Segment) -> tuple[float, float, float, str, str, bool]:
    return (segment.start, segment.end, segment.rate, segment.team, segment.pool, segment.funded)


def _in_one_order(run: SimRun) -> SimRun:
    """The run with its stretches in one order, whatever order they were recorded in, and
    their times to the microsecond: a float sum depends on its order, and a store keeps
    epoch seconds to about 0.24 µs, so a run rebuilt request by request from a store (the
    replay's) must still measure as the run that was stored did, to the last digit."""
    stretches = [
        Segment(s.team, s.pool, round(s.start, 6), round(s.end, 6), s.rate, s.funded)
        for s in run.segments
    ]
    return replace(run, segments=sorted(stretches, key=_segment_order))


def result(run: SimRun) -> dict[str, Any]:
    """The result object for a finished run."""
    run = _in_one_order(run)
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

    used, unallocated = gpu_seconds_used(run, kinds)
    gpu_capacity = sum(capacity[p] for p in gpu_pools)

    classes = sorted(set(CLASSES) | set(waits_by_class))
    stranded = stranded_gpu_seconds(run)
    metrics: dict[str, Any] = {
        "wait_s": {"all": wait_summary(all_waits)}
        | {klass: wait_summary(waits_by_class.get(klass, ())) for klass in classes},
        "occupancy": _round(used / (gpu_capacity * horizon), 4) if gpu_capacity else None,
        "unallocated_share": _round(unallocated / used, 4) if used else 0.0,
        "preemptions": sum(r.preemptions for r in run.records.values()),
        "lost_gpu_seconds": _round(run.lost_units, 1),
        "lost_gpu_h_by_class": lost_by_class(run),
        "never_started": never_started,
        "finished": sum(1 for r in run.records.values() if r.finished),
        "cycles": run.cycles,
        "stranded_gpu_h": _round(stranded / HOUR, 2),
        "stranded_share": _round(stranded / (gpu_capacity * horizon), 4) if gpu_capacity else 0.0,
        "occupancy_hourly": occupancy_hourly(run, gpu_pools, gpu_capacity),
    }
    metrics |= goodput(used, run.lost_units, gpu_capacity * horizon)
    metrics["teams"] = team_metrics(run, gpu_pools, capacity)
    owed = sum(t["owed_gpu_h"] for n, t in metrics["teams"].items() if t["top_level"])
    delivered = sum(t["delivered_gpu_h"] for n, t in metrics["teams"].items() if t["top_level"])
    metrics["fulfilment"] = _round(delivered / owed, 4) if owed else None
    daily = sum(t["daily_delivered_gpu_h"] for t in metrics["teams"].values() if t["top_level"])
    metrics["daily_fulfilment"] = _round(daily / owed, 4) if owed else None
    return {
        "scenario": scenario.name,
        "policy": scenario.settings.name,
        "sim_wall_s": _round(run.wall_s, 3),
        "requests": requests_out,
        "metrics": metrics,
        "lost_gpu_h_by_stop": {
            key: _round(seconds / HOUR, 2) for key, seconds in sorted(run.lost_by_stop.items())
        },
    }


def gpu_seconds_used(run: SimRun, kinds: dict[str, PoolKind]) -> tuple[float, float]:
    """GPU-seconds run in the GPU pools, all and unallocated."""
    used = unallocated = 0.0
    for segment in run.segments:
        if kinds[segment.pool] is PoolKind.GPU:
            amount = segment.rate * (segment.end - segment.start)
            used += amount
            if not segment.funded:
                unallocated += amount
    return used, unallocated


def goodput(used: float, lost: float, capacity: float) -> dict[str, float | None]:
    """``lost_share`` and ``goodput`` (module docstring) from GPU-seconds used, lost and
    available; both None where there is no GPU time at all."""
    if capacity <= 0:
        return {"lost_share": None, "goodput": None}
    return {
        "lost_share": _round(lost / capacity, 4),
        "goodput": _round((used - lost) / capacity, 4),
    }


def lost_by_class(run: SimRun) -> dict[str, float]:
    """GPU-hours lost per request class (module docstring), as the simulator counted them
    at each preemption: the classes sum to ``lost_gpu_seconds``."""
    lost = dict.fromkeys(CLASSES, 0.0) | run.lost_by_class
    return {klass: _round(seconds / HOUR, 2) for klass, seconds in lost.items()}


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
        owed_total = delivered_total = used_total = daily_delivered = 0.0
        weighted_share = 0.0
        for pool in pools:
            share = tree.share(name, pool)
            weighted_share += share * capacity[pool]
            cap_hour = share * capacity[pool] * HOUR
            team_demand = _sum_series(demand_h.get((m, pool), zero) for m in members)
            team_used = _sum_series(usage_h.get((m, pool), zero) for m in members)
            day_owed = day_used = 0.0
            for hour, (wanted, ran) in enumerate(zip(team_demand, team_used, strict=True)):
                owed = min(cap_hour, wanted)
                owed_total += owed
                delivered_total += min(ran, owed)
                used_total += ran
                day_owed += owed
                day_used += ran
                if (hour + 1) % HOURS_PER_DAY == 0 or hour == hours - 1:
                    daily_delivered += min(day_used, day_owed)
                    day_owed = day_used = 0.0
        out[name] = {
            "share": _round(weighted_share / total_capacity, 4) if total_capacity else 0.0,
            "owed_gpu_h": _round(owed_total / HOUR, 2),
            "delivered_gpu_h": _round(delivered_total / HOUR, 2),
            "used_gpu_h": _round(used_total / HOUR, 2),
            "charged_gpu_h": _round(sum(charged[m] for m in members) / HOUR, 2),
            "fulfilment": _round(delivered_total / owed_total, 4) if owed_total else None,
            "daily_delivered_gpu_h": _round(daily_delivered / HOUR, 2),
            "daily_fulfilment": _round(daily_delivered / owed_total, 4) if owed_total else None,
            "top_level": tree.teams[name].parent is None,
        }
    return out


def _sum_series(series: Iterable[list[float]]) -> list[float]:
    """Hour-by-hour sums of equally long series."""
    return [sum(values) for values in zip(*series, strict=True)]


def occupancy_hourly(run: SimRun, gpu_pools: list[str], gpu_capacity: float) -> list[float]:
    """The GPU pools' busy fraction in each hour of the horizon (the last may be partial)."""
    horizon = run.scenario.horizon
    hours = max(1, math.ceil(horizon / HOUR))
    if not gpu_capacity:
        return [0.0] * hours
    busy = HourlySeries(hours)
    pools = set(gpu_pools)
    for segment in run.segments:
        if segment.pool in pools:
            busy.add(segment.start, min(segment.end, horizon), segment.rate)
    out = []
    for hour, used in enumerate(busy.values()):
        length = min(HOUR, horizon - hour * HOUR)
        out.append(_round(used / (gpu_capacity * length), 4) if length > 0 else 0.0)
    return out


def waiting_spans(record: RequestRecord, horizon: float) -> list[tuple[float, float]]:
    """When the request waited: before its first start and after each preemption."""
    spans: list[tuple[float, float]] = []
    begin = record.submit
    for i, start in enumerate(record.starts):
        spans.append((begin, start))
        begin = record.ends[i] if i < len(record.ends) else horizon
    if not record.finished and record.preemptions >= len(record.starts):
        spans.append((begin, horizon))
    return [(a, min(b, horizon)) for a, b in spans if min(b, horizon) > a]


class _PoolFree:
    """Free GPU-equivalents per ready node of one pool, with a count of nodes per amount free."""

    def __init__(self) -> None:
        self.capacity: dict[str, float] = {}
        self.used: dict[str, float] = defaultdict(float)
        self.ready: dict[str, bool] = {}
        self.by_free: dict[float, int] = defaultdict(int)
        self.total = 0.0

    def _free(self, node: str) -> float:
        if not self.ready[node]:
            return 0.0
        return round(max(0.0, self.capacity[node] - self.used[node]), 6)

    def add(self, node: str, capacity: float, ready: bool) -> None:
        self.capacity[node] = capacity
        self.ready[node] = ready
        free = self._free(node)
        self.by_free[free] += 1
        self.total += free

    def change(self, node: str, used: float = 0.0, ready: bool | None = None) -> None:
        old = self._free(node)
        self.by_free[old] -= 1
        if not self.by_free[old]:
            del self.by_free[old]
        self.total -= old
        self.used[node] += used
        if ready is not None:
            self.ready[node] = ready
        new = self._free(node)
        self.by_free[new] += 1
        self.total += new

    def nodes_with(self, amount: float) -> int:
        return sum(n for free, n in self.by_free.items() if free + _EPS >= amount)


def stranded_gpu_seconds(run: SimRun) -> float:
    """Free GPU-seconds while fragmentation kept a waiting request out (module docstring)."""
    scenario = run.scenario
    horizon = scenario.horizon
    kinds = {p.name: p.kind for p in scenario.pools}
    pool_of = {n.name: n.pool for n in scenario.nodes}
    # (time, order, pool, payload): node changes before waiting changes at one time.
    events: list[tuple[float, int, str, tuple[Any, ...]]] = []
    pools: dict[str, _PoolFree] = defaultdict(_PoolFree)
    for node in scenario.nodes:
        if kinds[node.pool] is not PoolKind.GPU:
            continue
        pools[node.pool].add(node.name, node.gpu_capacity, node.health is Health.READY)
    for event in scenario.events:
        if event.node in pools[pool_of[event.node]].capacity:
            ready = event.health is Health.READY
            events.append((event.at, 0, pool_of[event.node], ("health", event.node, ready)))
    for request in scenario.requests:
        record = run.records[request.id]
        if kinds[request.pool] is not PoolKind.GPU or request.submit > horizon:
            continue
        for i, start in enumerate(record.starts):
            held = record.nodes[i]
            per_node = record.weight / len(held)
            end = record.ends[i] if i < len(record.ends) else horizon
            for name in held:
                events.append((start, 0, request.pool, ("use", name, per_node)))
                events.append((end, 0, request.pool, ("use", name, -per_node)))
        need = (round(request.gpu_weight / request.nodes, 6), request.nodes)
        for begin, end in waiting_spans(record, horizon):
            events.append((begin, 1, request.pool, ("wait", need, 1)))
            events.append((end, 1, request.pool, ("wait", need, -1)))
    events.sort(key=lambda e: (e[0], e[1]))
    waiting: dict[str, dict[tuple[float, int], int]] = defaultdict(lambda: defaultdict(int))
    stranded = 0.0
    i = 0
    while i < len(events):
        now = events[i][0]
        while i < len(events) and events[i][0] == now:
            _, _, pool, payload = events[i]
            if payload[0] == "use":
                pools[pool].change(payload[1], used=payload[2])
            elif payload[0] == "health":
                pools[pool].change(payload[1], ready=payload[2])
            else:
                waiting[pool][payload[1]] += payload[2]
            i += 1
        until = min(events[i][0], horizon) if i < len(events) else horizon
        if until <= now:
            continue
        for pool, needs in waiting.items():
            free = pools[pool]
            if free.total > _EPS and any(
                count > 0 and _blocked(free, per_node, nodes)
                for (per_node, nodes), count in needs.items()
            ):
                stranded += free.total * (until - now)
    return stranded


def _blocked(free: _PoolFree, per_node: float, nodes: int) -> bool:
    """Enough free GPU-equivalents in the pool, but not enough on enough nodes?"""
    return per_node * nodes <= free.total + _EPS and free.nodes_with(per_node) < nodes
