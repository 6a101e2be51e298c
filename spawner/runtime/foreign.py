"""Capacity that jobs this Hub did not start hold (other users' Slurm jobs), as taken.

Each poll round asks every runtime that can tell (`SlurmRuntime.held_elsewhere`) what
other jobs hold on its node, and keeps, per node, one stand-in allocation in the core
that holds those GPUs (by index), CPUs and memory: the core then never places a session
there, and when the jobs end the stand-in goes and the next cycle uses the room.
Stand-ins, not smaller nodes: the core's nodes keep their GPUs for life (its kept
indexes rest on that), while allocations come and go; a stand-in is unfunded (charges
no one) and protected for good, so no policy picks it as a victim.

The read model says why a request waits behind them (`spawner.readmodel.elsewhere`,
which knows a stand-in by its user, `FOREIGN_USER`: the read model imports no runtime).

What other jobs use is charged to their team (`ForeignUsage`), apart from the stand-ins:
one stand-in per node may hold several teams' jobs, and it stays unfunded so that no
policy weighs it as a session. The charge goes into the core's ledger, which the policy
ranks teams by, and, a stretch at a time, into the store's usage as any session's does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from scheduler_core.model import (
    Allocation,
    Health,
    Node,
    NodeGrant,
    PoolKind,
    Request,
    RequestClass,
    Slice,
    SliceKind,
)
from scheduler_core.scheduler import Scheduler

FOREIGN_USER = "(other jobs)"
"""The user of every stand-in; its request id is ``(other jobs)/NODE/N``."""
PROTECTED = 100 * 365 * 86400.0
"""How long a stand-in is protected: for good (no policy stops other jobs)."""
SLURM_USAGE = "slurm-usage"
"""The event of one stretch of other jobs' use charged to a team (payload: team, pool,
start, end, units, jobs): the budget pages show their sum as batch work seen in Slurm
(`spawner.readmodel.status.SLURM_USAGE`, the same)."""
FLUSH = 300.0
"""Seconds after which a stretch of other jobs' use that goes on is written to the store
(and a new one begun): the budget service sees it at most this late."""


class HeldLike(Protocol):
    @property
    def cpus(self) -> int: ...
    @property
    def memory_mib(self) -> int: ...
    @property
    def gpus(self) -> frozenset[int]: ...
    @property
    def jobs(self) -> tuple[str, ...]: ...
    @property
    def own(self) -> tuple[tuple[str, Any], ...]: ...
    @property
    def reserved(self) -> str: ...
    @property
    def charges(self) -> tuple[tuple[str, str, Any], ...]: ...


def is_foreign(request_id: str) -> bool:
    """Is this running "session" a stand-in for other jobs?"""
    return request_id.startswith(FOREIGN_USER + "/")


def stand_in(
    node: Node,
    held: HeldLike,
    own_gpus: set[str],
    own_cpus: float,
    own_memory_gib: float,
    now: float,
    serial: int,
) -> Allocation | None:
    """The allocation that holds what ``held`` says on ``node``, less what this Hub's own
    sessions hold there (a GPU Slurm gives to both is this Hub's conflict to find, not
    capacity to count twice); None when it holds nothing."""
    by_index = {gpu.index: gpu for gpu in node.whole_gpus}
    migs = mig_slices_of(node.gpus)
    if held.reserved:  # Slurm keeps the node for its reservation: all of it is taken
        held = _Held(
            int(node.cpus),
            int(node.memory_gib * 1024),
            frozenset(by_index) | frozenset(migs),
            (held.reserved,),
        )
    slices = tuple(
        Slice(by_index[i].uuid, SliceKind.WHOLE)
        for i in sorted(held.gpus)
        if i in by_index and by_index[i].uuid not in own_gpus
    ) + tuple(migs[i] for i in sorted(held.gpus) if i in migs and migs[i].device_id not in own_gpus)
    cpus = max(0.0, min(float(held.cpus), node.cpus - own_cpus))
    memory = max(0.0, min(held.memory_mib / 1024, node.memory_gib - own_memory_gib))
    if not slices and cpus <= 0 and memory <= 0:
        return None
    request = Request(
        id=f"{FOREIGN_USER}/{node.name}/{serial}",
        user=FOREIGN_USER,
        team="",
        pool=node.pool,
        submit=now,
        gpus=len(slices),
        cpus=cpus,
        memory_gib=memory,
        klass=RequestClass.BATCH,
        labels={"org.budgethub.jobs": ", ".join(held.jobs)},
    )
    grant = NodeGrant(node.name, slices, cpus, memory)
    return Allocation(request, (grant,), now, False, now + PROTECTED, 0.0)


class ForeignHolds:
    """Keeps the core's stand-ins equal to what Slurm says other jobs hold."""

    def __init__(
        self,
        core: Scheduler,
        backends: Mapping[str, Any],
        changed: Callable[[], None],
        log: logging.Logger | logging.LoggerAdapter[Any],
        interval: float = 2.0,
        store: Any = None,
    ) -> None:
        self.core = core
        self.store = store
        """Where a session's GPUs are recorded again when Slurm bound others (`rebind`)."""
        self.readers = {
            name: backend.held_elsewhere
            for name, backend in backends.items()
            if callable(getattr(backend, "held_elsewhere", None))
        }
        self.team_of = {
            name: backend.team_of
            for name, backend in backends.items()
            if callable(getattr(backend, "team_of", None))
        }
        """Per node, Slurm account -> the team its jobs are charged to."""
        self.usage = ForeignUsage(core, store, log)
        self.changed = changed
        self.log = log
        self.interval = interval
        self.current: dict[str, Allocation] = {}
        """Per node, its stand-in in the core."""
        self._serial = 0

    async def follow(self) -> None:
        """Every ``interval``: read (off the event loop) and bring the stand-ins up to date."""
        while self.readers:
            try:
                held = await asyncio.to_thread(self.read)
            except Exception as error:  # Slurm did not answer: keep what is known
                self.log.info("budgethub: reading other jobs' holdings: %s", error)
            else:
                try:
                    self.apply(held, time.time())
                except Exception:  # never the end of the loop: the next round tries again
                    self.log.exception("budgethub: counting what other jobs hold")
            await asyncio.sleep(self.interval)

    def prime(self) -> None:
        """Read once and take the stand-ins in now, before the first cycle after a start
        (blocking: one round of Slurm's commands), so that no cycle places a session on
        a GPU another job held while the Hub was down; Slurm not answering is logged and
        left to `follow`."""
        try:
            held = self.read()
        except Exception as error:
            self.log.info("budgethub: reading other jobs' holdings at the start: %s", error)
            return
        self.apply(held, time.time())

    def read(self) -> dict[str, HeldLike | None]:
        """Every node's holdings as read in this round (one read serves every node)."""
        started = time.monotonic()
        return {name: read(started) for name, read in self.readers.items()}

    def apply(self, held: Mapping[str, HeldLike | None], now: float) -> bool:
        """Stand-ins for ``held`` (per node); True if any changed (a cycle is kicked)."""
        changed = False
        for name, what in held.items():
            if what is not None and what.own:
                self.rebind(name, what.own)
            node = self.core.nodes.get(name)
            old = self.current.get(name)
            if old is not None and old.id not in self.core.running:
                del self.current[name]  # the core let it go (its node went down)
                old = None
            new = None
            if node is not None and what is not None and node.health is not Health.DOWN:
                new = self._stand_in(node, what, now)
            if _same(old, new):
                continue
            changed = True
            if old is not None:
                self.core.finish(old.id)
                del self.current[name]
            if new is not None:
                self.core.adopt(new)
                self.current[name] = new
            self.log.info(
                "budgethub: node %s: other jobs hold %s",
                name,
                describe(new) if new is not None else "nothing now",
            )
        self.usage.update(self.usage.rates(held, self.team_of), now)
        if changed:
            self.changed()
        return changed

    def rebind(self, name: str, own: Sequence[tuple[str, Any]]) -> None:
        """This Hub's sessions on node ``name`` hold the GPUs Slurm bound to their jobs
        (``own``: request id and what its job holds there), in the core and the store:
        Slurm picks which GPUs of a type that counts several (``gpu:h100:2``) a job gets."""
        node = self.core.nodes.get(name)
        if node is None:
            return
        by_index = {gpu.index: gpu for gpu in node.whole_gpus}
        moved = []
        for request_id, use in own:
            allocation = self.core.running.get(request_id)
            if allocation is None or is_foreign(request_id):
                continue
            new = rebound(allocation, name, use, by_index, node.gpus)
            if new is not None:
                moved.append((allocation, new))
        if not moved:
            return
        leaving = {a.id for a, _ in moved}
        taken = {
            s.device_id
            for a in self.core.running.values()
            if a.id not in leaving
            for g in a.grants
            if g.node == name
            for s in g.slices
        }
        clash = [
            s.device_id
            for _, new in moved
            for g in new.grants
            for s in g.slices
            if s.device_id in taken
        ]
        if clash:  # the core holds them for another session: Slurm's word is not taken
            self.log.warning(
                "budgethub: node %s: Slurm bound GPUs this Hub books for others: %s",
                name,
                ", ".join(sorted(set(clash))),
            )
            return
        for allocation, _ in moved:
            self.core.finish(allocation.id)
        for _, new in moved:
            self.core.adopt(new)
        for allocation, new in moved:
            if allocation.funded:  # finish and adopt charged [start, now] twice: once
                ledger, team, pool = self.core.ledger, allocation.team, allocation.pool
                ledger.stop_charging(team, pool, allocation.start, allocation.charge_rate)
                ledger.start_charging(team, pool, self.core.clock.now(), allocation.charge_rate)
            self.log.info(
                "budgethub: %s holds the GPUs Slurm bound on %s: %s",
                new.id,
                name,
                ", ".join(s.device_id for g in new.grants for s in g.slices),
            )
        if self.store is not None:
            try:
                self.store.rebind(*(new for _, new in moved))
            except Exception as error:  # the core follows Slurm; the store keeps its booking
                self.log.warning("budgethub: node %s: recording Slurm's GPUs: %s", name, error)

    def _stand_in(self, node: Node, held: HeldLike, now: float) -> Allocation | None:
        held = _with_unbooked(held, self.core.running, node.name)
        own_gpus: set[str] = set()
        own_cpus = own_memory = 0.0
        for allocation in self.core.running.values():
            if is_foreign(allocation.id):
                continue
            for grant in allocation.grants:
                if grant.node == node.name:
                    own_gpus.update(s.device_id for s in grant.slices)
                    own_cpus += math.ceil(grant.cpus)  # Slurm gives whole CPUs
                    own_memory += grant.memory_gib
        self._serial += 1
        return stand_in(node, held, own_gpus, own_cpus, own_memory, now, self._serial)


