"""Faults on a real Slurm cluster, through the real Hub: a slurmd killed, a job Slurm will
not run, and a configuration naming what Slurm does not have."""

from __future__ import annotations

import subprocess

import pytest
from slurm_fixtures import (
    ONE,
    SESSION_ENV,
    active_jobs,
    granted,
    job_of,
    start,
    store_of,
)

from harness import REPO
from harness.hub import wait_for
from spawner.hub.config import ConfigError, SchedulerConfig


def test_a_killed_slurmd_takes_its_node_down_frees_its_slices_and_tells_the_user(slurm_hub, slurm):
    hub = slurm_hub(node_down_grace=4.0)
    start(hub, "gus")  # best fit: bhs1
    assert granted(hub)["gus"][0] == "bhs1"
    job_of(slurm, "gus")
    slurm.kill_slurmd(slurm.nodes[0])

    wait_for(lambda: "gus" not in granted(hub), 60, "gus's slices to be freed")
    log = hub.log_tail(3000)
    assert "budgethub: node bhs1 is now unreachable" in log
    assert "budgethub: node bhs1 is now down" in log
    store = store_of(hub)
    try:
        [event] = [e for e in store.list_events() if e.kind == "preempt"]
    finally:
        store.engine.dispose()
    assert event.payload["reason"] == "node-down"
    assert "its node stopped answering" in event.payload["message"]
    hub.wait_stopped("gus")
    with hub.login("gus") as web:  # the user is told, on the next page
        page = web.get(f"{hub.url}/hub/spawn", timeout=30).text
    assert "its node stopped answering" in page
    start(hub, "ann")  # bhs1 is down: bhs2 takes the next session
    assert granted(hub)["ann"][0] == "bhs2"


def test_a_job_slurm_will_not_run_waits_again_then_the_user_is_told_why(slurm_hub, slurm):
    # The partition's time limit drops below the session's after the Hub read it: Slurm
    # keeps the job pending.
    hub = slurm_hub(slurm_pending_timeout=3.0, extra="c.BudgetScheduler.launch_attempts = 2\n")
    hub.spawn("bo", ONE)  # the scheduler has started and read the partition
    hub.wait_ready("bo", timeout=120)
    slurm.run("scontrol", "update", "partitionname=gpu", "maxtime=1")
    response = hub.spawn("ann", ONE)
    if response.status_code == 202:
        wait_for(lambda: hub.server_model("ann") is None, 90, "ann's spawn to end")
        message = hub.log_tail(800)
    else:
        message = response.json()["message"]
    assert "did not start (attempt 2 of 2): on node bhs" in message, message
    # Slurm's own reason, as it gives it: PartitionTimeLimit, or PartitionConfig when it
    # weighs the job against the just-updated partition first (seen in one full run).
    assert "Slurm kept job" in message, message
    assert "(PartitionTimeLimit)" in message or "(PartitionConfig)" in message, message
    log = hub.log_tail(2000)
    assert "launch failed, queued again" in log
    assert not [j for j in active_jobs(slurm) if j["state"] == "PENDING"]  # cancelled
    assert "ann" not in granted(hub)


def config(slurm, **traits) -> SchedulerConfig:
    values = {
        "slurm_partitions": {"gpu": "gpu"},
        "slurm_conf": str(slurm.conf),
        "slurm_session_env": str(SESSION_ENV),
        "home_root": "/var/tmp/budgethub-homes",
        "nodes": [],
    }
    values.update(traits)
    return SchedulerConfig(**values)


@pytest.mark.parametrize(
    ("traits", "key", "words"),
    [
        ({"slurm_partitions": {"gpu": "nope"}}, "slurm_partitions.gpu.partition", "no partition"),
        (
            {"slurm_partitions": {"gpu": {"partition": "gpu", "gres": "tpu"}}},
            "slurm_partitions.gpu.gres",
            "has GRES 'tpu'",
        ),
        (
            {"slurm_partitions": {"gpu": {"partition": "gpu", "nodes": ["bhs1", "bhs9"]}}},
            "slurm_partitions.gpu.nodes[1]",
            "no node 'bhs9'",
        ),
        ({"slurm_partitions": {"tpu": "gpu"}}, "slurm_partitions.tpu", "unknown pool"),
        ({"home_root": ""}, "home_root", "must be set"),
    ],
)
def test_a_configuration_naming_what_slurm_lacks_is_an_error_naming_the_field(
    slurm, traits, key, words
):
    with pytest.raises(ConfigError) as error:
        config(slurm, **traits).cluster()
    assert f"c.BudgetScheduler.{key}:" in str(error.value)
    assert words in str(error.value)


def test_the_nodes_gpus_and_addresses_come_from_slurm(slurm):
    cluster = config(slurm).cluster()
    nodes = {n.name: n for n in cluster.nodes}
    assert set(nodes) == {"bhs1", "bhs2"}
    assert [len(nodes[n].gpus) for n in ("bhs1", "bhs2")] == [1, 2]
    assert nodes["bhs2"].cpus == 4 and nodes["bhs2"].memory_gib == 8
    assert {n: cluster.runtimes[n].config.address for n in nodes} == {
        n.name: n.address for n in slurm.nodes
    }


def test_a_hub_on_a_partition_slurm_lacks_refuses_spawns_naming_the_field(slurm_hub):
    # Safe mode, as for a store that cannot open: it keeps trying (Slurm may come back).
    hub = slurm_hub(slurm_partitions={"gpu": "missing"})
    response = hub.spawn("ann", ONE)
    assert response.status_code >= 400
    message = response.json()["message"]
    assert "c.BudgetScheduler.slurm_partitions.gpu.partition" in message, message
    assert "Slurm has no partition 'missing'" in message, message
    assert "cannot start" in hub.log_tail(400)
    done = subprocess.run([str(REPO / "images" / "session-env"), str(SESSION_ENV)], check=False)
    assert done.returncode == 0  # made once: a second run does nothing and succeeds


def test_sessions_get_the_partitions_maxtime_and_one_below_protection_is_refused(slurm_hub, slurm):
    slurm.run("scontrol", "update", "partitionname=gpu", "maxtime=9:00:00")
    hub = slurm_hub()  # slurm_time_limit is 7 days; MaxTime 9 h: the session gets 9 h
    start(hub, "ann")
    detail = slurm.job_detail(job_of(slurm, "ann")["id"])
    assert "TimeLimit=09:00:00" in detail, detail
    slurm.run("scontrol", "update", "partitionname=gpu", "maxtime=1:00:00")
    with pytest.raises(ConfigError) as error:  # below max_min_runtime (8 h)
        config(slurm).cluster()
    assert "c.BudgetScheduler.slurm_partitions.gpu.partition:" in str(error.value)
    assert "MaxTime=01:00:00, below max_min_runtime" in str(error.value), error.value
