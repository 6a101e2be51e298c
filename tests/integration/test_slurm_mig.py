"""MIG instances as Slurm declares them, through the real Hub, on a real two-node cluster
(issue 48): bhs1's gres.conf names one whole GPU and three MIG instances (``Name=gpu
Type=1g.10gb``, twice, and ``Type=2g.20gb``), as AutoDetect=nvml declares a GPU in MIG
mode; each instance is a character device the harness makes (no MIG GPU exists here),
and the real slurmd and slurmctld hand them out.

budgethub reads them as MIG slices, a session asks Slurm for its profile by type
(``--gres=gpu:1g.10gb:1``), and the instance it books is the one Slurm bound (IDX); an
instance another job holds is taken.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_fixtures import (
    PROFILES,
    cluster_up,
    foreign_job,
    gres_indices,
    job_of,
    store_of,
    waiting,
)

from harness.hub import wait_for
from harness.slurm import SlurmCluster, SlurmNode

MIG = {
    "slug": "mig",
    "display_name": "MIG notebook",
    "class": "interactive",
    "pool": "gpu",
    "image": "budgethub/base:latest",
    "slices": [{"mig": "1g.10gb"}],
    "cpus": 1,
    "memory_gib": 1,
}
ONE_MIG = {"profile": "mig", "slices": "mig-1g.10gb"}


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    nodes = [
        SlurmNode("bhs1", gpus=1, mig=("1g.10gb", "1g.10gb", "2g.20gb")),
        SlurmNode("bhs2", gpus=2),
    ]
    yield from cluster_up(nodes, gpu_model="fake")


def instances(hub) -> dict[str, list[str]]:
    """Per user, the Slurm indices of the MIG instances the store books for them."""
    store = store_of(hub)
    try:
        return {
            a.request.user: [
                s.device_id.rsplit(":", 1)[-1] for g in a.grants for s in g.slices if s.mig_uuid
            ]
            for a in store.active_allocations()
        }
    finally:
        store.engine.dispose()


def test_slurms_mig_instances_are_budgethubs_mig_slices(slurm_hub, slurm):
    node = slurm.run("scontrol", "-o", "show", "node", "bhs1")
    assert "Gres=gpu:fake:1,gpu:1g.10gb:2,gpu:2g.20gb:1" in node, node
    hub = slurm_hub(profiles=[*PROFILES, MIG])
    store = store_of(hub)
    try:
        [bhs1] = [n for n in store.load_nodes() if n.name == "bhs1"]
    finally:
        store.engine.dispose()
    profiles = sorted(m.profile for g in bhs1.gpus for m in g.mig)
    assert profiles == ["1g.10gb", "1g.10gb", "2g.20gb"], bhs1.gpus
    assert len(bhs1.whole_gpus) == 1

    other = foreign_job(slurm, "bhs1", "gpu:1g.10gb:1")  # another job takes one instance
    [held] = gres_indices(slurm.job_detail(other))
    wait_for(
        lambda: f"node bhs1: other jobs hold GPUs {held}" in hub.log_tail(400),
        30,
        "budgethub to count the other job's MIG instance",
    )
    response = hub.spawn("ann", ONE_MIG)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("ann", timeout=120)
    job = slurm.job_detail(job_of(slurm, "ann")["id"])
    assert "gpu:1g.10gb:1" in job, job
    [bound] = gres_indices(job)
    assert bound != held
    wait_for(lambda: instances(hub).get("ann") == [str(bound)], 10, "ann's instance as Slurm's")

    response = hub.spawn("cy", ONE_MIG)  # no 1g.10gb instance is free: cy waits
    assert response.status_code == 202, response.text
    wait_for(lambda: "cy" in waiting(hub), 30, "cy's request in the queue")
    slurm.run("scancel", other)
    wait_for(lambda: "cy" in instances(hub), 30, "cy's grant once the other job ended")
    hub.wait_ready("cy", timeout=120)
    assert instances(hub)["cy"] == [str(held)]
    log = hub.log_tail(3000)
    assert "Slurm kept job" not in log and "launch failed" not in log, log[-3000:]
