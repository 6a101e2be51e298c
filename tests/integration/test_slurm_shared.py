"""budgethub as one tenant of a shared Slurm cluster, through the real Hub, on a real
two-node Slurm cluster: another user's batch jobs hold GPUs, and budgethub counts them
as taken (issue 48).

bhs1 has one fake GPU (``gpu:g0``), bhs2 two. A job that budgethub did not submit holds
bhs1's GPU: a session goes to bhs2 at its first attempt (best fit alone would pick
bhs1). With every GPU held, the next session waits in budgethub's queue, saying that
other jobs hold the GPUs, and starts within a poll round of Slurm's word that the job
ended.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import requests
from slurm_fixtures import (
    ACCOUNTS,
    HUB_ACCOUNT,
    TWO,
    active_jobs,
    foreign_job,
    granted,
    job_of,
    snapshots,
    start,
    store_of,
    waiting,
)

from harness.hub import hub_kill, queue_events, wait_for
from harness.kernels import Server
from harness.slurm import sudoers
from scheduler_core.store.admin import AdminStore
from scheduler_core.verdict import HELD_ELSEWHERE
from spawner.readmodel.service.views import team_pool
from spawner.readmodel.status import verdict_words
from spawner.readmodel.storeview import build_state
from spawner.runtime.foreign import SLURM_USAGE


def batch_job(slurm, node: str, gpu: int) -> str:
    """Another user's batch job holding one GPU of ``node``; its id once it runs."""
    return foreign_job(slurm, node, f"gpu:g{gpu}:1")


def test_other_jobs_gpus_are_taken_and_a_session_waits_for_them_saying_so(slurm_hub, slurm):
    hub = slurm_hub()
    bhs1 = batch_job(slurm, "bhs1", 0)
    wait_for(
        lambda: "node bhs1: other jobs hold GPUs 0" in hub.log_tail(400),
        30,
        "budgethub to count the batch job's GPU as taken",
    )
    start(hub, "ann")  # best fit alone would pick bhs1, whose GPU the batch job holds
    node, gpus = granted(hub)["ann"]
    assert node == "bhs2", granted(hub)
    log = hub.log_tail(2000)
    assert "launch failed" not in log and "Slurm kept job" not in log, log[-3000:]
    free = ({0, 1} - set(gpus)).pop()
    bhs2 = batch_job(slurm, "bhs2", free)  # now every GPU is held
    wait_for(
        lambda: f"node bhs2: other jobs hold GPUs {free}" in hub.log_tail(400),
        30,
        "budgethub to count the second batch job",
    )

    response = hub.spawn("cy", {"profile": "notebook", "gpus": 1})
    assert response.status_code == 202, response.text
    events: list[dict] = []
    stop = threading.Event()
    reader = threading.Thread(target=queue_events, args=(hub, "cy", events, stop), daemon=True)
    reader.start()
    said = verdict_words(HELD_ELSEWHERE)
    wait_for(
        lambda: any(said in str(e.get("message", "")) for e in events),
        30,
        f"cy's queue message to say {said!r}",
    )
    assert "cy" not in granted(hub)
    assert not [j for j in active_jobs(slurm) if "cy//" in j["comment"]]  # nothing submitted

    slurm.run("scancel", bhs1)
    wait_for(lambda: bhs1 not in {j["id"] for j in active_jobs(slurm)}, 60, "job to end")
    ended = time.monotonic()
    wait_for(lambda: "cy" in granted(hub), 30, "cy's grant once the batch job ended")
    waited = time.monotonic() - ended
    stop.set()
    assert granted(hub)["cy"] == ("bhs1", [0])
    assert waited < 5.0, f"cy was granted {waited:.1f} s after the batch job ended"
    hub.wait_ready("cy", timeout=120)
    slurm.run("scancel", bhs2)


