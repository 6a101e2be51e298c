"""What other jobs hold, read from Slurm and counted as taken (spawner.runtime.slurmheld,
spawner.runtime.foreign, spawner.readmodel.elsewhere), without a cluster: the Slurm tests
run the same code against a real one."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime

import pytest

from harness import builders
from scheduler_core.model import Pool, PoolKind, Request, SliceKind, Team
from scheduler_core.ranking import PoolRanking
from scheduler_core.simulator import VirtualClock
from scheduler_core.store import Store
from scheduler_core.verdict import HELD_ELSEWHERE, NO_ROOM, NO_VICTIMS
from spawner.readmodel.elsewhere import OTHER_JOBS
from spawner.readmodel.status import QueueView
from spawner.runtime.foreign import FOREIGN_USER, SLURM_USAGE, ForeignHolds, is_foreign
from spawner.runtime.slurm import comment, node_gpus, parse_gres
from spawner.runtime.slurmheld import (
    Held,
    JobDetails,
    NodeUse,
    expand_ids,
    gres_indices,
    held_by_others,
    hostnames,
    parse_jobs,
    reserved_nodes,
)

HEAD = (
    "JobId={id} JobName=wrap UserId={user}(1001) GroupId=users(100) MCS_label=N/A Priority=1 "
    "Nice=0 Account={account} QOS=normal JobState={state} Reason=None Dependency=(null) "
    "AllocNode:Sid=bhctl:77 ReqNodeList={nodes} NodeList={nodes} NumNodes=1 NumCPUs=2 "
    "TRES=cpu=2,mem=64M,node=1,billing=2,gres/gpu=1 JOB_GRES=gpu:g1:1 "
)
TAIL = " MinCPUsNode=1 Features=(null) Command=(null) WorkDir=/root Comment={comment} StdOut=/x"


def line(job: int, state: str = "RUNNING", detail: str = "", **fields: str) -> str:
    values = {"user": "alice", "account": "physics", "nodes": "bhs2", "comment": "(null)"}
    values.update(fields)
    return HEAD.format(id=job, state=state, **values) + detail + TAIL.format(**values)


OURS = comment(
    {
        "org.budgethub.hub": "hub",
        "org.budgethub.profile": "GPU notebook",
        "org.budgethub.request": "ann//1",
    }
)


def test_a_jobs_detail_names_what_it_holds_per_node():
    text = "\n".join(
        [
            line(11, detail="Nodes=bhs2 CPU_IDs=0-1 Mem=64 GRES=gpu:g1:1(IDX:1)"),
            line(12, detail="Nodes=bhs1 CPU_IDs=2 Mem=1024 GRES=gpu:g0:1(IDX:0)", comment=OURS),
            line(13, state="PENDING"),
            line(
                14,
                user="bob",
                account="",
                detail="Nodes=bhs[1-2] CPU_IDs=3 Mem=10 GRES= Nodes=bhs3 CPU_IDs=0,2 Mem=5 "
                "GRES=gpu:h100:2(IDX:0-1)",
            ),
            "No jobs in the system",
        ]
    )
    jobs = {j.id: j for j in parse_jobs(text)}
    assert set(jobs) == {"11", "12", "13", "14"}
    assert jobs["11"].user == "alice" and jobs["11"].account == "physics"
    assert [(u.node, u.cpus, u.memory_mib, u.gpus) for u in jobs["11"].uses] == [
        ("bhs2", 2, 64, (1,))
    ]
    assert jobs["12"].labels["org.budgethub.profile"] == "GPU notebook"  # a space, escaped
    assert [u.node for u in jobs["14"].uses] == ["bhs1", "bhs2", "bhs3"]
    held = held_by_others(jobs.values(), "hub")
    charges = tuple((job, account) for job, account, _ in held["bhs2"].charges)
    assert charges == (("11", "physics"), ("14", ""))  # each job's account, to charge
    assert replace(held["bhs2"], charges=()) == Held(
        3, 74, frozenset({1}), ("11 (alice, account physics)", "14 (bob)")
    )
    own = (("ann//1", NodeUse("bhs1", 1, 1024, (0,))),)  # job 12 is the Hub's
    assert replace(held["bhs1"], charges=()) == Held(1, 10, frozenset(), ("14 (bob)",), own=own)
    assert held["bhs3"].gpus == {0, 1}
    assert "13" not in str(held)  # pending: holds nothing yet


def test_slurm_lists():
    assert expand_ids("0-2,5") == [0, 1, 2, 5] and expand_ids("N/A") == []
    assert hostnames("bhs[1-2,07],gpu-01") == ["bhs1", "bhs2", "bhs07", "gpu-01"]
    assert gres_indices("gpu:g1:1(IDX:1),gpu:h100:2(IDX:2-3),shard:h100:2(1/2,1/2)") == [1, 2, 3]
    assert gres_indices("gpu:h100:0(IDX:N/A)") == []


def test_one_scontrol_a_round_whatever_asks():
    calls = []

    def run(*args: str) -> str:
        calls.append(args)
        return line(11, detail="Nodes=bhs2 CPU_IDs=0 Mem=64 GRES=gpu:g1:1(IDX:1)")

    details = JobDetails(run, "hub", ttl=60)
    for _ in range(5):
        assert details.held()["bhs2"].gpus == {1}
    round_calls = [
        ("scontrol", "-d", "-o", "show", "job"),
        ("scontrol", "-o", "show", "reservation"),
    ]
    assert calls == round_calls
    now = time.monotonic()  # a new round: read again, once
    for _ in range(5):
        assert details.held(now)["bhs2"].gpus == {1}
    assert calls == round_calls * 2


@dataclass
class Reader:
    """A node's runtime as ForeignHolds reads it."""

    held: Held | None = None

    def held_elsewhere(self, newer_than: float = 0.0) -> Held | None:
        return self.held


