"""Two budgethub pools whose Slurm partitions share their nodes, through the real Hub,
on a real two-node cluster (issue 48): partition ``gpu`` is pool gpu, partition ``long``
over the same two nodes is pool long, whose nodes budgethub names ``bhs1@long`` and
``bhs2@long``. A GPU a session holds through one pool is taken in the other: a session
never lands on it, at its first attempt.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_fixtures import ONE, PROFILES, cluster_up, granted, job_of, start

from harness.hub import wait_for
from harness.slurm import SlurmCluster

POOLS = [
    {"name": "gpu", "kind": "gpu"},
    {"name": "long", "kind": "gpu"},
    {"name": "cpu", "kind": "cpu"},
]
TEAMS = [
    {"name": "nlp", "share": {"gpu": 1.0, "long": 1.0, "cpu": 1.0}},
    {"name": "guests", "share": {"gpu": 0.0, "long": 0.0, "cpu": 0.0}},
]
LONG = {**PROFILES[0], "slug": "long", "display_name": "Long notebook", "pool": "long"}


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    yield from cluster_up(more_partitions=("long",))


def test_a_gpu_taken_through_one_pool_is_taken_in_the_other(slurm_hub, slurm):
    hub = slurm_hub(
        slurm_partitions={"gpu": "gpu", "long": "long"},
        pools=POOLS,
        teams=TEAMS,
        profiles=[*PROFILES, LONG],
    )
    start(hub, "ann")  # pool gpu, best fit: bhs1's one GPU
    assert granted(hub)["ann"] == ("bhs1", [0])
    wait_for(
        lambda: "node bhs1@long: other jobs hold GPUs 0" in hub.log_tail(400),
        30,
        "pool long to count ann's GPU as taken",
    )
    start(hub, "cy", {"profile": "long", "gpus": 1})  # best fit alone: bhs1@long
    node, [gpu] = granted(hub)["cy"]
    assert node == "bhs2@long", granted(hub)
    job = job_of(slurm, "cy")
    assert (job["node"], slurm.run("squeue", "-h", "-j", job["id"], "-o", "%P").strip()) == (
        "bhs2",
        "long",
    )
    wait_for(
        lambda: f"node bhs2: other jobs hold GPUs {gpu}" in hub.log_tail(400),
        30,
        "pool gpu to count cy's GPU as taken",
    )
    start(hub, "bo", ONE)  # pool gpu: bhs2's other GPU, never cy's
    assert granted(hub)["bo"] == ("bhs2", [1 - gpu]), granted(hub)
    log = hub.log_tail(3000)
    assert "Slurm kept job" not in log and "launch failed" not in log, log[-3000:]
