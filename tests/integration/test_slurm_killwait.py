"""A preempted session's GPU is never held by two running jobs at once, on a real
two-node cluster whose jobs end slowly (issue 48): ``KillWait=30`` and an epilog that
sleeps 5 s, so a cancelled job stays COMPLETING a while after its processes are gone.
The preemptor's job may only start once Slurm says the victim's has ended."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_fixtures import cluster_up, granted, job_of, start

from harness.slurm import SlurmCluster

EPILOG = Path("/var/tmp/budgethub-slurm-epilog.sh")


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    EPILOG.write_text("#!/bin/sh\nsleep 5\n")
    EPILOG.chmod(0o755)
    yield from cluster_up(extra=("KillWait=30", f"Epilog={EPILOG}"))


def test_the_preemptors_job_starts_only_once_the_victims_has_ended(slurm_hub, slurm):
    hub = slurm_hub(engine_timeout=60.0)  # a stop may wait for KillWait and the epilog
    start(hub, "gus")  # unallocated, on bhs1 (best fit)
    start(hub, "cy", {"profile": "notebook", "gpus": 2})  # bhs2
    victim = job_of(slurm, "gus")
    assert victim["node"] == "bhs1"
    seen: list[tuple[float, dict[str, str]]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            now = time.monotonic()
            for job in slurm.jobs():
                if job["node"] == "bhs1" and job["state"] in ("RUNNING", "COMPLETING"):
                    seen.append((now, job))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        start(hub, "ann")  # funded: it takes gus's GPU
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert granted(hub)["ann"] == ("bhs1", [0])
    ann = job_of(slurm, "ann")["id"]
    moments: dict[float, set[str]] = {}
    for at, job in seen:
        moments.setdefault(at, set()).add(job["id"])
    both = [at for at, jobs in moments.items() if {victim["id"], ann} <= jobs]
    assert not both, seen
    completing = [job for _, job in seen if job["id"] == victim["id"]]
    assert any(j["state"] == "COMPLETING" for j in completing), completing  # the epilog ran