def cluster():
    pools = builders.pools()
    nodes = [builders.node(n, pool="gpu", gpus=2, cpus=8, memory_gib=32) for n in ("a", "b")]
    core = builders.scheduler(pools=pools.values(), nodes=nodes, teams=builders.teams("t"))
    readers = {"a": Reader(), "b": Reader()}
    kicks: list[int] = []
    holds = ForeignHolds(core, readers, lambda: kicks.append(1), logging.getLogger("t"))
    return core, readers, holds, kicks


def ask(core, rid: str, gpus: int = 1) -> None:
    core.submit(Request(rid, "ann", "t", "gpu", 0.0, gpus=gpus, cpus=1, memory_gib=1))


def gpus_of(core, rid: str) -> tuple[str, list[int]]:
    grant = core.running[rid].grants[0]
    index = {g.uuid: g.index for g in core.nodes[grant.node].gpus}
    return grant.node, sorted(index[s.gpu_uuid] for s in grant.slices)


def test_other_jobs_gpus_are_taken_and_freed_when_they_end():
    core, readers, holds, kicks = cluster()
    readers["a"].held = Held(2, 2048, frozenset({0}), ("7 (bob)",))
    readers["b"].held = Held(1, 1024, frozenset({0, 1}), ("8 (bob)",))
    assert holds.apply(holds.read(), 0.0) and kicks == [1]
    assert FOREIGN_USER == OTHER_JOBS and all(is_foreign(r) for r in core.running)
    builders.check_free_matches_allocations(core)
    ask(core, "ann//1")
    core.step()
    assert gpus_of(core, "ann//1") == ("a", [1])  # never GPU 0 of a, nor b's
    assert not holds.apply(holds.read(), 1.0)  # nothing changed: no cycle kicked
    ask(core, "ann/two/2", gpus=2)
    core.step()
    assert "ann/two/2" in core.pending
    status = QueueView(core, clock=core.clock.now).queue_status("ann/two/2")
    assert status is not None and status.reason == HELD_ELSEWHERE, status
    readers["b"].held = None  # job 8 ended
    assert holds.apply(holds.read(), 2.0)
    core.step()
    assert gpus_of(core, "ann/two/2") == ("b", [0, 1])
    builders.check_no_double_booking(core)