def test_a_reservation_within_the_time_limit_sends_sessions_to_the_other_node(slurm_hub, slurm):
    begins = (datetime.now() + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%S")
    slurm.run(
        "scontrol",
        "create",
        "reservation",
        "reservationname=maint",
        f"starttime={begins}",
        "duration=60",
        "nodes=bhs1",
        "users=root",
        "flags=maint",
    )
    try:
        hub = slurm_hub()  # sessions' time limit: 7 days; the reservation starts in 30 min
        wait_for(
            lambda: (
                "node bhs1: other jobs hold GPUs 0" in hub.log_tail(400)
                and "reservation maint" in hub.log_tail(400)
            ),
            30,
            "budgethub to take bhs1 for its reservation",
        )
        start(hub, "ann")  # best fit alone would pick bhs1
        assert granted(hub)["ann"][0] == "bhs2"
        assert "launch failed" not in hub.log_tail(2000)
    finally:
        slurm.run("scontrol", "delete", "reservationname=maint", check=False)


PROBE = """
import os, subprocess
def probe(path):
    try:
        os.listdir(path)
        return "read"
    except PermissionError:
        return "denied"
def script(job):
    done = subprocess.run(
        ["scontrol", "write", "batch_script", job, "-"],
        env={**os.environ, "SLURM_CONF": SLURM_CONF}, capture_output=True, text=True,
    )
    return done.stdout + done.stderr
seen = (os.getuid(), probe(OWN_HOME), probe(OTHER_HOME), script(OWN_JOB), script(OTHER_JOB))
"""


def test_each_researcher_runs_as_their_own_account_and_cannot_read_the_others(slurm_hub, slurm):
    hub = slurm_hub()
    start(hub, "ann")
    start(hub, "cy", TWO)
    jobs = {u: job_of(slurm, u) for u in ("ann", "cy")}
    for user, job in jobs.items():
        listed = slurm.run("squeue", "-h", "-j", job["id"], "-o", "%u|%a").strip()
        assert listed == f"{ACCOUNTS[user]}|nlp", listed  # its user's account, its team's
    own_home = slurm.job_detail(jobs["ann"]["id"]).split("WorkDir=")[1].split()[0]
    other_home = slurm.job_detail(jobs["cy"]["id"]).split("WorkDir=")[1].split()[0]
    server = Server(hub, "ann")
    server.put_notebook("probe.ipynb")
    opened = server.open("probe.ipynb")
    try:
        setup = (
            f"OTHER_JOB = {jobs['cy']['id']!r}\nOWN_JOB = {jobs['ann']['id']!r}\n"
            f"SLURM_CONF = {str(slurm.conf)!r}\n"
            f"OWN_HOME = {own_home!r}\nOTHER_HOME = {other_home!r}\n"
        )
        assert opened.run(setup + PROBE).error is None
        uid, own, other, own_script, other_script = opened.value("seen")
    finally:
        opened.close()
    assert uid == pwd.getpwnam(ACCOUNTS["ann"]).pw_uid
    assert (own, other) == ("read", "denied")
    assert "JUPYTERHUB_API_TOKEN" in own_script, own_script[:300]  # her own, she may read
    assert "JUPYTERHUB_API_TOKEN" not in other_script, other_script[:300]  # cy's: refused
    assert "retrieval failed" in other_script, other_script
    assert os.stat(other_home).st_uid == pwd.getpwnam(ACCOUNTS["cy"]).pw_uid
    assert os.stat(other_home).st_mode & 0o777 == 0o700


def test_a_hub_user_without_an_account_is_refused_saying_so(slurm_hub, slurm):
    hub = slurm_hub(slurm_users={**ACCOUNTS, "bo": "bh-no-such-account"})
    response = hub.spawn("bo", {"profile": "notebook", "gpus": 1})
    if response.status_code == 202:
        wait_for(lambda: hub.server_model("bo") is None, 90, "bo's spawn to end")
        message = hub.log_tail(800)
    else:
        message = response.json()["message"]
    assert "has no Unix account 'bh-no-such-account'" in message, message
    assert "bo" not in granted(hub)


def test_a_batch_job_under_a_teams_account_is_charged_to_that_team(slurm_hub, slurm):
    hub = slurm_hub()
    job = foreign_job(slurm, "bhs2", "gpu:g1:1", account="nlp")  # nlp's Slurm account
    wait_for(
        lambda: "node bhs2: other jobs hold GPUs 1" in hub.log_tail(400),
        30,
        "budgethub to count the batch job's GPU",
    )
    time.sleep(6)
    slurm.run("scancel", job)
    wait_for(
        lambda: "node bhs2: other jobs hold nothing now" in hub.log_tail(400),
        30,
        "budgethub to see the batch job end",
    )
    now = time.time()
    store = store_of(hub)
    try:
        charged = store.usage_between("nlp", "gpu", now - 3600, now)
        assert 5.0 < charged < 14.0, charged  # one GPU for 6 s, give or take a round each end
        assert store.usage_between("guests", "gpu", now - 3600, now) == 0.0
        [event] = store.list_events(kind=SLURM_USAGE)
        assert event.payload["jobs"] == [job] and event.payload["team"] == "nlp", event
        state = build_state(store, AdminStore(store), now)  # as the budget service reads it
        nlp = team_pool(state.teams[("nlp", "gpu")], 2)
        assert nlp["slurm_units"] == pytest.approx(charged, abs=0.01), nlp
        assert nlp["used_units"] == pytest.approx(charged, abs=0.01), nlp
    finally:
        store.engine.dispose()
    with hub.login("ann") as web:  # the Hub's team banner, from the live core's ledger
        page = web.get(f"{hub.url}/hub/home", timeout=30).content.decode()
    banner = page[page.find("<strong>nlp</strong>") :][:400]
    assert "GPU·h of it batch work seen in Slurm" in banner, banner
    made = hub.http.post(f"{hub.api}/users/ann/tokens", json={"note": "usage"}, timeout=10)
    assert made.status_code == 201, made.text
    headers = {"Authorization": f"token {made.json()['token']}"}
    service = f"{hub.url}/services/budget"

    def served() -> float:  # the running budget service's API
        answer = requests.get(f"{service}/api/v1/teams", headers=headers, timeout=30)
        if answer.status_code != 200:
            return 0.0
        [team] = [t for t in answer.json()["teams"] if t["name"] == "nlp"]
        return float(next(p["slurm_units"] for p in team["pools"] if p["pool"] == "gpu"))

    wait_for(lambda: served() == pytest.approx(charged, abs=0.01), 60, "the service's figure")
    page = requests.get(f"{service}/teams", headers=headers, timeout=30).content.decode()
    assert "batch work seen in Slurm" in page, page[-2000:]


def test_a_restarted_hubs_first_cycle_counts_other_jobs(slurm_hub, slurm):
    hub = slurm_hub()
    start(hub, "ann", TWO)  # both of bhs2's GPUs
    job = batch_job(slurm, "bhs1", 0)  # and bhs1's one: every GPU is held
    wait_for(
        lambda: "node bhs1: other jobs hold GPUs 0" in hub.log_tail(400),
        30,
        "budgethub to count the batch job's GPU",
    )
    response = hub.spawn("cy", {"profile": "notebook", "gpus": 1})
    assert response.status_code == 202, response.text
    wait_for(lambda: "cy" in waiting(hub), 30, "cy's request in the queue")
    hub_kill(hub)
    slurm.run("scancel", job_of(slurm, "ann")["id"])  # bhs2 is free while no Hub runs
    wait_for(lambda: len(active_jobs(slurm)) == 1, 60, "ann's job to end")
    hub.start()  # cy waits still; bhs1's GPU is still the batch job's
    wait_for(lambda: "cy" in granted(hub), 60, "cy's grant after the restart")
    assert granted(hub)["cy"][0] == "bhs2", granted(hub)  # best fit alone: bhs1
    log = hub.log_tail(3000)
    assert "Slurm kept job" not in log and "launch failed" not in log, log[-3000:]
    slurm.run("scancel", job)


def test_jobs_are_submitted_and_cancelled_through_sudo_as_each_researcher(slurm_hub, slurm):
    if shutil.which("sudo") is None:
        pytest.fail("this test needs sudo: make packages installs it")
    log = Path(f"{slurm.root}-sudo.log")
    log.unlink(missing_ok=True)
    name = f"budgethub-test-{os.environ.get('PYTEST_XDIST_WORKER', 'gw0')}"
    dropin = sudoers(name, HUB_ACCOUNT, ACCOUNTS.values(), slurm.conf, log)
    try:
        # What a Hub that is not root runs: sudo as the researcher, from the Hub's account.
        hub = slurm_hub(
            slurm_exec_prefix=["runuser", "-u", HUB_ACCOUNT, "--", "sudo", "-n", "-u", "{account}"],
            slurm_bin_dir="/usr/bin",
        )
        start(hub, "ann")
        job = job_of(slurm, "ann")["id"]
        listed = slurm.run("squeue", "-h", "-j", job, "-o", "%u|%a").strip()
        assert listed == f"{ACCOUNTS['ann']}|nlp", listed
        said = " ".join(log.read_text().split())
        assert f"{HUB_ACCOUNT} : " in said and f"USER={ACCOUNTS['ann']} ;" in said, said
        assert f"COMMAND=/usr/bin/env SLURM_CONF={slurm.conf} /usr/bin/sbatch" in said, said
        hub.stop_server("ann")
        wait_for(lambda: job not in {j["id"] for j in active_jobs(slurm)}, 60, "ann's job to end")
        said = " ".join(log.read_text().split())
        assert f"/usr/bin/scancel {job}" in said, said
        other = subprocess.run(  # the drop-in lets the Hub's account do nothing else
            ["runuser", "-u", HUB_ACCOUNT, "--", "sudo", "-n", "-u", ACCOUNTS["ann"], "/bin/true"],
            capture_output=True,
            text=True,
        )
        assert other.returncode != 0, other
    finally:
        dropin.unlink(missing_ok=True)


def test_the_accounts_own_home_and_its_snapshots_are_its_own_from_their_making(slurm_hub, slurm):
    homes = Path(f"{slurm.root}-homes")  # as /home: each account's home below it
    shutil.rmtree(homes, ignore_errors=True)
    homes.mkdir()
    os.chmod(homes, 0o755)
    hub = slurm_hub(slurm_home=f"{homes}/{{account}}")
    start(hub, "gus")  # guests have no share: unallocated, on bhs1
    start(hub, "cy", TWO)  # bhs2
    gus = pwd.getpwnam(ACCOUNTS["gus"])
    home = homes / gus.pw_name
    assert f"WorkDir={home}" in slurm.job_detail(job_of(slurm, "gus")["id"])
    info = os.stat(home)
    assert (info.st_uid, info.st_mode & 0o777) == (gus.pw_uid, 0o700)
    server = Server(hub, "gus")
    server.put_notebook("analysis.ipynb")
    kernel = server.open("analysis.ipynb")
    try:
        asked = "import os\nn = 42\nseen = (os.environ['HOME'], os.getuid())"
        assert kernel.run(asked).error is None
        assert kernel.value("seen") == [str(home), gus.pw_uid]
    finally:
        kernel.close()

    start(hub, "ann")  # funded: it needs gus's GPU, and gus's session is snapshotted
    wait_for(lambda: snapshots(hub, "gus"), 60, "gus's snapshot")
    [snapshot] = snapshots(hub, "gus")
    assert "gus" not in granted(hub)  # no start of gus's since: nothing given away later
    [folder] = [p for p in Path(f"{slurm.root}-shared").rglob(snapshot.key) if p.is_dir()]
    made = [folder, folder.parent, folder.parent.parent]  # the snapshot, its server, gus's
    for top, dirs, files in os.walk(folder):
        made += [Path(top, name) for name in (*dirs, *files)]
    assert any(p.name == "report.json" for p in made) and any("kernels" in p.parts for p in made)
    for path in made:
        info = os.lstat(path)
        mode = info.st_mode & 0o777
        assert info.st_uid == gus.pw_uid, (path, info.st_uid)  # gus's, not uid 1000's
        assert mode & 0o077 == 0, (path, oct(mode))  # its owner and the Hub only
    other = subprocess.run(
        ["runuser", "-u", ACCOUNTS["cy"], "--", "ls", str(folder)], capture_output=True
    )
    assert other.returncode != 0  # another researcher cannot read it
