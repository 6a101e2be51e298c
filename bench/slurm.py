"""Slurm benchmarks: a session as a Slurm job against the same session in a container.

Two real Hubs side by side: one whose gpu pool is a real two-node Slurm cluster
(harness/slurm.py: slurmctld, two slurmd in network namespaces, munge, fake GPUs), one on
the local Docker engine. The same profile (one GPU, one CPU, 1 GiB) starts the same
session software: the session image under Docker, the session environment made from it
(``images/session-env``) under Slurm. Spawns alternate between the two Hubs. Measured:

* spawn latency, REST POST until the server answers (the grant takes milliseconds of
  it: the rest is submission, Slurm's start and the server's boot), median per runtime;
* preemption decision to slices free on Slurm: a funded request stops an unallocated
  session; the Hub logs when Slurm says its job ended (checkpoint through the agent,
  ``scancel``, the job's end), median over the rounds.

Run: ``python -m bench.slurm [--rounds N]`` as root (namespaces, slurmd), after
``make setup`` (the images, Slurm's packages, the session environment).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from harness.hub import Hub, scheduler_lines, start_hub, wait_for
from harness.nodes import FUNDED_AND_GUESTS, local_gpu_node, notebook_profile
from harness.slurm import SlurmCluster, SlurmNode

SESSION_ENV = Path(os.environ.get("BUDGETHUB_SESSION_ENV", "/var/cache/budgethub/session-env"))
"""The session environment (``images/session-env``), as the Slurm tests take it."""
WORK = Path("/var/tmp/budgethub-bench-slurm")
PROFILES = [notebook_profile("budgethub/base:latest", memory_gib=1, gpus=[1])]
TEAMS = FUNDED_AND_GUESTS
GROUPS = {"nlp": ["ann", "cy"], "guests": ["gus"]}
ONE = {"profile": "notebook", "gpus": 1}
FIGURES = ("slurm.docker_spawn_s", "slurm.spawn_s", "slurm.preempt_free_s")
FREED = re.compile(r"budgethub: (\S+) preempted \(funded\): slices free ([0-9.]+) s")
COMMON = {
    "unallocated_grace": 1.0,
    "idle_poll": 0.0,
    "snapshot_grace": 15.0,
}


def start_hubs(cluster: SlurmCluster) -> tuple[Hub, Hub]:
    shared = WORK / "shared"
    shared.mkdir(parents=True, mode=0o755)
    slurm = {
        **COMMON,
        "slurm_partitions": {"gpu": "gpu"},
        "slurm_users": "",  # every job as the session user, as the Docker sessions run
        "slurm_conf": str(cluster.conf),
        "slurm_session_env": str(SESSION_ENV),
        "home_root": str(shared / "homes"),
        "snapshot_root": str(shared / "snapshots"),
    }
    docker = {
        **COMMON,
        "home_root": str(WORK / "docker" / "homes"),
        "snapshot_root": str(WORK / "docker" / "snapshots"),
    }
    hubs: list[Hub] = []
    for name, nodes, settings, extra in (
        ("bench-slurm", [], slurm, f"c.JupyterHub.hub_ip = {cluster.controller!r}\n"),
        ("bench-docker", [local_gpu_node(gpus=1)], docker, ""),
    ):
        directory = WORK / name
        directory.mkdir(parents=True)
        try:
            hub = start_hub(
                directory,
                hub_name=name,
                nodes=nodes,
                teams=TEAMS,
                groups=GROUPS,
                profiles=PROFILES,
                extra=scheduler_lines(settings) + extra,
            )
        except Exception:
            for started in hubs:  # a Hub left running would outlive the run
                started.stop()
            raise
        hubs.append(hub)
    return hubs[0], hubs[1]


def spawn(hub: Hub, user: str) -> float:
    """REST POST until the server answers, seconds."""
    began = time.monotonic()
    response = hub.spawn(user, ONE)
    if response.status_code == 202:
        hub.wait_ready(user, timeout=120)
    elif response.status_code != 201:
        raise RuntimeError(f"{hub.hub_name}: spawn {response.status_code}: {response.text}")
    return time.monotonic() - began


def preempt(hub: Hub) -> float:
    """gus runs unallocated; ann's funded request stops him: seconds from the decision
    to his slices free, as the Hub logs it once Slurm says his job ended."""
    spawn(hub, "gus")
    time.sleep(1.2)  # past the unallocated grace
    seen = len(FREED.findall(hub.log_path.read_text(errors="replace")))
    spawn(hub, "ann")
    found: list[tuple[str, str]] = []

    def logged() -> bool:
        found[:] = FREED.findall(hub.log_path.read_text(errors="replace"))
        return len(found) > seen

    wait_for(logged, 60, "the preemption's log line")
    hub.stop_server("ann")
    hub.wait_stopped("ann")
    for user in ("gus",):  # resumable or not, it must not come back between rounds
        if hub.server_model(user) is not None:
            hub.stop_server(user)
    return float(found[-1][1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.slurm")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: must be at least 1")
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    WORK.chmod(0o755)
    cluster = SlurmCluster(WORK / "cluster", [SlurmNode("bhs1", gpus=1), SlurmNode("bhs2", 1)])
    cluster.start()
    results: dict[str, Any] = {"docker": [], "slurm": [], "freed": []}
    try:
        slurm, docker = start_hubs(cluster)
        try:
            for _ in range(args.rounds):
                for hub, key in ((docker, "docker"), (slurm, "slurm")):
                    results[key].append(spawn(hub, "ann"))
                    hub.stop_server("ann")
                    hub.wait_stopped("ann")
            print(
                f"spawn, POST until ready, median of {args.rounds}: Docker "
                f"{statistics.median(results['docker']):.2f} s, Slurm "
                f"{statistics.median(results['slurm']):.2f} s"
            )
            spawn(slurm, "cy")  # holds one node: gus and ann contend for the other
            for _ in range(args.rounds):
                results["freed"].append(preempt(slurm))
            print(
                "preemption decision -> slices free on Slurm, median of "
                f"{args.rounds}: {statistics.median(results['freed']):.2f} s"
            )
        finally:
            slurm.stop()
            docker.stop()
    finally:
        cluster.run("scancel", "--partition", cluster.partition, check=False)
        cluster.stop()
    return results


def figures(results: dict[str, Any]) -> dict[str, float]:
    found = {}
    if results.get("docker"):
        found["slurm.docker_spawn_s"] = statistics.median(results["docker"])
    if results.get("slurm"):
        found["slurm.spawn_s"] = statistics.median(results["slurm"])
    if results.get("freed"):
        found["slurm.preempt_free_s"] = statistics.median(results["freed"])
    return found


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Run as ``main`` does, printing the same; the figures (FIGURES)."""
    return figures(main(argv))


if __name__ == "__main__":
    main()
