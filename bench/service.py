"""bench.service — the budget service's API latency and page render time on a full store.

The store (SQLite file) holds 150 users in 15 teams (two of them sub-teams), 2,000
requests (the ones that fit running on 16 nodes × 8 virtual GPUs, the rest queued)
and 30 days of charged usage. The service's tornado application runs in this
process on a real HTTP server on 127.0.0.1; every route is asked ``--requests``
times in turn. The login is left out (the Hub's token check, which the service
caches per token): each request names one of the 150 users in turn, so most
answers are worked out for their user (the service keeps an answer per user until
the store changes). Printed: p50/p95 per route
with the store unchanged (the read model cached), and the time to build the read
model again after the store changed (what the first request after a change pays).

    .venv/bin/python -m bench.service [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from scheduler_core import model
from scheduler_core.store import Store
from spawner.readmodel.service import app as service_app
from spawner.readmodel.storeview import StoreModel, build_state

DAY = 86400.0
GPU = model.Pool("gpu", model.PoolKind.GPU)
CPU = model.Pool("cpu", model.PoolKind.CPU)


def nodes(gpu_nodes: int = 16, gpus: int = 8, cpu_nodes: int = 4) -> list[model.Node]:
    out = []
    for n in range(gpu_nodes):
        name = f"gpu-{n:02d}"
        mig = {0: ["1g.10gb"] * 7} if n == 0 else None
        out.append(
            model.Node(
                name=name,
                pool="gpu",
                cpus=96.0,
                memory_gib=1024.0,
                gpus=model.virtual_gpus(name, gpus, "virtual H100", mig),
            )
        )
    for n in range(cpu_nodes):
        out.append(model.Node(name=f"prep-{n}", pool="cpu", cpus=64.0, memory_gib=256.0))
    return out


def teams(count: int = 15) -> list[model.Team]:
    """``count`` teams; the last two are sub-teams of the one before them."""
    top = count - 2
    out = [model.Team(f"team-{i:02d}", {"gpu": 1 / top, "cpu": 1 / top}) for i in range(top)]
    parent = out[-1].name
    out += [model.Team(f"team-{i:02d}", {"gpu": 0.5, "cpu": 0.5}, parent) for i in (top, top + 1)]
    return out


def seed(
    store: Store,
    *,
    users: int = 150,
    team_count: int = 15,
    requests: int = 2000,
    days: int = 30,
    now: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Fill ``store`` as described in the module docstring; returns ``now``."""
    rng = rng or random.Random(1)
    now = now or time.time()
    node_list = nodes()
    team_list = teams(team_count)
    store.save_pools([GPU, CPU])
    store.save_teams(team_list)
    store.save_nodes(node_list)
    names = [t.name for t in team_list]
    members = {f"user-{u:03d}": names[u % len(names)] for u in range(users)}
    for day in range(days):
        for team in members.values():
            if rng.random() < 0.6:
                start = now - (days - day) * DAY + rng.uniform(0, DAY * 0.8)
                hours = rng.uniform(0.5, 6)
                gpus = rng.choice([1, 1, 1, 2, 4])
                store.add_usage(team, "gpu", start, start + hours * 3600, gpus * hours * 3600)
    free = [
        (node, gpu) for node in node_list if node.pool == "gpu" for gpu in node.gpus if not gpu.mig
    ]
    user_names = list(members)
    for i in range(requests):
        user = user_names[i % len(user_names)]
        team = members[user]
        request = model.Request(
            id=f"{user}/s{i}/{i:08x}",
            user=user,
            team=team,
            pool="gpu",
            submit=now - rng.uniform(60, 4 * 3600),
            gpus=1,
            min_runtime=3600.0,
            klass=rng.choice(list(model.RequestClass)),
            profile="gpu-notebook",
        )
        if free:
            node, gpu = free.pop()
            start = min(request.submit + rng.uniform(1, 120), now - 1.0)
            funded = rng.random() < 0.8
            store.book(
                model.Allocation(
                    request=request,
                    grants=(
                        model.NodeGrant(
                            node.name,
                            (model.Slice(gpu.uuid, model.SliceKind.WHOLE),),
                            cpus=1.0,
                            memory_gib=4.0,
                        ),
                    ),
                    start=start,
                    funded=funded,
                    protected_until=start + 3600.0,
                    charge_rate=1.0 if funded else 0.0,
                )
            )
        else:
            store.add_request(request)
    for i in range(40):
        store.append_event(
            now - i * 3600,
            "preempt",
            {"request": f"x/{i}", "reason": "unallocated session stopped for a funded request"},
        )
    return now


