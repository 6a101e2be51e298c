"""`fairshare`: Slurm-style multifactor priority, as a baseline.

A request's priority is ``2^(-U/S) + age_weight x min(age / max_age, 1)``: U is
its team's decayed usage of the pool over everyone's, S its share over all
shares (Slurm's classic fair-share factor, flat over teams), age the time since
submission. Requests go by priority (then declared priority, then submit time),
each placed if it fits (backfill without reservations: no runtimes are known);
nothing is ever preempted. Settings: ``fairshare_half_life``,
``fairshare_max_age``, ``fairshare_age_weight``.

The policy is pure, so decayed usage comes from what the view holds:
running sessions decay exactly from their start; the rest of the usage charged
in the lookback window is taken as spread evenly over it; older usage is
forgotten (its weight is at most 2^(-lookback / half-life)).
"""

from __future__ import annotations

import math
from collections import defaultdict

from scheduler_core.baselines.common import GreedyCycle, funding_share
from scheduler_core.model import Request
from scheduler_core.registry import register
from scheduler_core.view import ClusterView, Decisions

LN2 = math.log(2.0)


def decayed(units_per_s: float, span: float, half_life: float) -> float:
    """Weight now of ``units_per_s`` used steadily over the last ``span`` seconds."""
    if span <= 0.0 or half_life <= 0.0:
        return 0.0
    return units_per_s * half_life / LN2 * (1.0 - math.pow(2.0, -span / half_life))


def decayed_usage(view: ClusterView, now: float) -> dict[tuple[str, str], float]:
    """(team, pool) → usage with exponential decay, as far as the view can tell."""
    half_life = view.settings.fairshare_half_life
    window = view.window
    running: dict[tuple[str, str], float] = defaultdict(float)
    out: dict[tuple[str, str], float] = defaultdict(float)
    for allocation in view.allocations:
        if not allocation.funded:
            continue
        span = min(max(0.0, now - allocation.start), window)
        key = (allocation.team, allocation.pool)
        running[key] += allocation.charge_rate * span
        out[key] += decayed(allocation.charge_rate, span, half_life)
    for key, units in view.usage.items():
        rest = max(0.0, units - running.get(key, 0.0))
        if rest > 0.0 and window > 0.0:
            out[key] += decayed(rest / window, window, half_life)
    return out


def fairshare_factors(view: ClusterView, now: float) -> dict[tuple[str, str], float]:
    """(team, pool) → 2^(-U/S); 0 for a team with no share of the pool."""
    tree = view.teams
    usage = decayed_usage(view, now)
    factors: dict[tuple[str, str], float] = {}
    for pool in view.pools:
        shares = {name: funding_share(tree, name, pool) for name in tree.teams}
        total_share = sum(shares.values())
        total_usage = sum(usage.get((name, pool), 0.0) for name in tree.teams)
        for name, share in shares.items():
            if share <= 0.0 or total_share <= 0.0:
                factors[(name, pool)] = 0.0
                continue
            used = usage.get((name, pool), 0.0) / total_usage if total_usage > 0.0 else 0.0
            factors[(name, pool)] = math.pow(2.0, -used / (share / total_share))
    return factors


@register("fairshare")
def fairshare_policy(view: ClusterView, now: float) -> Decisions:
    """Highest multifactor priority first; no preemption."""
    settings = view.settings
    cycle = GreedyCycle(view, now)
    factors = fairshare_factors(view, now)
    max_age = settings.fairshare_max_age
    weight = settings.fairshare_age_weight

    def priority(request: Request) -> float:
        age = max(0.0, now - request.submit)
        age_factor = min(age / max_age, 1.0) if max_age > 0.0 else 1.0
        return factors.get((request.team, request.pool), 0.0) + weight * age_factor

    ranked = sorted(view.pending, key=lambda r: (-priority(r), -r.priority, r.submit, r.id))
    for request in ranked:
        cycle.consider(request, True)
        grants = cycle.place(request)
        if grants is not None:
            cycle.admit(request, grants, True, cycle.min_runtime(request))
    return cycle.decisions()