class ForeignUsage:
    """Charges what other jobs hold to their team: per (team, pool), the GPUs (a GPU pool)
    or CPUs (a CPU pool) its Slurm account's jobs hold on the pool's nodes, at that rate,
    from the round Slurm first shows them to the round it shows them no more. A job
    holding shards of a GPU is charged the GPU, which budgethub counts as taken whole."""

    def __init__(self, core: Scheduler, store: Any, log: Any, flush: float = FLUSH) -> None:
        self.core = core
        self.store = store
        self.log = log
        self.flush = flush
        self.open: dict[tuple[str, str], tuple[float, float, tuple[str, ...]]] = {}
        """(team, pool) -> (units per second, charged since, the jobs): charged now."""
        self._ledger = core.ledger
        self._strangers: set[str] = set()

    def rates(
        self,
        held: Mapping[str, HeldLike | None],
        team_of: Mapping[str, Callable[[str], str]],
    ) -> dict[tuple[str, str], tuple[float, tuple[str, ...]]]:
        """(team, pool) -> (units per second, job ids) of what ``held`` says other jobs
        hold; a job whose account is no team's is charged to no one (and logged once)."""
        found: dict[tuple[str, str], tuple[float, tuple[str, ...]]] = {}
        counted: set[tuple[str, str]] = set()  # a Slurm node two pools share: charged once
        for name, what in held.items():
            node = self.core.nodes.get(name)
            if node is None or what is None:
                continue
            kind = self.core.pools[node.pool].kind
            indices = {gpu.index for gpu in node.whole_gpus}
            migs = mig_slices_of(node.gpus)
            for job, account, use in getattr(what, "charges", ()):
                if (job, use.node) in counted:
                    continue
                counted.add((job, use.node))
                team = team_of[name](account) if name in team_of else account
                if team not in self.core.teams.teams:
                    if account not in self._strangers:
                        self._strangers.add(account)
                        self.log.info(
                            "budgethub: Slurm account %r is no team's: its jobs (%s) are "
                            "charged to no one (c.BudgetScheduler.slurm_accounts)",
                            account,
                            job,
                        )
                    continue
                if kind is PoolKind.GPU:  # a MIG instance: its share of a GPU
                    rate = float(len((set(use.gpus) | set(use.shards)) & indices))
                    rate += sum(migs[i].weight for i in set(use.gpus) if i in migs)
                else:
                    rate = float(use.cpus)
                if rate <= 0:
                    continue
                key = (team, node.pool)
                was, jobs = found.get(key, (0.0, ()))
                found[key] = (was + rate, jobs if job in jobs else (*jobs, job))
        return found

    def update(
        self, rates: Mapping[tuple[str, str], tuple[float, tuple[str, ...]]], now: float
    ) -> None:
        """Charge ``rates`` from ``now`` on: each (team, pool) whose rate changed, or
        whose stretch is older than ``flush``, has its stretch written to the store."""
        ledger = self.core.ledger
        if ledger is not self._ledger:  # swapped (a longer lookback): charge ours again
            for (team, pool), (rate, since, _) in self.open.items():
                ledger.start_charging(team, pool, since, rate)
            self._ledger = ledger
        for key in sorted(set(self.open) | set(rates)):
            team, pool = key
            rate, jobs = rates.get(key, (0.0, ()))
            old = self.open.get(key)
            if old is None:
                if rate > 0:
                    ledger.start_charging(team, pool, now, rate)
                    self.open[key] = (rate, now, jobs)
                continue
            old_rate, since, old_jobs = old
            seen = tuple(dict.fromkeys((*old_jobs, *jobs)))
            if abs(old_rate - rate) < 1e-9 and now - since < self.flush:
                self.open[key] = (old_rate, since, seen)
                continue
            self.record(team, pool, since, now, old_rate, old_jobs)
            if abs(old_rate - rate) >= 1e-9:
                ledger.stop_charging(team, pool, now, old_rate)
                if rate > 0:
                    ledger.start_charging(team, pool, now, rate)
            if rate > 0:
                self.open[key] = (rate, now, jobs)
            else:
                del self.open[key]

    def record(
        self, team: str, pool: str, start: float, end: float, rate: float, jobs: Sequence[str]
    ) -> None:
        """One stretch into the store's usage (as a session's is at its end), and an
        event that says it was other jobs' (the budget pages' "batch work seen in Slurm")."""
        units = rate * (end - start)
        if self.store is None or units <= 0:
            return
        try:
            self.store.add_usage(team, pool, start, end, units)
            self.store.append_event(
                end,
                SLURM_USAGE,
                {
                    "team": team,
                    "pool": pool,
                    "start": start,
                    "end": end,
                    "units": units,
                    "jobs": list(jobs),
                },
            )
        except Exception as error:  # the core charged it all the same
            self.log.warning("budgethub: recording other jobs' use for %s: %s", team, error)