FIGURES = ("service.api_p95_ms", "service.page_p95_ms", "service.rebuild_ms")
"""The figures ``collect`` returns (bench/bars.toml)."""

ROUTES = ("api/v1/me", "api/v1/teams", "api/v1/queue", "api/v1/nodes", "my", "teams", "queue")


async def measure(store: Store, requests: int) -> dict[str, list[float]]:
    team_names = [t.name for t in teams()]

    def user(handler: service_app.Base) -> dict[str, Any]:
        index = int(handler.request.headers.get("X-Bench-User", "0"))
        return {
            "name": f"user-{index:03d}",
            "groups": [team_names[index % len(team_names)]],
            "scopes": ["custom:budget:read"],
        }

    service_app.Base.get_current_user = user  # type: ignore[method-assign]
    app = service_app.make_app(StoreModel(store, ttl=3600.0), cookie_secret=b"x" * 32)
    sockets = bind_sockets(0, "127.0.0.1")
    port = sockets[0].getsockname()[1]
    server = HTTPServer(app)
    server.add_sockets(sockets)
    client = AsyncHTTPClient()
    base = f"http://127.0.0.1:{port}/services/budget/"
    times: dict[str, list[float]] = {route: [] for route in ROUTES}
    await client.fetch(base + "api/v1/me")  # the first build
    for i in range(requests):
        route = ROUTES[i % len(ROUTES)]
        t0 = time.perf_counter()
        headers = {"X-Bench-User": str(i % 150)}  # the 150 users in turn
        response = await client.fetch(base + route, headers=headers)
        times[route].append((time.perf_counter() - t0) * 1e3)
        assert response.code == 200
    server.stop()
    return times


def main(argv: list[str] | None = None) -> int:
    collect(argv)
    return 0


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Measure and print as ``main`` does; the figures (FIGURES)."""
    parser = argparse.ArgumentParser(prog="python -m bench.service")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        store = Store.create(f"sqlite:///{Path(directory) / 'store.sqlite'}")
        t0 = time.perf_counter()
        now = seed(store)
        seeded = time.perf_counter() - t0
        usage = len(store.usage_records(now - 31 * DAY))
        pending = len(store.pending_requests())
        running = len(store.active_allocations())
        print(
            f"service: store of 150 users, 15 teams, {running} running + {pending} queued "
            f"requests, {usage} usage records over 30 days (seeded in {seeded:.1f} s)",
            flush=True,
        )
        builds = []
        model_ = StoreModel(store)
        for _ in range(5):
            t0 = time.perf_counter()
            build_state(store, model_.admin, time.time())
            builds.append((time.perf_counter() - t0) * 1e3)
        print(
            f"service: read model rebuilt after a store change: median "
            f"{statistics.median(builds):.0f} ms (of 5)",
            flush=True,
        )
        times = asyncio.run(measure(store, args.requests))
        every: list[float] = []
        for route, values in times.items():
            every.extend(values)
            print(
                f"service: {route:<13} p50 {percentile(values, 50):6.1f} ms   "
                f"p95 {percentile(values, 95):6.1f} ms   ({len(values)} requests)",
                flush=True,
            )
        api = [v for r, vs in times.items() if r.startswith("api/") for v in vs]
        pages = [v for r, vs in times.items() if not r.startswith("api/") for v in vs]
        print(
            f"service: API p95 {percentile(api, 95):.1f} ms, page render p95 "
            f"{percentile(pages, 95):.1f} ms over {len(every)} requests (bar 100 ms, aim 20 ms)",
            flush=True,
        )
        store.close()
    return {
        "service.api_p95_ms": percentile(api, 95),
        "service.page_p95_ms": percentile(pages, 95),
        "service.rebuild_ms": statistics.median(builds),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


if __name__ == "__main__":
    sys.exit(main())
