"""Device confinement on a real two-node cluster (issue 48): ``TaskPlugin=task/cgroup``
with ``ConstrainDevices=yes`` on the cgroup v1 devices controller, GPUs in Slurm's
standard form with shards. A session can open only its own GPU's device node: opening
another GPU's is refused by the cgroup (EPERM), while its own passes the cgroup and
reaches the (absent) driver (ENXIO: the GPUs here are character devices with no driver
behind them). A fraction's session, holding shards, can open its GPU too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_fixtures import PROFILES, cluster_up, granted, job_of, start
from test_slurm_gres import DEBUG
from test_slurm_sessions import where

from harness.kernels import Server
from harness.slurm import SlurmCluster

OPEN = """
import errno, os
def try_open(path):
    try:
        os.close(os.open(path, os.O_RDONLY))
        return "opened"
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))
opened = {path: try_open(path) for path in PATHS}
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    yield from cluster_up(
        gpu_model="fake",
        shards=100,
        extra=("TaskPlugin=task/cgroup",),
        cgroup=("CgroupPlugin=cgroup/v1", "ConstrainDevices=yes", "CgroupAutomount=no"),
    )


def test_a_session_opens_only_its_own_gpu(slurm_hub, slurm):
    hub = slurm_hub()
    response = hub.spawn("ann", {"profile": "notebook", "gpus": 1})
    assert response.status_code in (201, 202), hub.log_tail(60)
    hub.wait_ready("ann", timeout=120)  # best fit: bhs1's one GPU
    start(hub, "cy")  # one of bhs2's two
    node, [gpu] = granted(hub)["cy"]
    assert node == "bhs2"
    job_of(slurm, "cy")
    devices = slurm.root / "dev" / node
    paths = [str(devices / f"nvidia{g}") for g in range(2)]
    server = Server(hub, "cy")
    server.put_notebook("devices.ipynb")
    kernel = server.open("devices.ipynb")
    try:
        assert kernel.run(f"PATHS = {paths!r}\n" + OPEN).error is None
        opened = kernel.value("opened")
    finally:
        kernel.close()
    own = str(devices / f"nvidia{gpu}")
    assert opened[own] in ("ENXIO", "ENODEV", "opened"), opened  # past the cgroup
    for path, said in opened.items():
        if path != own:
            assert said == "EPERM", opened
    assert where(hub, "cy")[1] == str(gpu)


def test_a_fractions_session_opens_its_gpu(slurm_hub, slurm):
    hub = slurm_hub(profiles=[*PROFILES, DEBUG])
    start(hub, "ann", {"profile": "debug", "slices": "gpu-250m"})  # bhs1's one GPU
    node, _ = granted(hub)["ann"]
    assert node == "bhs1"
    own = str(slurm.root / "dev" / "bhs1" / "nvidia0")
    server = Server(hub, "ann")
    server.put_notebook("devices.ipynb")
    kernel = server.open("devices.ipynb")
    try:
        assert kernel.run(f"PATHS = {[own]!r}\n" + OPEN).error is None
        opened = kernel.value("opened")
    finally:
        kernel.close()
    assert opened[own] in ("ENXIO", "ENODEV", "opened"), opened