@dataclass(frozen=True)
class _Held:
    cpus: int
    memory_mib: int
    gpus: frozenset[int]
    jobs: tuple[str, ...]
    own: tuple[tuple[str, Any], ...] = ()
    reserved: str = ""
    charges: tuple[tuple[str, str, Any], ...] = ()


def _with_unbooked(held: HeldLike, running: Mapping[str, Allocation], node: str) -> HeldLike:
    """``held`` and this Hub's jobs on the Slurm node that the core does not book on
    ``node``: one whose request is booked no more (a stop that timed out before KillWait
    and the epilog were over), whose slices are free only once Slurm says the job ended;
    and another pool's session, where two pools' partitions share the Slurm node."""
    late = [
        (request, use)
        for request, use in held.own
        if request not in running or node not in running[request].node_names
    ]
    if not late:
        return held
    return _Held(
        reserved=held.reserved,
        cpus=held.cpus + sum(use.cpus for _, use in late),
        memory_mib=held.memory_mib + sum(use.memory_mib for _, use in late),
        gpus=held.gpus.union(*(use.gpus for _, use in late), *(use.shards for _, use in late)),
        jobs=(
            *held.jobs,
            *(
                f"{request} ({'ending' if request not in running else 'another pool'})"
                for request, _ in late
            ),
        ),
        charges=held.charges,
    )