def test_a_request_that_would_not_fit_anyway_keeps_its_own_reason():
    core, readers, holds, _ = cluster()
    readers["a"].held = Held(2, 0, frozenset(), ("7 (bob)",))  # CPUs only
    holds.apply(holds.read(), 0.0)
    for rid in ("ann//1", "ann/b/2", "ann/c/3"):
        ask(core, rid, gpus=2)
    core.step()  # two of them hold every GPU; the third would not fit without job 7 either
    [waiting] = list(core.pending)
    status = QueueView(core, clock=core.clock.now).queue_status(waiting)
    assert status is not None and status.reason in (NO_ROOM, NO_VICTIMS), status


def test_a_gpu_this_hub_holds_is_not_counted_twice():
    core, readers, holds, _ = cluster()
    ask(core, "ann//1", gpus=2)
    core.step()
    node, _ = gpus_of(core, "ann//1")
    readers[node].held = Held(1, 512, frozenset({0}), ("9 (bob)",))  # Slurm's conflict
    holds.apply(holds.read(), 1.0)
    stand_in = holds.current[node]
    assert stand_in.grants[0].slices == () and stand_in.grants[0].cpus == 1
    builders.check_no_double_booking(core)


def test_a_stand_in_on_a_node_that_goes_down_is_let_go():
    from scheduler_core.model import Health

    core, readers, holds, _ = cluster()
    readers["a"].held = Held(1, 0, frozenset({0}), ("7 (bob)",))
    holds.apply(holds.read(), 0.0)
    core.set_health("a", Health.DOWN)
    core.step()  # the core stops what ran there: the stand-in too
    assert not any(is_foreign(r) for r in core.running)
    holds.apply(holds.read(), 1.0)  # and it is not made again while the node is down
    assert not any(is_foreign(r) for r in core.running)


def test_a_session_slurm_still_ends_holds_its_gpu_after_the_hub_let_it_go():
    core, readers, holds, _ = cluster()
    ask(core, "ann//1")
    core.step()
    node, [index] = gpus_of(core, "ann//1")
    use = NodeUse(node, 1, 1024, (index,))
    readers[node].held = Held(own=(("ann//1", use),))
    assert not holds.apply(holds.read(), 1.0)  # booked: its own, not counted again
    core.finish("ann//1")  # the stop gave up waiting; Slurm still runs the epilog
    assert holds.apply(holds.read(), 2.0)
    assert "ann//1 (ending)" in holds.current[node].request.labels["org.budgethub.jobs"]
    ask(core, "bo//2", gpus=2)
    core.step()
    assert "bo//2" in core.pending or gpus_of(core, "bo//2")[0] != node
    readers[node].held = Held()  # Slurm says it ended
    holds.apply(holds.read(), 3.0)
    assert node not in holds.current


def test_a_session_holds_the_gpus_slurm_bound_in_the_core_and_the_store():
    core, readers, holds, _ = cluster()
    pools = builders.pools()
    with builders.store(
        pools=pools.values(), teams=core.teams.teams.values(), nodes=core.nodes.values()
    ) as store:
        holds.store = store
        ask(core, "ann//1")
        ask(core, "bo//2")
        core.step()
        for rid in ("ann//1", "bo//2"):
            store.book(core.running[rid])
        node, [index] = gpus_of(core, "ann//1")
        assert gpus_of(core, "bo//2")[0] == node  # best fit: both on one node
        other = gpus_of(core, "bo//2")[1][0]
        charged = core.ledger.charged("t", "gpu", -1, 1e9)
        # Slurm, asked for gpu:h100:1 twice, bound them the other way round: a swap.
        readers[node].held = Held(
            own=(
                ("ann//1", NodeUse(node, 1, 1024, (other,))),
                ("bo//2", NodeUse(node, 1, 1024, (index,))),
            )
        )
        holds.apply(holds.read(), 1.0)
        assert gpus_of(core, "ann//1") == (node, [other])
        assert gpus_of(core, "bo//2") == (node, [index])
        stored = {a.id: a.grants[0].slices for a in store.active_allocations()}
        assert stored["ann//1"] == core.running["ann//1"].grants[0].slices
        assert core.ledger.charged("t", "gpu", -1, 1e9) == charged  # not charged twice
        builders.check_no_double_booking(core)
        builders.check_free_matches_allocations(core)


