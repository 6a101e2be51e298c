"""Spawn benchmarks: BudgetSpawner against stock DockerSpawner, same image and engine.

Two real Hubs run side by side (127.0.0.1 only, host networking): one with
BudgetSpawner's debug profile, one with DockerSpawner 14 on the same image
(``budgethub/gpu``). Spawns alternate between them in one run. Measured:

* sequential spawn latency (REST POST until the Hub answers 201, i.e. ready),
  and the bare container start (docker run -> jupyter server answering);
* ten spawns at once and ten stops at once, per spawner, ``--concurrent-rounds`` times
  (the order of the two spawners alternating from round to round), and where
  budgethub's starts spent their time (the queue, the turn to boot on the node, the
  boot until the server answered, then the Hub: from the log's "running on" lines);
* grant latency (submit -> admission, from the Hub log) with free capacity;
* the Hub's responsiveness (GET /hub/api/ round trip) idle and while 150 users
  hold 500 queued requests.

Run: ``python -m bench.spawn [--rounds N] [--concurrent-rounds N] [--load-seconds S]``
(needs the engine and images of ``make images``). Each figure is printed as soon as it is measured;
``--load-seconds 0`` skips the queued-load part (500 submissions take minutes).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import requests

from harness.hub import Hub, free_port, remove_containers, start_hub

IMAGE = "budgethub/gpu:latest"
DEBUG = {"profile": "debug", "slices": "gpu-250m"}
FIGURES = (
    "spawn.dockerspawner_s",
    "spawn.budget_s",
    "spawn.bare_container_s",
    "spawn.budget_over_bare_s",
    "spawn.dockerspawner_concurrent_s",
    "spawn.budget_concurrent_s",
    "spawn.budget_stop_concurrent_s",
    "spawn.grant_max_ms",
    "spawn.hub_api_idle_p99_ms",
    "spawn.hub_api_queued_p99_ms",
)
"""The figures ``collect`` returns (bench/bars.toml); the ratios to DockerSpawner and to
the bare container are taken there, from the figures of the same run."""

DOCKERSPAWNER = """
from dockerspawner import DockerSpawner
from jupyterhub.utils import random_port


class HostDockerSpawner(DockerSpawner):
    # Stock DockerSpawner on host networking: its own port per server.
    async def start(self):
        self.port = random_port()
        return await super().start()

    async def get_ip_and_port(self):
        return "127.0.0.1", self.port