def rebound(
    allocation: Allocation,
    node: str,
    use: Any,
    by_index: Mapping[int, Any],
    node_gpus: Sequence[Any] = (),
) -> Allocation | None:
    """``allocation`` with its GPUs on ``node`` those Slurm bound to its job (``use``:
    whole GPUs and the GPU of its shards, by index), or None when they are the same
    already or cannot be said so."""
    for i, grant in enumerate(allocation.grants):
        if grant.node != node:
            continue
        whole = [i for i in use.gpus if i in by_index]  # not a MIG instance's index
        slices = _moved(grant.slices, SliceKind.WHOLE, whole, by_index)
        slices = _moved(slices, SliceKind.FRACTION, getattr(use, "shards", ()), by_index)
        slices = _moved_mig(slices, use.gpus, mig_slices_of(node_gpus))
        if slices == grant.slices or len({s.device_id for s in slices}) != len(slices):
            return None  # unchanged, or one GPU twice (a fraction beside a whole GPU)
        grants = list(allocation.grants)
        grants[i] = replace(grant, slices=slices)
        return replace(allocation, grants=tuple(grants))
    return None


def mig_slices_of(gpus: Sequence[Any]) -> dict[int, Slice]:
    """Per Slurm index, the MIG instance of a Slurm node's GPUs as a slice (its uuid ends
    in the index: `spawner.runtime.slurm.node_gpus`)."""
    found: dict[int, Slice] = {}
    for gpu in gpus:
        for instance in gpu.mig:
            index = instance.uuid.rsplit(":", 1)[-1]
            if index.isdigit():
                found[int(index)] = Slice(
                    gpu.uuid,
                    SliceKind.MIG,
                    mig_uuid=instance.uuid,
                    mig_profile=instance.profile,
                )
    return found