def test_a_reservation_within_a_sessions_time_limit_takes_its_node():
    now = datetime(2026, 12, 6, 22, 0).timestamp()
    text = "\n".join(
        [
            "ReservationName=maint StartTime=2026-12-06T22:30:00 EndTime=2026-12-06T23:30:00 "
            "Duration=01:00:00 Nodes=bhs1 NodeCnt=1 Flags=MAINT State=INACTIVE",
            "ReservationName=later StartTime=2026-12-20T00:00:00 EndTime=2026-12-21T00:00:00 "
            "Duration=1-00:00:00 Nodes=bhs[2-3] NodeCnt=2 State=INACTIVE",
            "ReservationName=over StartTime=2026-12-06T10:00:00 EndTime=2026-12-06T11:00:00 "
            "Nodes=bhs4 State=INACTIVE",
        ]
    )
    day = 86400.0
    assert reserved_nodes(text, now, day) == {"bhs1": "reservation maint from 2026-12-06T22:30:00"}
    assert set(reserved_nodes(text, now, None)) == {"bhs1", "bhs2", "bhs3"}
    assert reserved_nodes("No reservations in the system", now, day) == {}
    core, readers, holds, _ = cluster()
    readers["a"].held = Held(reserved="reservation maint from 2026-12-06T22:30:00")
    holds.apply(holds.read(), 0.0)
    ask(core, "ann//1")
    core.step()
    assert gpus_of(core, "ann//1")[0] == "b"  # a is reserved: all of it is taken


def test_shards_name_their_gpu_and_a_fraction_follows_slurms_pick():
    [job] = parse_jobs(line(21, detail="Nodes=bhs2 CPU_IDs=0 Mem=64 GRES=shard:fake:25(IDX:1)"))
    assert job.uses[0].shards == (1,) and job.uses[0].gpus == ()
    assert held_by_others([job], "hub")["bhs2"].gpus == {1}  # another's shards: taken
    core, readers, holds, _ = cluster()
    core.submit(Request("ann//1", "ann", "t", "gpu", 0.0, gpu_milli=250, cpus=1, memory_gib=1))
    core.step()
    grant = core.running["ann//1"].grants[0]
    index = {g.uuid: g.index for g in core.nodes[grant.node].gpus}
    booked = index[grant.slices[0].gpu_uuid]
    other = 1 - booked
    readers[grant.node].held = Held(own=(("ann//1", NodeUse(grant.node, 1, 1024, (), (other,))),))
    holds.apply(holds.read(), 1.0)
    [piece] = core.running["ann//1"].grants[0].slices
    assert index[piece.gpu_uuid] == other and piece.milli == 250
    builders.check_free_matches_allocations(core)


@dataclass
class Charging(Reader):
    """A Slurm node's runtime: what other jobs hold, and whose team an account is."""

    def team_of(self, account: str) -> str:
        return {"physics-lab": "physics"}.get(account, account)


