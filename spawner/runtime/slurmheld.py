"""What Slurm has given to jobs this Hub did not submit, node by node (docs/slurm.md).

One ``scontrol -d -o show job`` per poll round lists every job with, per node, the CPUs
(``CPU_IDs``), memory (``Mem``) and GRES with their indices (``GRES=gpu:h100:1(IDX:0)``)
Slurm allocated to it; the jobs whose comment does not name this Hub are "held
elsewhere". Per job and not per node (``AllocTRES``, ``GresUsed``): a node's totals
include this Hub's own jobs, which Slurm may count before or after the Hub books them,
and only a job's own record says which GPUs are whose.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

HOLDING = frozenset(
    {
        "RUNNING",
        "COMPLETING",
        "CONFIGURING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "RESIZING",
        "STAGE_OUT",
    }
)
"""Job states in which Slurm has resources allocated to the job (not PENDING)."""

HUB_LABEL = "org.budgethub.hub"
_DETAIL = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=(\S*) Mem=(\d+) GRES=(\S*)")


def expand_ids(text: str) -> list[int]:
    """``0-2,5`` → [0, 1, 2, 5]; ``N/A`` or empty → []."""
    found: list[int] = []
    for piece in text.split(","):
        low, _, high = piece.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            continue
        found.extend(range(int(low), int(high or low) + 1))
    return found


def hostnames(text: str) -> list[str]:
    """Slurm's host list (``bhs[1-3,7],gpu-01``) as names, without calling Slurm."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", text):
        match = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
        if match is None:
            names.append(part)
            continue
        head, ranges, tail = match.groups()
        for piece in ranges.split(","):
            low, _, high = piece.partition("-")
            width = len(low)
            for n in range(int(low), int(high or low) + 1):
                names.append(f"{head}{n:0{width}d}{tail}")
    return names


def gres_indices(gres: str, name: str = "gpu") -> list[int]:
    """The indices of GRES ``name`` in ``gpu:g1:1(IDX:1),gpu:h100:2(IDX:2-3)``."""
    found: list[int] = []
    for part in re.split(r",(?![^(]*\))", gres):
        if part.split(":", 1)[0] != name:
            continue
        match = re.search(r"\(IDX:([^)]*)\)", part)
        if match is not None:
            found.extend(expand_ids(match.group(1)))
    return sorted(set(found))


@dataclass(frozen=True)
class NodeUse:
    """What one job holds on one node."""

    node: str
    cpus: int
    memory_mib: int
    gpus: tuple[int, ...]
    """Indices of the GPUs it holds whole."""
    shards: tuple[int, ...] = ()
    """Indices of the GPUs it holds shards of (``GRES=shard:h100:25(IDX:1)``)."""


@dataclass(frozen=True)
class JobDetail:
    """One job as ``scontrol -d -o show job`` describes it."""

    id: str
    user: str
    account: str
    partition: str
    state: str
    labels: Mapping[str, str]
    uses: tuple[NodeUse, ...]
    exit_code: str = "0:0"
    """``status:signal`` once the job has ended."""

    @property
    def holds(self) -> bool:
        return self.state in HOLDING

    @property
    def exit_status(self) -> int:
        """The exit code as a shell gives it (128 + the signal that ended it)."""
        status, _, signal_number = self.exit_code.partition(":")
        try:
            code, signal = int(status or 0), int(signal_number or 0)
        except ValueError:
            return 0
        return code or (128 + signal if signal else 0)


def parse_job_line(line: str, gres: str = "gpu") -> JobDetail | None:
    """One line of ``scontrol -d -o show job``; None for a line that is no job."""
    match = re.match(r"JobId=(\d+)", line.strip())
    if match is None:
        return None
    fields = dict(re.findall(r"(?:^|\s)([A-Za-z][A-Za-z0-9/:_]*)=(\S*)", line))
    user = fields.get("UserId", "").split("(", 1)[0]
    labels: dict[str, str] = {}
    try:  # this Hub's jobs carry their labels as JSON without spaces (SlurmRuntime.job_script)
        decoded = json.loads(fields.get("Comment", ""))
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        labels = {str(k): str(v) for k, v in decoded.items()}
    uses = []
    for nodes, cpu_ids, mem, job_gres in _DETAIL.findall(line):
        for node in hostnames(nodes):
            uses.append(
                NodeUse(
                    node=node,
                    cpus=len(expand_ids(cpu_ids)),
                    memory_mib=int(mem),
                    gpus=tuple(gres_indices(job_gres, gres)),
                    shards=tuple(gres_indices(job_gres, "shard")),
                )
            )
    return JobDetail(
        id=match.group(1),
        user=user,
        account=fields.get("Account", ""),
        partition=fields.get("Partition", ""),
        state=fields.get("JobState", ""),
        labels=labels,
        uses=tuple(uses),
        exit_code=fields.get("ExitCode", "0:0"),
    )


def parse_jobs(text: str, gres: str = "gpu") -> list[JobDetail]:
    jobs = []
    for line in text.splitlines():
        job = parse_job_line(line, gres)
        if job is not None:
            jobs.append(job)
    return jobs


