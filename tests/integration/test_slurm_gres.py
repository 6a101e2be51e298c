"""Slurm's standard GPU declaration, through the real Hub, on a real two-node cluster
(issue 48): every GPU of a node is one GRES type (``gpu:fake:2``, as AutoDetect=nvml
declares them) with ``gres/shard`` units for fractions (100 per GPU).

A whole GPU is asked for by count (``--gres=gpu:fake:1``), so Slurm picks which one:
the GPUs budgethub records for the session must be the ones Slurm bound (``IDX`` in
``scontrol show -d job``), and the ones the session sees (``CUDA_VISIBLE_DEVICES``). A
fraction holds shards of its GPU: Slurm shows them, and another user's job asking for a
whole GPU cannot take that GPU while the fraction runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_fixtures import (
    ONE,
    PROFILES,
    cluster_up,
    foreign_job,
    granted,
    gres_indices,
    job_of,
    start,
)
from test_slurm_sessions import where

from harness.hub import wait_for
from harness.slurm import SlurmCluster

DEBUG = {
    "slug": "debug",
    "display_name": "Debug",
    "class": "debug",
    "pool": "gpu",
    "image": "budgethub/base:latest",
    "slices": [{"gpu_fraction": 0.25}],
    "cpus": 1,
    "memory_gib": 1,
    "min_runtime": "15m",
    "max_min_runtime": "15m",
}


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    yield from cluster_up(gpu_model="fake", shards=100)


def test_the_gpus_recorded_are_those_slurm_bound_and_the_session_sees(slurm_hub, slurm):
    hub = slurm_hub()
    # another user's job takes one of bhs2's GPUs: Slurm picks IDX 0
    other = foreign_job(slurm, "bhs2", "gpu:fake:1", run=False)
    wait_for(lambda: "(IDX:" in slurm.job_detail(other), 30, "the other job to run")
    held = gres_indices(slurm.job_detail(other))
    wait_for(
        lambda: f"node bhs2: other jobs hold GPUs {held[0]}" in hub.log_tail(400),
        30,
        "budgethub to count the other job's GPU",
    )
    start(hub, "ann")  # one GPU free on each node: one session on each
    start(hub, "bo")
    for user in ("ann", "bo"):
        job = job_of(slurm, user)
        detail = slurm.job_detail(job["id"])
        assert "gpu:fake:1" in detail, detail  # asked for by count, not by index
        bound = gres_indices(detail)
        wait_for(lambda: granted(hub)[user][1] == bound, 10, f"{user}'s GPUs as Slurm's")  # noqa: B023
        node, gpus = granted(hub)[user]
        assert job["node"] == node
        host, visible = where(hub, user)
        assert host == node and visible == ",".join(map(str, gpus))
    on_bhs2 = [gpus for node, gpus in granted(hub).values() if node == "bhs2"]
    assert on_bhs2 == [[1 - held[0]]], granted(hub)  # never the other job's GPU
    slurm.run("scancel", other)


def test_a_fraction_holds_shards_and_its_gpu_goes_whole_to_no_one(slurm_hub, slurm):
    hub = slurm_hub(profiles=[*PROFILES, DEBUG])
    start(hub, "ann", {"profile": "debug", "slices": "gpu-250m"})  # bhs1's one GPU
    job = job_of(slurm, "ann")
    assert job["node"] == "bhs1"
    detail = slurm.job_detail(job["id"])
    assert "shard:fake:25" in detail, detail
    assert "shard:fake:25(IDX:0)" in detail, detail  # bhs1's one GPU
    node_detail = slurm.run("scontrol", "show", "-d", "node", "bhs1")
    assert "GresUsed=gpu:fake:0(IDX:N/A),shard:fake:" in node_detail, node_detail
    whole = foreign_job(slurm, "bhs1", "gpu:fake:1", run=False)
    wait_for(
        lambda: "Resources" in slurm.run("squeue", "-h", "-j", whole, "-o", "%r"),
        30,
        "Slurm to keep the whole-GPU job waiting",
    )
    state = slurm.run("squeue", "-h", "-j", whole, "-o", "%T").strip()
    assert state == "PENDING", state
    slurm.run("scancel", whole)
    start(hub, "bo", ONE)  # a whole GPU: bhs2
    assert granted(hub)["bo"][0] == "bhs2"