c.JupyterHub.spawner_class = HostDockerSpawner
c.DockerSpawner.image = {image!r}
c.DockerSpawner.network_name = "host"
c.DockerSpawner.extra_host_config = {{"network_mode": "host"}}
c.DockerSpawner.remove = True
c.DockerSpawner.use_internal_ip = True  # no port bindings on host networking
c.DockerSpawner.name_template = "bench-ds-{{username}}"
"""


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed(action: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    action()
    return time.perf_counter() - t0


def spawn_ready(hub: Hub, user: str, options: dict[str, Any]) -> None:
    response = hub.spawn(user, options)
    if response.status_code == 202:
        hub.wait_ready(user, timeout=120)
    elif response.status_code != 201:
        raise RuntimeError(f"{user}: {response.status_code} {response.text}")


def stop(hub: Hub, user: str) -> None:
    hub.stop_server(user)


def bare_container_start(rounds: int) -> list[float]:
    """docker run -> the jupyter server answering, no Hub."""
    client = docker.from_env()
    times = []
    for _ in range(rounds):
        port = free_port()
        t0 = time.perf_counter()
        container = client.containers.run(
            IMAGE,
            ["jupyter", "server", f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1"],
            network_mode="host",
            detach=True,
            remove=False,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    requests.get(f"http://127.0.0.1:{port}/api", timeout=1)
                    break
                except requests.ConnectionError:
                    time.sleep(0.02)
            times.append(time.perf_counter() - t0)
        finally:
            container.remove(force=True)
    return times


def concurrently(action: Callable[[str], Any], users: list[str]) -> list[float]:
    with ThreadPoolExecutor(len(users)) as pool:
        return list(pool.map(lambda u: timed(lambda: action(u)), users))


def api_round_trips(hub: Hub, seconds: float) -> list[float]:
    times = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        times.append(timed(lambda: hub.http.get(f"{hub.api}/", timeout=30)))
        time.sleep(0.05)
    return times


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def start_hubs(directory: Path, users: list[str]) -> tuple[Hub, Hub]:
    groups = {"bench": users}
    teams = [{"name": "bench", "share": {"gpu": 1.0, "cpu": 1.0}}]
    nodes = [{"name": "gpu-1", "pool": "gpu", "gpus": 8, "cpus": 16, "memory_gib": 32}]
    hubs = []
    for name, extra in (
        ("budget", "c.JupyterHub.concurrent_spawn_limit = 0\n"),
        ("dockerspawner", DOCKERSPAWNER.format(image=IMAGE)),
    ):
        home = directory / name
        home.mkdir()
        hub = start_hub(
            home,
            hub_name=f"bench-{name}",
            nodes=nodes,
            teams=teams,
            groups=groups,
            extra=extra + "c.JupyterHub.log_level = 'INFO'\n",
        )
        hubs.append(hub)
    return hubs[0], hubs[1]


def queued_load(hub: Hub, seconds: float) -> dict[str, float]:
    """Fill the GPUs, queue 500 requests of 150 users, measure the Hub meanwhile."""
    fillers = [f"fill{i}" for i in range(8)]
    for user in fillers:
        hub.http.post(f"{hub.api}/users/{user}", timeout=10)
        hub.http.post(f"{hub.api}/groups/bench/users", json={"users": [user]}, timeout=10)
    concurrently(lambda u: spawn_ready(hub, u, {"profile": "gpu-notebook", "gpus": 1}), fillers)
    users = [f"q{i:03d}" for i in range(150)]
    hub.http.post(f"{hub.api}/users", json={"usernames": users}, timeout=60)
    hub.http.post(f"{hub.api}/groups/bench/users", json={"users": users}, timeout=60)
    wanted = [(users[i % 150], f"s{i // 150}") for i in range(500)]

    def queue(item: tuple[str, str]) -> int:
        user, server = item
        path = hub.server_path(user, server)
        return hub.http.post(path, json=DEBUG, timeout=120).status_code

    t0 = time.perf_counter()
    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(queue, wanted))
    submitted_s = time.perf_counter() - t0
    queued = sum(1 for code in codes if code == 202)
    trips = api_round_trips(hub, seconds)
    return {
        "queued": queued,
        "submit_500_s": submitted_s,
        "api_p50_ms": p(trips, 0.5) * 1e3,
        "api_p99_ms": p(trips, 0.99) * 1e3,
        "api_max_ms": max(trips, default=float("nan")) * 1e3,
    }


def grant_latencies(hub: Hub) -> list[float]:
    text = hub.log_path.read_text(errors="replace")
    return [float(ms) for ms in re.findall(r"granted \S+ on \S+, ([\d.]+) ms after", text)]


PHASES = re.compile(r"queued ([\d.]+) s, turn ([\d.]+) s, boot ([\d.]+) s\)")
"""BudgetSpawner's "running on" line: where a start's time went before the Hub's part."""


def start_phases(text: str) -> dict[str, list[float]]:
    """Per phase (queued, turn, boot), the seconds of each start logged in ``text``."""
    found = PHASES.findall(text)
    return {
        name: [float(row[i]) for row in found] for i, name in enumerate(("queued", "turn", "boot"))
    }


