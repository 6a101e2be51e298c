"""Prometheus metrics of the budget scheduler, computed from the store at each scrape.

A custom collector (prometheus-client's ``Collector``) rather than gauges set in
the background: every scrape then shows the store as it is, as the pages do. Names
and units follow Kueue's (pending workloads, admission wait time) and the Slurm
exporter's (per-account usage and shares).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from scheduler_core.model import RequestClass
from spawner.readmodel.storeview import State, StoreModel

WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0)
"""Admission wait buckets (seconds), Kueue's range from seconds to hours."""
GIB = 1024.0**3


class BudgetCollector(Collector):
    def __init__(self, model: StoreModel) -> None:
        self.model = model

    def collect(self) -> Iterator[Metric]:
        state = self.model.state()  # the store as it is now (a build if it changed)
        for family in FAMILIES:
            yield from family(state)


def _pending(state: State) -> Iterator[Metric]:
    """Waiting requests per pool, team and class: every team of every pool in every class
    has a sample, 0 when none of its requests waits, so that an empty queue reads as 0
    and not as no data (the waiting ones first)."""
    pending = GaugeMetricFamily(
        "budgethub_pending_sessions",
        "Session requests waiting in the queue",
        labels=["pool", "team", "class"],
    )
    counts: dict[tuple[str, str, str], int] = {}
    for w in state.queue:
        key = (w.request.pool, w.request.team, w.request.klass.value)
        counts[key] = counts.get(key, 0) + 1
    for key, count in sorted(counts.items()):
        pending.add_metric(list(key), count)
    for team, pool in sorted(state.teams, key=lambda k: (k[1], k[0])):
        for klass in RequestClass:
            if (pool, team, klass.value) not in counts:
                pending.add_metric([pool, team, klass.value], 0)
    yield pending


def _teams(state: State) -> Iterator[Metric]:
    """Per team and pool: usage, share, occupancy ratio, funded holdings."""
    # One family per unit, so that the unit in the name is true: GPU pools charge
    # GPU-seconds, CPU pools core-seconds (before, both were "gpu_seconds").
    usage = GaugeMetricFamily(
        "budgethub_team_usage_gpu_seconds",
        "Charged usage over the lookback window in GPU pools, GPU-seconds",
        labels=["team", "pool"],
    )
    usage_cpu = GaugeMetricFamily(
        "budgethub_team_usage_cpu_seconds",
        "Charged usage over the lookback window in CPU pools, core-seconds",
        labels=["team", "pool"],
    )
    share = GaugeMetricFamily(
        "budgethub_team_share",
        "The team's share of the pool (fraction of its capacity, hierarchy applied)",
        labels=["team", "pool"],
    )
    ratio = GaugeMetricFamily(
        "budgethub_team_occupancy_ratio",
        "Occupancy ratio: usage plus protected work over the share's budget (1 = at share)",
        labels=["team", "pool"],
    )
    holds = GaugeMetricFamily(
        "budgethub_team_funded_units",
        "GPU-equivalents (or cores) the team's funded sessions hold now",
        labels=["team", "pool"],
    )
    for (team, pool), tp in sorted(state.teams.items()):
        (usage_cpu if tp.status.unit == "CPU" else usage).add_metric([team, pool], tp.used_units)
        share.add_metric([team, pool], tp.share)
        ratio.add_metric([team, pool], tp.ratio)
        holds.add_metric([team, pool], tp.status.funded)
    yield usage
    yield usage_cpu
    yield share
    yield ratio
    yield holds


def _waits(state: State) -> Iterator[Metric]:
    """The admission wait histogram per class."""
    by_class: dict[str, list[float]] = {}
    for klass, waited in state.waits:
        by_class.setdefault(klass, []).append(waited)
    wait = HistogramMetricFamily(
        "budgethub_admission_wait_time_seconds",
        "Time from submit to admission of sessions admitted in the last 30 days",
        labels=["class"],
    )
    for klass, waits in sorted(by_class.items()):
        cumulative = [0] * (len(WAIT_BUCKETS) + 1)
        for waited in waits:
            cumulative[bisect_left(WAIT_BUCKETS, waited)] += 1
        buckets, total = [], 0
        for bound, count in zip((*WAIT_BUCKETS, float("inf")), cumulative, strict=True):
            total += count
            buckets.append((_le(bound), float(total)))
        wait.add_metric([klass], buckets, sum(waits))
    yield wait


def _preemptions(state: State) -> Iterator[Metric]:
    """Preemptions by reason."""
    preemptions = CounterMetricFamily(
        "budgethub_preemptions",
        "Sessions preempted, by reason (from the scheduler's event log)",
        labels=["reason"],
    )
    for reason, count in sorted(state.preemptions.items()):
        preemptions.add_metric([reason], count)
    yield preemptions


def _nodes(state: State) -> Iterator[Metric]:
    """Per node: slices, CPUs and memory used and free, and whether it takes work."""
    slices = GaugeMetricFamily(
        "budgethub_slices",
        "GPU slices (whole GPUs, MIG instances) per node by state",
        labels=["node", "state"],
    )
    cpus = GaugeMetricFamily(
        "budgethub_node_cpus",
        "CPUs per node granted to sessions (used) and not (free); CPU pools have no slices",
        labels=["node", "state"],
    )
    memory = GaugeMetricFamily(
        "budgethub_node_memory_bytes",
        "Memory per node granted to sessions (used) and not (free), bytes",
        labels=["node", "state"],
    )
    health = GaugeMetricFamily(
        "budgethub_node_ready", "1 if the node takes new work", labels=["node", "health"]
    )
    for view in state.nodes:
        name = view.node.name
        held = sum(1 for _, _, by in view.slices if by)
        slices.add_metric([name, "used"], held)
        slices.add_metric([name, "free"], len(view.slices) - held)
        cpus.add_metric([name, "used"], view.cpus_used)
        cpus.add_metric([name, "free"], max(0.0, view.node.cpus - view.cpus_used))
        memory.add_metric([name, "used"], view.memory_used_gib * GIB)
        memory.add_metric(
            [name, "free"], max(0.0, view.node.memory_gib - view.memory_used_gib) * GIB
        )
        health.add_metric(
            [view.node.name, view.node.health.value],
            1.0 if view.node.health.value == "ready" else 0.0,
        )
    yield slices
    yield cpus
    yield memory
    yield health


def _cycles(state: State) -> Iterator[Metric]:
    """The embedded scheduler's cycle durations, as it reports them."""
    cycles = HistogramMetricFamily(
        "budgethub_cycle_duration_seconds",
        "Wall time of the embedded scheduler's cycles (as it reports them to the store)",
        labels=["hub"],
    )
    if state.status is not None:
        status = state.status
        buckets = [(_le(b), float(n)) for b, n in status.cycle_buckets]
        buckets.append(("+Inf", float(status.cycles)))
        cycles.add_metric([status.hub], buckets, status.cycle_seconds_sum)
    yield cycles


FAMILIES = (_pending, _teams, _waits, _preemptions, _nodes, _cycles)
"""What a scrape yields, in order."""


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def registry(model: StoreModel) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BudgetCollector(model))
    return reg