def test_other_jobs_use_is_charged_to_their_team_and_the_ranking_sees_it(tmp_path):
    pools = builders.pools()
    nodes = [builders.node(n, pool="gpu", gpus=2, cpus=8, memory_gib=32) for n in ("a", "b")]
    clock = VirtualClock(1000.0)
    core = builders.scheduler(
        pools=pools.values(), nodes=nodes, teams=builders.teams("physics", "nlp"), clock=clock
    )
    store = Store.create(builders.sqlite_file_url(tmp_path))
    readers = {"a": Charging(), "b": Charging()}
    holds = ForeignHolds(core, readers, lambda: None, logging.getLogger("t"), store=store)
    use = NodeUse("a", 2, 1024, (0, 1))
    readers["a"].held = Held(
        2, 1024, frozenset({0, 1}), ("7 (bob)",), charges=(("7", "physics-lab", use),)
    )
    readers["b"].held = Held(
        1, 64, frozenset(), ("9 (eve)",), charges=(("9", "nobody", NodeUse("b", 1, 64, ())),)
    )
    holds.apply(holds.read(), 1000.0)
    clock.time = 1100.0
    assert core.ledger.charged("physics", "gpu", 0.0, 1100.0) == 200.0  # 2 GPUs, 100 s, live
    ranking = PoolRanking(core.view(1100.0), "gpu", 1100.0)
    assert ranking.ratio("physics") > ranking.ratio("nlp")  # the policy ranks by it
    core.submit(Request("pa//1", "pat", "physics", "gpu", 1050.0, gpus=1, cpus=1, memory_gib=1))
    core.submit(Request("na//1", "nat", "nlp", "gpu", 1060.0, gpus=1, cpus=1, memory_gib=1))
    readers["b"].held = Held(2, 64, frozenset({0, 1}), ("8 (eve)",))  # one GPU left: on b
    holds.apply(holds.read(), 1100.0)
    readers["b"].held = Held(2, 64, frozenset({0}), ("8 (eve)",))
    holds.apply(holds.read(), 1100.0)
    core.step()
    assert "na//1" in core.running and "pa//1" in core.pending  # nlp used less: it goes first
    readers["a"].held = None  # job 7 ended
    clock.time = 1130.0
    holds.apply(holds.read(), 1130.0)
    assert core.ledger.charged("physics", "gpu", 0.0, 2000.0) == 260.0  # stopped at 1130
    assert store.usage_between("physics", "gpu", 0.0, 2000.0) == 260.0
    assert store.usage_between("nobody", "gpu", 0.0, 2000.0) == 0.0  # no team's account
    [event] = store.list_events(kind=SLURM_USAGE)
    assert event.payload == {
        "team": "physics",
        "pool": "gpu",
        "start": 1000.0,
        "end": 1130.0,
        "units": 260.0,
        "jobs": ["7"],
    }


def test_a_long_job_is_written_to_the_store_a_stretch_at_a_time(tmp_path):
    pools = builders.pools()
    nodes = [builders.node("a", pool="gpu", gpus=2, cpus=8, memory_gib=32)]
    core = builders.scheduler(pools=pools.values(), nodes=nodes, teams=builders.teams("physics"))
    store = Store.create(builders.sqlite_file_url(tmp_path))
    readers = {"a": Charging()}
    holds = ForeignHolds(core, readers, lambda: None, logging.getLogger("t"), store=store)
    use = NodeUse("a", 1, 64, (1,))
    readers["a"].held = Held(1, 64, frozenset({1}), ("7 (bob)",), charges=(("7", "physics", use),))
    for now in (0.0, 100.0, 299.0, 301.0, 400.0):
        holds.apply(holds.read(), now)
    assert store.usage_records(-1.0) == [("physics", "gpu", 0.0, 301.0, 301.0)]
    assert core.ledger.charged("physics", "gpu", 0.0, 400.0) == 400.0  # still charged live


def test_the_budget_lines_show_batch_work_seen_in_slurm(tmp_path):
    pools = builders.pools()
    nodes = [builders.node("a", pool="gpu", gpus=2, cpus=8, memory_gib=32)]
    clock = VirtualClock(0.0)
    core = builders.scheduler(
        pools=pools.values(), nodes=nodes, teams=builders.teams("physics"), clock=clock
    )
    store = Store.create(builders.sqlite_file_url(tmp_path))
    readers = {"a": Charging()}
    holds = ForeignHolds(core, readers, lambda: None, logging.getLogger("t"), store=store)
    use = NodeUse("a", 1, 64, (0, 1))
    readers["a"].held = Held(
        1, 64, frozenset({0, 1}), ("7 (bob)",), charges=(("7", "physics", use),)
    )
    holds.apply(holds.read(), 0.0)
    readers["a"].held = None
    holds.apply(holds.read(), 5400.0)  # 2 GPUs for 1.5 h
    status = QueueView(core, store, clock=lambda: 6000.0).team_status("physics", "gpu")
    assert status.slurm_units == 10800.0
    assert "(3 GPU·h of it batch work seen in Slurm)" in status.line(), status.line()
    later = core.settings.lookback + 2700.0  # half of the stretch left the window
    status = QueueView(core, store, clock=lambda: later).team_status("physics", "gpu")
    assert status.slurm_units == 5400.0