def _moved_mig(
    slices: tuple[Slice, ...], bound: Sequence[int], migs: Mapping[int, Slice]
) -> tuple[Slice, ...]:
    """``slices`` with their MIG instances those Slurm bound (``bound``: indices), an
    instance of the same profile for each one booked (as they are where that cannot be)."""
    mine = [s for s in slices if s.kind is SliceKind.MIG]
    found = [migs[i] for i in sorted(bound) if i in migs]
    if not mine or len(found) != len(mine):
        return slices
    left = [f for f in found if f.mig_uuid not in {s.mig_uuid for s in mine}]
    moved: dict[int, Slice] = {}
    for s in mine:
        if any(f.mig_uuid == s.mig_uuid for f in found):
            continue
        match = next((f for f in left if f.mig_profile == s.mig_profile), None)
        if match is None:
            return slices
        left.remove(match)
        moved[id(s)] = match
    return tuple(moved.get(id(s), s) for s in slices)


def _moved(
    slices: tuple[Slice, ...], kind: SliceKind, bound: Sequence[int], by_index: Mapping[int, Any]
) -> tuple[Slice, ...]:
    """``slices`` with those of ``kind`` on the GPUs of indices ``bound``, in order (as
    they are where Slurm says nothing of them, or says another number of them)."""
    mine = [s for s in slices if s.kind is kind]
    wanted = sorted(bound)
    if not mine or len(wanted) != len(mine) or not all(b in by_index for b in wanted):
        return slices
    booked = sorted(mine, key=lambda s: _index_of(s.gpu_uuid, by_index))
    if [_index_of(s.gpu_uuid, by_index) for s in booked] == wanted:
        return slices
    moved = {
        id(s): replace(s, gpu_uuid=by_index[b].uuid) for s, b in zip(booked, wanted, strict=True)
    }
    return tuple(moved.get(id(s), s) for s in slices)


def _index_of(uuid: str, by_index: Mapping[int, Any]) -> int:
    return next((i for i, gpu in by_index.items() if gpu.uuid == uuid), -1)


def _same(old: Allocation | None, new: Allocation | None) -> bool:
    if old is None or new is None:
        return old is new
    return old.grants[0].slices == new.grants[0].slices and (
        (old.grants[0].cpus, old.grants[0].memory_gib, old.request.labels)
        == (new.grants[0].cpus, new.grants[0].memory_gib, new.request.labels)
    )


def describe(allocation: Allocation) -> str:
    grant = allocation.grants[0]
    gpus = ", ".join(s.device_id.rsplit(":", 1)[-1] for s in grant.slices) or "none"
    jobs = allocation.request.labels.get("org.budgethub.jobs", "")
    return f"GPUs {gpus}, {grant.cpus:g} CPUs, {grant.memory_gib:.3g} GiB" + (
        f" (jobs {jobs})" if jobs else ""
    )
