"""Shared set-up for the Slurm tests (tests/integration/test_slurm_*.py).

A real two-node Slurm cluster (harness/slurm.py: slurmctld, two slurmd in network
namespaces of their own, munge, fake GPUs as GRES), one per test file, and a Hub whose
``gpu`` pool is its partition. Sessions run from the session environment that
``images/session-env`` makes, as the session user (uid 1000), so their homes and
snapshots live under a directory that user can reach (pytest's own tmp is 0700).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import REPO
from harness.hub import Hub, scheduler_lines, wait_for
from harness.nodes import FUNDED_AND_GUESTS, notebook_profile
from harness.slurm import SlurmCluster, SlurmNode, slurm_possible
from scheduler_core.store import SnapshotRecord, Store

SESSION_ENV = Path(os.environ.get("BUDGETHUB_SESSION_ENV", "/var/cache/budgethub/session-env"))
PROFILES = [notebook_profile("budgethub/base:latest", memory_gib=1)]
ONE = {"profile": "notebook", "gpus": 1}
TWO = {"profile": "notebook", "gpus": 2}
TEAMS = FUNDED_AND_GUESTS
GROUPS = {"nlp": ["ann", "cy"], "guests": ["gus", "bo"]}


def session_env() -> Path:
    """The session environment, made once (``images/session-env``; cached)."""
    subprocess.run(
        [str(REPO / "images" / "session-env"), str(SESSION_ENV)], check=True, timeout=900
    )
    return SESSION_ENV


ACCOUNTS = {user: f"bh{user}" for members in GROUPS.values() for user in members}
"""Each researcher's own Unix account (``c.BudgetScheduler.slurm_users``)."""
HUB_ACCOUNT = "bhhub"
"""A Unix account that is not root, for a Hub that submits through sudo."""


def session_user() -> None:
    """Slurm runs a job as a user it can look up: uid 1000 must exist (any name), and
    each researcher has an account of their own."""
    if subprocess.run(["getent", "passwd", "1000"], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "-u", "1000", "-g", "100", "-M", "-s", "/usr/sbin/nologin", "bhsession"],
            check=True,
        )
    for account in (*ACCOUNTS.values(), HUB_ACCOUNT):
        if subprocess.run(["getent", "passwd", account], capture_output=True).returncode:
            subprocess.run(
                ["useradd", "-M", "-N", "-g", "100", "-s", "/bin/sh", account], check=True
            )


def cluster_up(nodes: list[SlurmNode] | None = None, **options: Any) -> Iterator[SlurmCluster]:
    """A two-node cluster (bhs1: one GPU, bhs2: two; or ``nodes``) for a test module;
    ``options`` are `SlurmCluster`'s (``gpu_model``, ``shards``, ``extra`` slurm.conf
    lines)."""
    why = slurm_possible()
    if why:
        pytest.fail(f"the Slurm tests need a Slurm cluster here: {why}")
    session_user()
    session_env()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    root = Path(f"/var/tmp/budgethub-slurm-{worker}")
    shutil.rmtree(root, ignore_errors=True)
    nodes = nodes or [SlurmNode("bhs1", gpus=1), SlurmNode("bhs2", gpus=2)]
    cluster = SlurmCluster(root, nodes, **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """One GRES type per GPU (``gpu:g0:1,gpu:g1:1``); a module may define its own."""
    yield from cluster_up()


@pytest.fixture
def slurm_hub(
    make_hub: Callable[..., Hub], slurm: SlurmCluster, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Hub]]:
    """``slurm_hub(**traits)``: a Hub whose gpu pool is the cluster's partition. After the
    test every job is cancelled and every node is back (slurmd running, not drained)."""
    shared = Path(f"{slurm.root}-shared") / request.node.name[:40]
    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir(parents=True)
    for path in (shared, shared.parent):
        os.chmod(path, 0o755)

    def make(
        extra: str = "",
        profiles: list[dict[str, Any]] | None = None,
        teams: list[dict[str, Any]] | None = None,
        pools: list[dict[str, str]] | None = None,
        **traits: Any,
    ) -> Hub:
        settings: dict[str, Any] = {
            "slurm_partitions": {"gpu": "gpu"},
            "slurm_users": ACCOUNTS,
            "slurm_conf": str(slurm.conf),
            "slurm_session_env": str(SESSION_ENV),
            "slurm_pending_timeout": 10.0,
            "home_root": str(shared / "homes"),
            "snapshot_root": str(shared / "snapshots"),
            "snapshot_grace": 15.0,
            "unallocated_grace": 1.0,
            "idle_poll": 0.0,
        }
        settings.update(traits)
        lines = scheduler_lines(settings)
        lines += f"c.JupyterHub.hub_ip = {slurm.controller!r}\n"
        hub = make_hub(
            nodes=[],
            teams=teams or TEAMS,
            **({"pools": pools} if pools else {}),
            groups=GROUPS,
            profiles=profiles or PROFILES,
            extra=lines + extra,
        )
        hubs.append(hub)
        return hub

    hubs: list[Hub] = []
    try:
        yield make
    finally:
        # A Hub still running would submit again what the cancel ends (its request is
        # still granted): stop them first (their sessions keep running until cancelled).
        for hub in hubs:
            hub.stop()
        for partition in (slurm.partition, *slurm.more_partitions):
            slurm.run("scancel", "--partition", partition, check=False)
        for node in slurm.nodes:
            if node.slurmd is None:
                slurm.start_slurmd(node)
        wait_for(lambda: not active_jobs(slurm), 60, "the tests' jobs to end")
        # Only what a test changed is put back, once its jobs are gone.
        for node in slurm.nodes:
            if slurm.node_state(node.name) not in ("idle", "mixed", "allocated", "completing"):
                slurm.run(
                    "scontrol", "update", f"nodename={node.name}", "state=resume", check=False
                )
        if "MaxTime=UNLIMITED" not in slurm.run("scontrol", "show", "partition", slurm.partition):
            slurm.run("scontrol", "update", f"partitionname={slurm.partition}", "maxtime=infinite")
        slurm.wait_idle()


