"""Slurm's commands per poll round do not grow with the sessions: 500 sessions on 128
nodes through the real runtime (spawner.runtime.slurm), with fake ``squeue``,
``scontrol``, ``sbatch`` and ``scancel`` that log each call (Slurm cannot run 128
nodes here; tests/integration/test_slurm_*.py run the same code on a real cluster)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from scheduler_core.model import Pool, PoolKind
from spawner.runtime.slurm import RECONCILE, SlurmSettings, parse_partitions, read_cluster

NODES = [f"n{i:03d}" for i in range(1, 129)]
SESSIONS = 500
FAKE = r"""#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
name = os.path.basename(sys.argv[0])
with open(os.path.join(here, "calls.log"), "a") as log:
    log.write(json.dumps([name, *sys.argv[1:]]) + "\n")
data = json.load(open(os.path.join(here, "cluster.json")))
args = sys.argv[1:]
if name == "squeue":
    print("\n".join(data["squeue"]))
elif name == "scontrol" and "partition" in args:
    print("PartitionName=gpu Nodes=n[001-128] PreemptMode=OFF MaxTime=UNLIMITED State=UP")
elif name == "scontrol" and "hostnames" in args:
    print("\n".join(data["nodes"]))
elif name == "scontrol" and "config" in args:
    print("SlurmdPort = %d" % data["port"])
elif name == "scontrol" and args[-1] == "node":
    print("\n".join(data["scontrol_nodes"]))
elif name == "scontrol" and args[-1] == "job":
    print("\n".join(data["scontrol_jobs"]))
elif name == "scontrol" and args[-1] == "reservation":
    print("No reservations in the system")
elif name == "scancel":
    pass
else:
    sys.exit("fake slurm: no answer for %s %s" % (name, args))
"""


def labels(job: int, node: str) -> str:
    return json.dumps(
        {
            "org.budgethub.hub": "hub",
            "org.budgethub.node": node,
            "org.budgethub.request": f"u{job}//{job}",
        },
        separators=(",", ":"),
    )


@pytest.fixture
def fake_slurm(tmp_path: Path):
    """A bin folder of fake Slurm commands over a 128-node partition with 500 of this
    Hub's jobs (40 of them ended) and one job of another user per 16 nodes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)  # slurmd's port: the health check opens a connection
    port = listener.getsockname()[1]
    squeue, jobs = [], []
    for job in range(1, SESSIONS + 1):
        node = NODES[job % len(NODES)]
        state = "COMPLETED" if job <= 40 else "RUNNING"
        squeue.append(f"{job}|{state}|None|{node}|{node}|{labels(job, node)}")
        jobs.append(
            f"JobId={job} UserId=hubuser(1000) Account=nlp JobState={state} Partition=gpu "
            f"ExitCode={'0:0' if state == 'COMPLETED' else '0:0'} NodeList={node} "
            f"Nodes={node} CPU_IDs=0 Mem=1024 GRES=gpu:g0:1(IDX:0) "
            f"Comment={labels(job, node)}"
        )
    for i, node in enumerate(NODES[::16]):
        job = 9000 + i
        squeue.append(f"{job}|RUNNING|None|{node}|{node}|(null)")
        jobs.append(
            f"JobId={job} UserId=bob(1001) Account=physics JobState=RUNNING Partition=gpu "
            f"NodeList={node} Nodes={node} CPU_IDs=1-2 Mem=2048 GRES=gpu:g1:1(IDX:1) "
            "Comment=(null)"
        )
    nodes = [
        f"NodeName={n} NodeAddr=127.0.0.1 CPUTot=16 RealMemory=65536 State=MIXED "
        f"Gres=gpu:g0:1,gpu:g1:1 Partitions=gpu"
        for n in NODES
    ]
    data = {
        "squeue": squeue,
        "scontrol_jobs": jobs,
        "scontrol_nodes": nodes,
        "nodes": NODES,
        "port": port,
    }
    (tmp_path / "cluster.json").write_text(json.dumps(data))
    for name in ("squeue", "scontrol", "sbatch", "scancel"):
        script = tmp_path / name
        script.write_text(FAKE.replace("{python}", sys.executable))
        script.chmod(0o755)
    yield tmp_path
    listener.close()


