"""Per-request results of bench.family's grid and of the seed-like months, to compare trees.

Run: `.venv/bin/python -m bench.identical --out PATH [--family-gpus 88,256]
[--months 1,2] [--policies budget,legacy] [--jobs N]`, then the same in another tree
(`git worktree add /tmp/base COMMIT`, run with ``PYTHONPATH=/tmp/base``) and
`python -m bench.identical --compare A.json B.json`.

Each run (a family cell and seed under a policy, or a 30-day month) is simulated
and every request's results are written: its start times, the nodes of each start,
whether each start was funded, its end times and how often it was preempted. The
comparison names the runs that differ and the first requests that differ in
each; it exits 1 if any does. A change meant to leave decisions alone (a faster
policy, the rules moved into their own units) must compare equal. Only the
scenario generator and the simulator are used, so the same file runs in a tree
that predates it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.family import Cell, Job, scenario_of
from scheduler_core.research.generator import SeedLikeOptions, seed_like
from scheduler_core.scenario import parse_scenario
from scheduler_core.simulator import Simulation

Spec = tuple[str, str, int, float, float, int, int]
"""(label, policy, gpus, load, share, seed, days); gpus 0 is a 30-day seed-like month."""


def specs(gpus: Sequence[int], months: Sequence[int], policies: Sequence[str]) -> list[Spec]:
    """The runs: bench.family's default grid on the ``gpus`` sizes (loads 0.8, 1.0,
    1.2, notebook shares 5 % and 35 %, seeds 1 and 2, 7 days) under each policy, then
    the default seed-like month of each seed in ``months`` under the budget policy."""
    out: list[Spec] = []
    for policy in policies:
        for size in gpus:
            for load in (0.8, 1.0, 1.2):
                for share in (0.05, 0.35):
                    for seed in (1, 2):
                        label = f"family {policy} {size} GPUs load {load} share {share} seed {seed}"
                        out.append((label, policy, size, load, share, seed, 7))
    out.extend((f"month budget seed {seed}", "budget", 0, 0.0, 0.0, seed, 30) for seed in months)
    return out


def one(spec: Spec) -> tuple[str, dict[str, Any], float]:
    """Simulate one run; (label, per-request results, wall seconds)."""
    label, policy, gpus, load, share, seed, days = spec
    if gpus:
        job = Job(Cell(gpus, load, share), seed, policy, days, 0)
        scenario = scenario_of(job)
    else:
        scenario = parse_scenario(seed_like(SeedLikeOptions(seed=seed)))
    started = time.perf_counter()
    run = Simulation(scenario).run()
    wall = time.perf_counter() - started
    requests = {
        rid: [r.starts, r.nodes, r.funded, r.ends, r.preemptions]
        for rid, r in sorted(run.records.items())
    }
    return label, requests, wall


def digest(requests: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(requests, sort_keys=True).encode()).hexdigest()[:16]


def dump(path: Path, runs: list[Spec], jobs: int) -> None:
    """Simulate ``runs`` (``jobs`` at once) and write their results to ``path``."""
    found: dict[str, Any] = {}
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        for label, requests, wall in pool.map(one, runs):
            found[label] = requests
            print(f"{label}: {len(requests)} requests, {digest(requests)} ({wall:.1f} s)")
    path.write_text(json.dumps(found, sort_keys=True))


def compare(a: Path, b: Path) -> int:
    """Print the runs that differ; 0 if every run of both files is the same."""
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    differ = same = 0
    for label in sorted(set(left) | set(right)):
        if label not in left or label not in right:
            print(f"{label}: only in {a if label in left else b}")
            differ += 1
            continue
        ours, theirs = left[label], right[label]
        if ours == theirs:
            same += 1
            continue
        differ += 1
        changed = [r for r in sorted(set(ours) | set(theirs)) if ours.get(r) != theirs.get(r)]
        print(f"{label}: {len(changed)} of {len(ours)} requests differ, first:")
        for rid in changed[:3]:
            print(f"  {rid}: {ours.get(rid)} against {theirs.get(rid)}")
    print(f"{same} runs identical, {differ} differ ({a} against {b})")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.identical", description=__doc__)
    parser.add_argument("--out", type=Path, help="write the per-request results here (JSON)")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"))
    parser.add_argument("--family-gpus", default="88,256", help="family sizes (88,256)")
    parser.add_argument("--months", default="1", help="seed-like month seeds (1)")
    parser.add_argument("--policies", default="budget,legacy", help="family policies")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (1)")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("--out or --compare is needed")

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    runs = specs(ints(args.family_gpus), ints(args.months), args.policies.split(","))
    dump(args.out, runs, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