def test_prime_takes_other_jobs_in_before_the_first_cycle():
    core, readers, holds, _ = cluster()
    readers["a"].held = Held(2, 2048, frozenset({0, 1}), ("7 (bob)",))
    holds.prime()  # what a Hub's start does before it kicks its first cycle
    ask(core, "ann//1")
    core.step()
    assert gpus_of(core, "ann//1")[0] == "b"


def test_two_pools_over_one_slurm_node_each_see_the_others_sessions():
    pools = [Pool("gpu", PoolKind.GPU), Pool("long", PoolKind.GPU)]
    nodes = [  # Slurm's node a, in both pools' partitions: the second names it a@long
        builders.node("a", pool="gpu", gpus=2, cpus=8, memory_gib=32),
        builders.node("a@long", pool="long", gpus=2, cpus=8, memory_gib=32),
    ]
    core = builders.scheduler(
        pools=pools, nodes=nodes, teams=[Team("t", {"gpu": 1.0, "long": 1.0})]
    )
    readers = {"a": Charging(), "a@long": Charging()}
    holds = ForeignHolds(core, readers, lambda: None, logging.getLogger("t"))
    core.submit(Request("ann//1", "ann", "t", "gpu", 0.0, gpus=1, cpus=1, memory_gib=1))
    core.step()
    _, [index] = gpus_of(core, "ann//1")
    job = Held(own=(("ann//1", NodeUse("a", 1, 1024, (index,))),))  # both read Slurm's a
    readers["a"].held = readers["a@long"].held = job
    assert holds.apply(holds.read(), 1.0)
    assert "a" not in holds.current  # its own session, in its own pool
    assert "ann//1 (another pool)" in holds.current["a@long"].request.labels["org.budgethub.jobs"]
    core.submit(Request("bo//2", "bo", "t", "long", 0.0, gpus=1, cpus=1, memory_gib=1))
    core.step()
    assert gpus_of(core, "bo//2") == ("a@long", [1 - index])  # never ann's GPU
    core.submit(Request("cy//3", "cy", "t", "long", 0.0, gpus=1, cpus=1, memory_gib=1))
    core.step()
    assert "cy//3" in core.pending  # the other GPU is ann's, through the other pool


def test_other_jobs_mig_instances_are_taken_and_a_session_follows_slurms_instance():
    gres = parse_gres("gpu:fake:1,gpu:1g.10gb:2")
    gpus, _ = node_gpus("a", gres, gres)
    node = builders.node("a", pool="gpu", gpus=0, cpus=8, memory_gib=32)
    node = replace(node, gpus=tuple(gpus))
    core = builders.scheduler(
        pools=builders.pools().values(), nodes=[node], teams=builders.teams("t")
    )
    readers = {"a": Charging()}
    holds = ForeignHolds(core, readers, lambda: None, logging.getLogger("t"))
    use = NodeUse("a", 1, 64, (1,))  # another job holds the 1g.10gb instance of IDX 1
    readers["a"].held = Held(1, 64, frozenset({1}), ("7 (bob)",), charges=(("7", "t", use),))
    holds.apply(holds.read(), 0.0)
    [taken] = holds.current["a"].grants[0].slices
    assert (taken.kind, taken.mig_uuid) == (SliceKind.MIG, "slurm:a:1")
    core.submit(Request("ann//1", "ann", "t", "gpu", 0.0, mig="1g.10gb", cpus=1, memory_gib=1))
    core.step()
    [mine] = core.running["ann//1"].grants[0].slices
    assert mine.mig_uuid == "slurm:a:2"  # the one left
    core.submit(Request("bo//2", "bo", "t", "gpu", 0.0, mig="1g.10gb", cpus=1, memory_gib=1))
    core.step()
    assert "bo//2" in core.pending
    assert holds.usage.open[("t", "gpu")][0] == pytest.approx(1 / 7)  # charged its share
    readers["a"].held = None  # job 7 ended
    holds.apply(holds.read(), 1.0)
    readers["a"].held = Held(own=(("ann//1", NodeUse("a", 1, 64, (1,))),))
    holds.apply(holds.read(), 2.0)  # Slurm says ann's job has the instance of IDX 1
    [mine] = core.running["ann//1"].grants[0].slices
    assert mine.mig_uuid == "slurm:a:1"  # the core books the instance Slurm bound
    builders.check_no_double_booking(core)