def foreign_job(
    slurm: SlurmCluster,
    node: str,
    gres: str = "",
    *,
    account: str = "",
    partition: str = "",
    seconds: int = 600,
    user: str = "",
    run: bool = True,
) -> str:
    """A batch job budgethub did not submit, on ``node`` (``gres``: ``gpu:g0:1``), as uid
    1000 or ``user``'s (``--uid``), under ``account``; its id, once it runs if ``run``."""
    options = [f"--uid={user}"] if user else ["--uid=1000", "--gid=100"]
    options += [f"--gres={gres}"] if gres else []
    options += [f"--account={account}"] if account else []
    job = slurm.run(
        "sbatch",
        "--parsable",
        *options,
        "-p",
        partition or slurm.partition,
        "-w",
        node,
        "--mem=64M",
        "-c",
        "1",
        "-o",
        "/dev/null",
        "--chdir=/tmp",
        "--wrap",
        f"sleep {seconds}",
    ).strip()
    if run:
        wait_for(
            lambda: any(j["id"] == job and j["state"] == "RUNNING" for j in slurm.jobs()),
            30,
            f"batch job {job} to run",
        )
    return job


def active_jobs(slurm: SlurmCluster) -> list[dict[str, str]]:
    return [j for j in slurm.jobs() if j["state"] in ("PENDING", "RUNNING", "COMPLETING")]


def owner(job: dict[str, str]) -> str:
    """The user whose session a job is (from the labels in its comment)."""
    try:
        return str(json.loads(job["comment"]).get("org.budgethub.user", ""))
    except ValueError:
        return ""


def job_of(slurm: SlurmCluster, user: str) -> dict[str, str]:
    """The one running job of a user's session."""
    found = [j for j in slurm.jobs() if j["state"] == "RUNNING" and owner(j) == user]
    assert len(found) == 1, slurm.jobs()
    return found[0]


def gres_indices(detail: str) -> list[int]:
    """The GPU indices ``scontrol show -d job`` says a job holds: ``GRES=gpu:g1:1(IDX:1)``."""
    indices: list[int] = []
    for part in detail.split("IDX:")[1:]:
        text = part.split(")", 1)[0]
        for piece in text.split(","):
            low, _, high = piece.partition("-")
            indices.extend(range(int(low), int(high or low) + 1))
    return indices


def store_of(hub: Hub) -> Store:
    return Store.create(f"sqlite:///{hub.directory}/budgethub.sqlite")


def waiting(hub: Hub) -> set[str]:
    """The users whose requests wait in the Hub's store."""
    store = store_of(hub)
    try:
        return {r.user for r in store.pending_requests()}
    finally:
        store.engine.dispose()


def snapshots(hub: Hub, user: str, server: str = "") -> list[SnapshotRecord]:
    store = store_of(hub)
    try:
        return store.list_snapshots(user=user, server=server)
    finally:
        store.engine.dispose()


def granted(hub: Hub) -> dict[str, tuple[str, list[int]]]:
    """Per user, the node and GPU indices the scheduler booked (its store)."""
    store = store_of(hub)
    try:
        found = {}
        for allocation in store.active_allocations():
            grant = allocation.grants[0]
            found[allocation.request.user] = (
                grant.node,
                sorted(int(s.gpu_uuid.rsplit(":", 1)[-1]) for s in grant.slices),
            )
        return found
    finally:
        store.engine.dispose()


def start(hub: Hub, user: str, options: dict[str, Any] | None = None) -> None:
    response = hub.spawn(user, options or ONE)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user, timeout=120)
    time.sleep(1.2)  # past the unallocated grace (1 s), for the preemption tests