def concurrent_rounds(
    budget: Hub, stock: Hub, users: list[str], rounds: int
) -> dict[str, dict[str, float]]:
    """``rounds`` of all ``users`` spawning at once then stopping at once, on each Hub in
    turn (which goes first alternates); medians over every round, and budgethub's
    phases (median seconds) read from its log."""
    spawns: dict[str, list[float]] = {"budget": [], "dockerspawner": []}
    stops: dict[str, list[float]] = {"budget": [], "dockerspawner": []}
    mark = len(budget.log_path.read_text(errors="replace"))
    order = [("budget", budget, DEBUG), ("dockerspawner", stock, {})]
    for i in range(rounds):
        for name, hub, options in order if i % 2 == 0 else order[::-1]:
            went = concurrently(lambda u, h=hub, o=options: spawn_ready(h, u, o), users)
            spawns[name] += went
            stops[name] += concurrently(lambda u, h=hub: stop(h, u), users)
            say(
                f"{len(users)} at once, {name} (round {i + 1}/{rounds}): spawn median "
                f"{median(went):.2f} s, max {max(went):.2f} s"
            )
    out = {
        name: {"spawn_median_s": median(spawns[name]), "stop_median_s": median(stops[name])}
        for name in spawns
    }
    phases = start_phases(budget.log_path.read_text(errors="replace")[mark:])
    out["budget"].update({f"{k}_median_s": median(v) for k, v in phases.items()})
    return out