@dataclass(frozen=True)
class Held:
    """What jobs this Hub did not submit hold on one node."""

    cpus: int = 0
    memory_mib: int = 0
    gpus: frozenset[int] = frozenset()
    jobs: tuple[str, ...] = ()
    """``12345 (alice, account physics)`` for each such job, for logs and pages."""
    reserved: str = ""
    """A reservation on the node that is on now or starts within a session's time limit
    (``maint from 2026-12-06T22:30:00``): the whole node is taken, since Slurm would keep
    a session's job there pending."""
    own: tuple[tuple[str, NodeUse], ...] = ()
    """This Hub's jobs that Slurm still runs on the node, by request id: one whose
    request the Hub no longer books (its stop timed out before KillWait and the epilog
    were over) holds the node all the same (`spawner.runtime.foreign`)."""
    charges: tuple[tuple[str, str, NodeUse], ...] = ()
    """(job id, Slurm account, what it holds here) of each job of another: what its team
    is charged for (`spawner.runtime.foreign.ForeignUsage`)."""


def held_by_others(jobs: Iterable[JobDetail], hub: str) -> dict[str, Held]:
    """Per node, the sum of what jobs holding resources there, not of ``hub``, hold
    (and ``hub``'s own jobs there, apart)."""
    found: dict[str, Held] = {}
    for job in jobs:
        if not job.holds:
            continue
        if job.labels.get(HUB_LABEL) == hub:
            request = job.labels.get("org.budgethub.request", "")
            for use in job.uses:
                was = found.get(use.node, Held())
                found[use.node] = replace(was, own=(*was.own, (request, use)))
            continue
        who = f"{job.id} ({job.user or '?'}"
        who += f", account {job.account})" if job.account else ")"
        for use in job.uses:
            was = found.get(use.node, Held())
            found[use.node] = replace(
                was,
                cpus=was.cpus + use.cpus,
                memory_mib=was.memory_mib + use.memory_mib,
                # A GPU another job holds shards of is taken whole here: Slurm would share
                # it, but budgethub does not yet split a GPU with other jobs.
                gpus=was.gpus | frozenset(use.gpus) | frozenset(use.shards),
                jobs=(*was.jobs, who),
                charges=(*was.charges, (job.id, job.account, use)),
            )
    return found


def reserved_nodes(text: str, now: float, horizon: float | None) -> dict[str, str]:
    """Per node, the first reservation of ``scontrol -o show reservation`` that is on at
    ``now`` or starts within ``horizon`` seconds (None: any time ahead), in words."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z][A-Za-z0-9/:_]*)=(\S*)", line))
        if "ReservationName" not in fields:
            continue
        try:
            start = datetime.fromisoformat(fields.get("StartTime", "")).timestamp()
            end = datetime.fromisoformat(fields.get("EndTime", "")).timestamp()
        except ValueError:
            continue
        if end <= now or (horizon is not None and start > now + horizon):
            continue
        words = f"reservation {fields['ReservationName']} from {fields['StartTime']}"
        for node in hostnames(fields.get("Nodes", "")):
            found.setdefault(node, words)
    return found


@dataclass
class JobDetails:
    """Every job of the cluster in detail, read once per ``ttl`` however many partitions
    and nodes ask (shared by the Hub's `SlurmPartition` objects)."""

    run: Callable[..., str]
    """Runs one of Slurm's commands and returns its output (`SlurmPartition.command`)."""
    hub: str
    gres: str = "gpu"
    ttl: float = 1.0
    horizon: float | None = None
    """A session's time limit in seconds: reservations starting later do not matter."""
    _at: float = field(default=-1e9, init=False)
    _jobs: dict[str, JobDetail] = field(default_factory=dict, init=False)
    _held: dict[str, Held] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def _read(self, max_age: float, newer_than: float = -1e9) -> None:
        with self._lock:
            if time.monotonic() - self._at > max_age or self._at < newer_than:
                started = time.monotonic()
                jobs = parse_jobs(self.run("scontrol", "-d", "-o", "show", "job"), self.gres)
                self._jobs = {job.id: job for job in jobs}
                held = held_by_others(jobs, self.hub)
                reservations = self.run("scontrol", "-o", "show", "reservation")
                for node, words in reserved_nodes(reservations, time.time(), self.horizon).items():
                    held[node] = replace(held.get(node, Held()), reserved=words)
                self._held = held
                self._at = started

    def held(self, newer_than: float = -1e9) -> dict[str, Held]:
        """Per node, what other jobs hold, as read after ``newer_than`` (``time.monotonic``)
        or within ``ttl`` (SlurmError when Slurm does not answer)."""
        self._read(self.ttl, newer_than)
        return self._held

    def job(self, job: str, newer_than: float = -1e9) -> JobDetail | None:
        """One job's detail as read after ``newer_than`` (``time.monotonic``), for its
        exit code once it ended; None once Slurm forgot it. Every job asked about in one
        round shares one read."""
        self._read(self.ttl, newer_than)
        return self._jobs.get(job)
