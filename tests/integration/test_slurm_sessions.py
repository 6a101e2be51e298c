"""Sessions as Slurm jobs, through the real Hub, on a real two-node Slurm cluster.

bhs1 has one fake GPU, bhs2 two, each a GRES type of its own (``gpu:g0``, ``gpu:g1``).
The scheduler chooses the node and GPUs; Slurm's own view of each job (``scontrol show
-d job``) and the session itself (its hostname, ``CUDA_VISIBLE_DEVICES``) must agree
with that choice. A funded request preempts an unallocated session, whose kernel
variables come back on the other node; a node drained in Slurm takes no new session; a
Hub killed with SIGKILL keeps its jobs, duplicates none, frees the slices of a job that
ended meanwhile and reports a job it did not start.
"""

from __future__ import annotations

import time

from slurm_fixtures import (
    TWO,
    active_jobs,
    foreign_job,
    granted,
    gres_indices,
    job_of,
    owner,
    snapshots,
    start,
)

from harness.hub import hub_kill, wait_for
from harness.kernels import Server

WHERE = "(__import__('socket').gethostname(), __import__('os').environ['CUDA_VISIBLE_DEVICES'])"


def where(hub, user: str) -> tuple[str, str]:
    server = Server(hub, user)
    server.put_notebook("where.ipynb")
    kernel = server.open("where.ipynb")
    try:
        host, visible = kernel.value(WHERE)
    finally:
        kernel.close()
    return host, visible


def test_sessions_run_as_jobs_on_the_node_and_gpus_the_scheduler_chose(slurm_hub, slurm):
    hub = slurm_hub()
    start(hub, "ann")  # best fit: the one-GPU node
    start(hub, "cy", TWO)  # two GPUs: only bhs2 has them
    chosen = granted(hub)
    assert chosen["ann"] == ("bhs1", [0]) and chosen["cy"] == ("bhs2", [0, 1]), chosen
    for user in ("ann", "cy"):
        node, gpus = chosen[user]
        job = job_of(slurm, user)
        assert job["node"] == node
        detail = slurm.job_detail(job["id"])
        assert gres_indices(detail) == gpus, detail
        assert f"ReqNodeList={node}" in detail  # pinned with --nodelist
        assert "NumCPUs=1" in detail and "TimeLimit=7-00:00:00" in detail, detail
        assert "mem=1G" in detail, detail
        assert f"{user}//" in job["comment"]  # the request id travels with the job
        host, visible = where(hub, user)
        assert host == node
        assert visible == ",".join(str(g) for g in gpus)
    hub.stop_server("ann")
    wait_for(lambda: len(active_jobs(slurm)) == 1, 30, "ann's job to end in Slurm")
    assert "ann" not in granted(hub)


def test_a_funded_request_preempts_an_unallocated_session_restored_on_the_other_node(
    slurm_hub, slurm
):
    hub = slurm_hub()
    start(hub, "gus")  # guests have no share: unallocated, on bhs1 (best fit)
    start(hub, "cy", TWO)  # cy's funded session holds bhs2
    assert granted(hub)["gus"][0] == "bhs1"
    gus_job = job_of(slurm, "gus")["id"]
    server = Server(hub, "gus")
    server.put_notebook("analysis.ipynb")
    kernel = server.open("analysis.ipynb")
    assert kernel.run("n = 42\nwords = {'kept': [1, 2, 3]}\n").error is None
    kernel.close()

    start(hub, "ann")  # funded: it needs gus's GPU
    assert granted(hub)["ann"] == ("bhs1", [0])
    gus = [j for j in slurm.jobs() if j["id"] == gus_job]
    assert gus and gus[0]["state"] not in ("RUNNING", "COMPLETING"), gus  # ended first
    wait_for(lambda: snapshots(hub, "gus"), 60, "gus's snapshot")
    [snapshot] = snapshots(hub, "gus")
    assert snapshot.node == "bhs1"

    hub.stop_server("cy")  # bhs2 is free: gus restores there
    if hub.server_model("gus") is None:
        start(hub, "gus")
    else:
        hub.wait_ready("gus", timeout=120)
    assert granted(hub)["gus"][0] == "bhs2"
    kernel = Server(hub, "gus").open("analysis.ipynb")
    try:
        first = kernel.run("1")
        assert "budgethub: restored" in first.stdout + str(first.outputs), first
        assert kernel.value("(n, words)") == [42, {"kept": [1, 2, 3]}]
    finally:
        kernel.close()


def test_a_node_drained_in_slurm_takes_no_new_session(slurm_hub, slurm):
    hub = slurm_hub()
    slurm.run("scontrol", "update", "nodename=bhs1", "state=drain", "reason=disk swap")
    wait_for(
        lambda: "budgethub: node bhs1 is now draining" in hub.log_tail(400),
        30,
        "budgethub to see the drain",
    )
    start(hub, "ann")  # best fit would be bhs1
    assert granted(hub)["ann"][0] == "bhs2"
    assert job_of(slurm, "ann")["node"] == "bhs2"
    slurm.run("scontrol", "update", "nodename=bhs1", "state=resume")
    wait_for(lambda: "budgethub: node bhs1 is now ready" in hub.log_tail(400), 30, "resume")
    slurm.run("scontrol", "update", "nodename=bhs1", "state=down", "reason=psu")
    wait_for(lambda: "budgethub: node bhs1 is now down" in hub.log_tail(400), 30, "down")
    slurm.run("scontrol", "update", "nodename=bhs1", "state=resume")
    wait_for(lambda: hub.log_tail(400).count("node bhs1 is now ready") == 2, 30, "back")


def test_a_job_cancelled_in_slurm_frees_its_slices_and_its_user_is_told(slurm_hub, slurm):
    hub = slurm_hub()
    start(hub, "ann")
    slurm.run("scancel", job_of(slurm, "ann")["id"])  # an operator's scancel
    wait_for(lambda: "ann" not in granted(hub), 30, "ann's slices to be free")
    hub.wait_stopped("ann")
    with hub.login("ann") as web:
        page = web.get(f"{hub.url}/hub/spawn", timeout=30).text
    assert "Your session ended at" in page, page[-2000:]


def test_a_hub_killed_and_restarted_keeps_its_jobs_and_duplicates_none(slurm_hub, slurm):
    hub = slurm_hub()
    start(hub, "ann")
    start(hub, "bo")
    before = {j["id"]: j for j in active_jobs(slurm)}
    assert len(before) == 2
    bo_job = job_of(slurm, "bo")["id"]

    hub_kill(hub)
    slurm.run("scancel", bo_job)  # ends while no Hub watches
    foreign = foreign_job(slurm, "bhs2", user="root", seconds=300, run=False)
    wait_for(lambda: bo_job not in {j["id"] for j in active_jobs(slurm)}, 30, "bo's job to end")
    hub.start()

    hub.wait_ready("ann")
    assert hub.through_proxy("ann").status_code == 200
    after = {j["id"] for j in active_jobs(slurm) if j["id"] != foreign}
    assert after == set(before) - {bo_job}  # ann's job kept, nothing submitted again
    wait_for(lambda: "bo" not in granted(hub), 30, "bo's slices to be free")
    log = hub.log_tail(2000)
    assert f"a job budgethub did not start: job {foreign}" in log, log[-3000:]
    start(hub, "cy")
    assert len([j for j in active_jobs(slurm) if j["id"] != foreign]) == 2
    assert len([j for j in active_jobs(slurm) if owner(j) == "ann"]) == 1
    slurm.run("scancel", foreign)
    time.sleep(0.1)