def say(line: str) -> None:
    """Print a figure the moment it is measured (a run takes minutes; nothing waits for
    the end, and a later failure loses nothing already printed)."""
    print(line, flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.spawn")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--users", type=int, default=10, help="spawns and stops at once")
    parser.add_argument(
        "--concurrent-rounds",
        type=int,
        default=2,
        help="rounds of --users spawns at once per spawner (which goes first alternates)",
    )
    parser.add_argument(
        "--load-seconds",
        type=float,
        default=20.0,
        help="how long to time the Hub's API with 500 requests queued; 0 skips that part",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: must be at least 1")
    if not 2 <= args.users <= 100:
        parser.error("--users: must be between 2 and 100")
    if args.concurrent_rounds < 1:
        parser.error("--concurrent-rounds: must be at least 1")
    if args.load_seconds < 0:
        parser.error("--load-seconds: must be 0 (skip the queued load) or more")
    users = [f"u{i}" for i in range(args.users)]
    results: dict[str, Any] = {}
    work = Path(tempfile.gettempdir()) / "budgethub-bench-spawn"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    # The Hubs' logs stay in the work directory for a failed run.
    budget, stock = start_hubs(work, users)
    try:
        for hub in (budget, stock):
            hub.http.post(f"{hub.api}/users", json={"usernames": users}, timeout=30)
        # Warm both (image layers in the page cache, first-use paths).
        spawn_ready(budget, "u0", DEBUG)
        stop(budget, "u0")
        spawn_ready(stock, "u0", {})
        stop(stock, "u0")
        seq: dict[str, list[float]] = {"budget": [], "dockerspawner": []}
        for i in range(args.rounds):
            seq["budget"].append(timed(lambda: spawn_ready(budget, "u1", DEBUG)))
            stop(budget, "u1")
            seq["dockerspawner"].append(timed(lambda: spawn_ready(stock, "u1", {})))
            stop(stock, "u1")
            say(
                f"spawn round {i + 1}/{args.rounds}: budgethub {seq['budget'][-1]:.2f} s, "
                f"DockerSpawner {seq['dockerspawner'][-1]:.2f} s"
            )
        results["sequential_median_s"] = {k: median(v) for k, v in seq.items()}
        results["ratio_budget_to_dockerspawner"] = median(seq["budget"]) / median(
            seq["dockerspawner"]
        )
        say(
            "spawn (debug profile, free capacity), median of "
            f"{args.rounds} alternating: budgethub {results['sequential_median_s']['budget']:.2f}"
            f" s, DockerSpawner {results['sequential_median_s']['dockerspawner']:.2f} s "
            f"(ratio {results['ratio_budget_to_dockerspawner']:.2f}; bar <= 1.10)"
        )
        bare = bare_container_start(args.rounds)
        results["bare_container_median_s"] = median(bare)
        results["ratio_budget_to_bare"] = median(seq["budget"]) / median(bare)
        say(
            f"bare container (docker run -> server answering): median {median(bare):.2f} s "
            f"(budgethub / bare {results['ratio_budget_to_bare']:.2f})"
        )
        conc = concurrent_rounds(budget, stock, users, args.concurrent_rounds)
        results[f"concurrent_{len(users)}"] = conc
        for name in ("budget", "dockerspawner"):
            say(
                f"{len(users)} at once, {name}: spawn median {conc[name]['spawn_median_s']:.2f} s, "
                f"stop median {conc[name]['stop_median_s']:.2f} s "
                f"({args.concurrent_rounds} rounds)"
            )
        ratio = conc["budget"]["spawn_median_s"] / conc["dockerspawner"]["spawn_median_s"]
        say(
            f"{len(users)} at once: budgethub / DockerSpawner {ratio:.2f} (bar <= 1.00); "
            f"budgethub's starts, median: queued {conc['budget']['queued_median_s']:.2f} s, "
            f"turn to boot {conc['budget']['turn_median_s']:.2f} s, "
            f"boot {conc['budget']['boot_median_s']:.2f} s"
        )
        grants = grant_latencies(budget)
        results["grant_latency_ms"] = {
            "n": len(grants),
            "median": median(grants),
            "max": max(grants) if grants else float("nan"),
        }
        g = results["grant_latency_ms"]
        say(
            f"grant latency (submit -> admission, free capacity): median {g['median']:.1f} ms, "
            f"max {g['max']:.1f} ms over {g['n']} grants (bar <= 100 ms)"
        )
        idle = api_round_trips(budget, 5)
        results["hub_api_idle_ms"] = {"p50": p(idle, 0.5) * 1e3, "p99": p(idle, 0.99) * 1e3}
        say(
            f"Hub API round trip, idle: p50 {results['hub_api_idle_ms']['p50']:.1f} ms, "
            f"p99 {results['hub_api_idle_ms']['p99']:.1f} ms"
        )
        stock.stop()
        if args.load_seconds > 0:
            load = queued_load(budget, args.load_seconds)
            results["hub_api_500_queued"] = load
            say(
                f"Hub API round trip with {load['queued']:.0f} queued requests of 150 users: "
                f"p50 {load['api_p50_ms']:.1f} ms, p99 {load['api_p99_ms']:.1f} ms, "
                f"max {load['api_max_ms']:.1f} ms (500 submitted in {load['submit_500_s']:.1f} s)"
            )
        else:
            say("queued load skipped (--load-seconds 0)")
    finally:
        budget.stop()
        stock.stop()
        remove_containers("bench-budget")
        client = docker.from_env()
        for container in client.containers.list(all=True, filters={"name": "bench-ds-"}):
            container.remove(force=True)
    return results


def figures(results: dict[str, Any]) -> dict[str, float]:
    """``main``'s results as the figures of bench/bars.toml (FIGURES); the queued-load
    figure only where that part ran."""
    budget = results["sequential_median_s"]["budget"]
    [concurrent] = [v for k, v in results.items() if k.startswith("concurrent_")]
    out = {
        "spawn.dockerspawner_s": results["sequential_median_s"]["dockerspawner"],
        "spawn.budget_s": budget,
        "spawn.bare_container_s": results["bare_container_median_s"],
        "spawn.budget_over_bare_s": budget,
        "spawn.dockerspawner_concurrent_s": concurrent["dockerspawner"]["spawn_median_s"],
        "spawn.budget_concurrent_s": concurrent["budget"]["spawn_median_s"],
        "spawn.budget_stop_concurrent_s": concurrent["budget"]["stop_median_s"],
        "spawn.grant_max_ms": results["grant_latency_ms"]["max"],
        "spawn.hub_api_idle_p99_ms": results["hub_api_idle_ms"]["p99"],
    }
    if "hub_api_500_queued" in results:
        out["spawn.hub_api_queued_p99_ms"] = results["hub_api_500_queued"]["api_p99_ms"]
    return {k: float(v) for k, v in out.items()}


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Run as ``main`` does, printing the same; the figures (FIGURES)."""
    return figures(main(argv))


if __name__ == "__main__":
    main()