def calls(folder: Path) -> Counter[str]:
    log = folder / "calls.log"
    found: Counter[str] = Counter()
    for line in log.read_text().splitlines() if log.exists() else []:
        argv = json.loads(line)
        found[" ".join(a for a in argv if not a.startswith("%"))] += 1
    log.unlink(missing_ok=True)
    return found


def test_500_sessions_on_128_nodes_cost_a_fixed_number_of_calls(fake_slurm: Path):
    # A round here is all of the calls below: a 30 s round, so that a slow machine's
    # round still reads the details once (each is read for a round, watch_interval).
    settings = SlurmSettings(bin_dir=str(fake_slurm), timeout=30, watch_interval=30)
    pools = {"gpu": Pool("gpu", PoolKind.GPU)}
    cluster = read_cluster(parse_partitions({"gpu": "gpu"}, pools), pools, settings, "hub")
    assert len(cluster.nodes) == 128
    reading = calls(fake_slurm)
    assert sum(reading.values()) == 4, reading  # partition, hostnames, config, nodes
    runtimes = list(cluster.runtimes.values())

    async def reconcile() -> tuple[int, int, int]:
        """As a Hub's restart does (recovery.py), node after node."""
        running = ended = foreign = 0
        for runtime in cluster.runtimes.values():
            await runtime.ping()
            for session in await runtime.sessions("hub"):
                if session.running:
                    running += 1
                else:
                    ended += 1
                    await runtime.remove(session.id)
            foreign += len(await runtime.foreign_jobs())
        return running, ended, foreign

    partition = cluster.runtimes["n001"].partition
    assert all(r.partition is partition for r in runtimes)
    partition._nodes = (-1e9, {})  # as after a while: node states are read again
    started = time.monotonic()
    assert asyncio.run(reconcile()) == (460, 40, 8)
    took = time.monotonic() - started
    restart = calls(fake_slurm)
    # Node states are read for one second (the health check's pings share them), the
    # listing for RECONCILE seconds: a machine slowed by other work may read them again
    # once each of those has passed, never once per node.
    assert restart.pop("scontrol -o show node") <= 1 + int(took), (restart, took)
    assert restart.pop("squeue -h -t all -p gpu -o") <= 1 + int(took / RECONCILE), took
    assert not restart, restart

    async def poll_round() -> tuple[list[bool], float]:
        """The Hub polls every session at once, and reads what other jobs hold."""
        ids = [str(job) for job in range(1, SESSIONS + 1)]
        polled = time.monotonic()
        states = await asyncio.gather(*(runtimes[int(j) % len(runtimes)].state(j) for j in ids))
        started = time.monotonic()  # a new round, as ForeignHolds.read starts one
        held = await asyncio.gather(
            *(asyncio.to_thread(r.held_elsewhere, started) for r in runtimes)
        )
        assert sum(len(h.gpus) for h in held) == 8  # bob's GPU on every 16th node
        return [s is not None and s.running for s in states], started - polled

    for _ in range(2):
        partition._jobs = (-1e9, [])  # the last round's listing is old
        running, took = asyncio.run(poll_round())
        assert running.count(True) == 460
        one_round = calls(fake_slurm)
        # The holdings' read starts a round of its own (ForeignHolds), the ended jobs'
        # exit codes share whichever read is fresh: at most two, however many sessions.
        reads = one_round.pop("scontrol -d -o show job")
        assert reads in (1, 2), one_round
        assert one_round.pop("scontrol -o show reservation") == reads, one_round
        # The listing is read for one second: again only if the polls took longer.
        assert one_round.pop("squeue -h -t all -p gpu -o") <= 1 + int(took), (one_round, took)
        assert not one_round, one_round
