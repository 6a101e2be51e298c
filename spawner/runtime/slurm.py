"""Sessions as Slurm jobs: the runtime for pools that name a Slurm partition.

budgethub decides who runs, where and on which GPUs; Slurm runs the session there. A
granted session becomes one batch job pinned with ``--nodelist`` to the node the
scheduler chose, with the CPUs, memory and a time limit of its grant, the request in its
comment (with the rest of its labels) and each granted whole GPU bound as a GRES of its
own type. The site gives each GPU a type of its own in ``gres.conf`` (``gpu:g0:1,
gpu:g1:1``); then ``--gres=gpu:g1:1`` is that exact GPU, Slurm enforces it (it sets
``CUDA_VISIBLE_DEVICES``, and its cgroup plugin limits the devices where the site runs
it), and ``scontrol show -d job`` shows its index. A GRES type that counts several GPUs
is bound by count only (Slurm picks which). A fraction of a GPU asks Slurm for no GRES:
Slurm cannot share one GPU between jobs that way, so budgethub's booking alone keeps
fractions apart, and the job is shown its GPU by ``CUDA_VISIBLE_DEVICES``.

The session runs from an environment on the node, as batchspawner runs it: a venv on
shared storage made by ``images/session-env`` with the session image's software (the
same JupyterHub, JupyterLab, agent and kernel extension), so snapshots work unchanged.
That needs nothing on the nodes but the mount: Debian ships no Apptainer, and Docker or
Podman under slurmd would need root on every node. A site whose jobs must run in a
container sets ``slurm_command_prefix`` (``apptainer exec --bind … session.sif``).

Slurm's commands (``sbatch``, ``squeue``, ``scancel``, ``scontrol``) are run as
subprocesses with ``SLURM_CONF``; one `SlurmPartition` per partition asks Slurm for all
its nodes and jobs at once (node states and job lists are cached for a second, and one
thread per partition follows the jobs' ends), so a hundred nodes cost one ``squeue``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler_core.model import MIG_SLICES, Gpu, MigInstance, Node, PoolKind, mig_weight
from spawner.runtime.dockernodes import EngineConfig
from spawner.runtime.interface import Answer, SessionState
from spawner.runtime.slurmheld import Held, JobDetails, hostnames
from spawner.runtime.slurmusers import Account, NoAccount, give, lookup, submit_prefix
from spawner.runtime.spec import (
    LABEL_PREFIX,
    RESTORE_PATH,
    SESSION_USER,
    WORKSPACE_PATH,
    LaunchSpec,
)

ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETING",
        "REQUEUED",
        "RESIZING",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
    }
)
"""Job states in which the job still holds (or will hold) its node's resources."""
NODE_KEY = f"{LABEL_PREFIX}.node"
ROUND = 0.25
"""Seconds one ``squeue`` listing serves a starting or stopping session's polls."""
RECONCILE = 10.0
READ_MAX_TIME = True
"""Whether the Hub reads the partition's MaxTime (clamps --time, refuses a MaxTime below
max_min_runtime)."""
"""Seconds one listing serves every node's sessions (a restart, a node back)."""
log = logging.getLogger(__name__)


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is Slurm's."""


class SlurmConfigError(ValueError):
    """``c.BudgetScheduler.<key>`` names something Slurm does not have."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class SlurmSettings:
    """How the Hub reaches Slurm and what a session's job carries."""

    conf: str = ""
    """``SLURM_CONF`` for Slurm's commands ("": Slurm's default)."""
    bin_dir: str = ""
    """Where ``sbatch`` and the rest are ("": on PATH)."""
    session_env: str = "/opt/budgethub/session-env"
    command_prefix: tuple[str, ...] = ()
    time_limit: str = "7-00:00:00"
    pending_timeout: float = 30.0
    timeout: float = 15.0
    watch_interval: float = 2.0
    accounts: Mapping[str, str] = field(default_factory=dict)
    """Team → Slurm account (``--account``); a team not here uses its own name."""
    qos: str = ""
    users: Any = ""
    """Hub user → Unix account its jobs run as (`spawner.runtime.slurmusers`); "": every
    job as the images' session user, 1000:100."""
    exec_prefix: tuple[str, ...] = ()
    """Words before ``sbatch`` and ``scancel`` to run them as the account
    (``sudo -n -u {account}``); empty: ``--uid/--gid`` where the Hub is root."""
    home: str = ""
    """A session's home as a path template (``/home/{account}``: the account's own home;
    ``{user}`` is the Hub user); "": ``home_root/<hub>/<user>``."""


def slurm_seconds(text: str) -> float | None:
    """Slurm's time (``7-00:00:00``, ``1-12``, ``90``, ``01:30:00``) in seconds; None for
    ``UNLIMITED`` or ``INFINITE``. ValueError for what is none of these."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", text
    parts = [int(p) for p in rest.split(":")] if rest else [0]
    if dash:  # days-hours[:minutes[:seconds]]
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts[:3]
    elif len(parts) == 1:  # minutes
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:  # minutes:seconds
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = parts[:3]
    return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)


def slurm_time(seconds: float) -> str:
    """Seconds as Slurm's ``D-HH:MM:SS`` (whole minutes, rounded down)."""
    minutes = int(seconds // 60)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:00"


def parse_record(line: str) -> dict[str, str]:
    """One ``scontrol -o show …`` record as a dict; values may hold spaces."""
    fields: dict[str, str] = {}
    matches = list(re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9/:_]*)=", line))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[match.group(1)] = line[match.end() : end].strip()
    return fields


@dataclass(frozen=True)
class GresEntry:
    name: str
    type: str
    count: int

    @property
    def spec(self) -> str:
        return f"{self.name}:{self.type}:1" if self.type else f"{self.name}:1"


def parse_gres(text: str) -> list[GresEntry]:
    """``gpu:g0:1,gpu:g1:1`` or ``gpu:a100:4(S:0-1)`` or ``gpu:2``."""
    entries: list[GresEntry] = []
    if not text or text == "(null)":
        return entries
    for part in re.split(r",(?![^(]*\))", text):
        part = re.sub(r"\(.*\)$", "", part.strip())
        bits = part.split(":")
        if len(bits) == 1:
            entries.append(GresEntry(bits[0], "", 1))
        elif len(bits) == 2:
            if bits[1].isdigit():
                entries.append(GresEntry(bits[0], "", int(bits[1])))
            else:
                entries.append(GresEntry(bits[0], bits[1], 1))
        else:
            count = int(bits[2]) if bits[2].isdigit() else 1
            entries.append(GresEntry(bits[0], bits[1], count))
    return entries


@dataclass(frozen=True)
class SlurmGpu:
    """How one of budgethub's GPUs is asked of Slurm."""

    gres: str | None
    """``gpu:g1:1``: the GRES that binds this GPU alone; None when its type counts several."""
    typed: str
    """``gpu:a100:1``: asks for one GPU of its type (bound by count)."""
    index: int
    shards: int = 0
    """``gres/shard`` units of this GPU (0: the node declares none)."""
    shard: str = "shard"
    """The shard GRES as a job asks for it (``shard`` or ``shard:a100``)."""


@dataclass(frozen=True)
class SlurmNodeInfo:
    name: str
    address: str
    cpus: float
    memory_mib: int
    state: str
    reason: str
    gres: tuple[GresEntry, ...]


def node_health(state: str) -> Answer:
    """Slurm's node state (``IDLE+DRAIN``, ``DOWN*``, ``MIXED``) as a health answer."""
    flags = set(re.split(r"[+]", state.upper().rstrip("*$~#!%@^-")))
    if state.endswith("*") or "NOT_RESPONDING" in flags:
        return Answer.TIMEOUT
    if flags & {"DOWN", "FAIL", "FUTURE", "POWERED_DOWN", "POWERING_DOWN"}:
        return Answer.DOWN
    if flags & {"DRAIN", "DRAINING", "DRAINED", "REBOOT_REQUESTED", "FAILING", "MAINT"}:
        return Answer.DRAINING
    return Answer.OK


class SlurmPartition:
    """One Slurm partition: its nodes, its jobs and the commands that ask for them."""

    def __init__(
        self,
        partition: str,
        settings: SlurmSettings,
        hub: str,
        details: JobDetails | None = None,
    ) -> None:
        self.partition = partition
        self.settings = settings
        self.hub = hub
        self.details = details or JobDetails(self.command, hub)
        """Every job's allocation in detail, shared by the partitions of one Hub."""
        self._nodes: tuple[float, dict[str, dict[str, str]]] = (0.0, {})
        self._jobs: tuple[float, list[JobRow]] = (-1e9, [])
        self._lock = threading.Lock()
        self._jobs_lock = threading.Lock()
        self._watchers: dict[str, Callable[[SessionState], None]] = {}
        self._watch: threading.Thread | None = None
        self.slurmd_port = 6818
        self.max_time: float | None = None
        """The partition's MaxTime in seconds (None: unlimited), read at the Hub's start."""

    def time_limit(self) -> str:
        """A session's ``--time``: ``slurm_time_limit``, never past the partition's MaxTime."""
        wanted = slurm_seconds(self.settings.time_limit)
        if self.max_time is not None and (wanted is None or wanted > self.max_time):
            return slurm_time(self.max_time)
        return self.settings.time_limit

    # -- commands --------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.settings.conf:
            env["SLURM_CONF"] = self.settings.conf
        return env

    def command(self, *args: str, input: str | None = None, prefix: Sequence[str] = ()) -> str:
        """Run one of Slurm's commands (after ``prefix``: ``sudo -n -u ACCOUNT``, with
        ``SLURM_CONF`` passed through it); its output, or SlurmError with Slurm's words."""
        exe = os.path.join(self.settings.bin_dir, args[0]) if self.settings.bin_dir else args[0]
        argv = [exe, *args[1:]]
        if prefix:
            conf = [f"SLURM_CONF={self.settings.conf}"] if self.settings.conf else []
            argv = [*prefix, "env", *conf, *argv]
        try:
            done = subprocess.run(
                argv,
                env=self.env(),
                input=input,
                capture_output=True,
                text=True,
                timeout=self.settings.timeout,
            )
        except FileNotFoundError:
            raise SlurmError(f"{exe} is not installed here") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{args[0]} did not answer in {self.settings.timeout:g} s") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().replace("\n", "; ")
            raise SlurmError(said or f"{args[0]} exited with {done.returncode}")
        return done.stdout

    async def acommand(
        self, *args: str, input: str | None = None, prefix: Sequence[str] = ()
    ) -> str:
        return await asyncio.to_thread(self.command, *args, input=input, prefix=prefix)

    # -- what Slurm has ---------------------------------------------------------

    def describe(self) -> dict[str, str]:
        """The partition's record (``scontrol show partition``)."""
        out = self.command("scontrol", "-o", "show", "partition", self.partition)
        return parse_record(out.strip())

    def node_names(self, record: Mapping[str, str] | None = None) -> list[str]:
        nodes = (record if record is not None else self.describe()).get("Nodes", "")
        if not nodes or nodes == "(null)":
            return []
        return self.command("scontrol", "show", "hostnames", nodes).split()

    def read_config(self) -> None:
        """What the Hub needs of slurm.conf: the port slurmd listens on."""
        for line in self.command("scontrol", "show", "config").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "SlurmdPort" and value.strip().isdigit():
                self.slurmd_port = int(value.strip())

    def nodes(self, fresh: bool = False) -> dict[str, dict[str, str]]:
        """Every node of the partition by name (cached for a second)."""
        with self._lock:
            at, known = self._nodes
            if fresh or time.monotonic() - at > 1.0:
                out = self.command("scontrol", "-o", "show", "node")
                records = [parse_record(line) for line in out.splitlines() if line.strip()]
                known = {
                    r["NodeName"]: r
                    for r in records
                    if self.partition in r.get("Partitions", "").split(",")
                }
                self._nodes = (time.monotonic(), known)
            return known

    def node_info(self, name: str) -> SlurmNodeInfo | None:
        record = self.nodes().get(name)
        if record is None:
            return None
        cpus = record.get("CPUEfctv") or record.get("CPUTot") or "0"
        return SlurmNodeInfo(
            name=name,
            address=record.get("NodeAddr", name),
            cpus=float(cpus),
            memory_mib=int(record.get("RealMemory", "0") or 0),
            state=record.get("State", "UNKNOWN"),
            reason=record.get("Reason", ""),
            gres=tuple(parse_gres(record.get("Gres", ""))),
        )

    def listing(self, max_age: float = 1.0, newer_than: float = -1e9) -> list[JobRow]:
        """Every job of the partition, this Hub's or not, ended ones included while Slurm
        keeps them: one ``squeue`` read by every caller within ``max_age`` seconds, or
        since ``newer_than`` (``time.monotonic``). Callers that ask at once wait for one
        read: a poll round costs one ``squeue`` per partition, however many sessions."""
        with self._jobs_lock:
            at, known = self._jobs
            if time.monotonic() - at > max_age or at < newer_than:
                started = time.monotonic()
                out = self.command(
                    "squeue", "-h", "-t", "all", "-p", self.partition, "-o", "%i|%T|%r|%n|%N|%k"
                )
                known = [row for row in map(job_row, out.splitlines()) if row is not None]
                self._jobs = (started, known)
            return known

    def jobs(self, fresh: bool = False, max_age: float = 1.0) -> list[JobRow]:
        """This Hub's jobs in the partition (`listing`)."""
        rows = self.listing(0.0 if fresh else max_age)
        return [r for r in rows if r.labels.get(f"{LABEL_PREFIX}.hub") == self.hub]

    def row(self, job: str, max_age: float = 1.0, newer_than: float = -1e9) -> JobRow | None:
        """One job as the partition's listing has it; None when it is not listed."""
        for row in self.listing(max_age, newer_than):
            if row.id == job:
                return row
        return None

    def job_state(self, job: str, max_age: float = 1.0) -> SessionState | None:
        """One job as a session's state; None once Slurm has forgotten it."""
        row = self.row(job, max_age)
        return None if row is None else self._state(row)

    def _state(self, row: JobRow, seen: float = -1e9) -> SessionState:
        """``row`` (listed at ``seen``) as a session's state; an ended job's exit code from
        the round's one ``scontrol -d show job`` (`JobDetails`), read after ``seen``."""
        state = row.state
        if state in ACTIVE:
            return SessionState(row.id, True, 0, row.labels)
        try:
            detail = self.details.job(row.id, newer_than=seen)
        except SlurmError:
            detail = None
        code = detail.exit_status if detail is not None else 0
        if state != "COMPLETED" and code == 0:
            code = 1
        labels = {
            **row.labels,
            f"{LABEL_PREFIX}.slurm-state": state,
            f"{LABEL_PREFIX}.slurm-reason": row.reason,
        }
        return SessionState(row.id, False, code, labels, oom_killed=state == "OUT_OF_MEMORY")

    # -- following the jobs' ends ----------------------------------------------------

    def follow(self, node: str, on_exit: Callable[[SessionState], None]) -> None:
        self._watchers[node] = on_exit
        if self._watch is None:
            self._watch = threading.Thread(
                target=self._follow, name=f"budgethub-slurm-{self.partition}", daemon=True
            )
            self._watch.start()

    def _follow(self) -> None:
        """Every ``watch_interval``: a job of this Hub that was running and has ended (or
        is gone) is reported to its node's watcher, once."""
        running: dict[str, JobRow] = {}
        while True:
            time.sleep(self.settings.watch_interval)
            seen = time.monotonic()
            try:
                rows = {r.id: r for r in self.jobs(fresh=True)}
            except SlurmError:
                continue
            for job, row in list(running.items()):
                now = rows.get(job)
                if now is not None and now.state in ACTIVE:
                    continue
                del running[job]
                ended = (
                    self._state(now, seen)
                    if now is not None
                    else SessionState(job, False, 0, row.labels)
                )
                watcher = self._watchers.get(row.labels.get(NODE_KEY, ""))
                if watcher is not None:
                    watcher(ended)
            for job, row in rows.items():
                if row.state in ("RUNNING", "COMPLETING", "CONFIGURING"):
                    running.setdefault(job, row)


@dataclass(frozen=True)
class JobRow:
    """One job as ``squeue`` lists it; its labels come from its comment."""

    id: str
    state: str
    reason: str
    asked: str
    node: str
    labels: Mapping[str, str]


def job_row(line: str) -> JobRow | None:
    """A ``squeue -o %i|%T|%r|%n|%N|%k`` line."""
    bits = line.split("|", 5)
    if len(bits) != 6:
        return None
    job, state, reason, asked, node, comment = bits
    try:
        labels = json.loads(comment)
    except ValueError:
        labels = None
    if not isinstance(labels, dict):
        labels = {}
    return JobRow(job, state, reason, asked, node, {str(k): str(v) for k, v in labels.items()})


class SlurmRuntime:
    """One node of a Slurm partition, behind the session runtime interface."""

    def __init__(
        self,
        config: EngineConfig,
        partition: SlurmPartition,
        gpus: Mapping[str, SlurmGpu],
        slurm_node: str = "",
    ) -> None:
        self.config = config
        self.slurm_node = slurm_node or config.node
        """The node's name in Slurm: ``config.node`` is budgethub's, which differs where
        a second pool's partition has the node too (``bhs1@long``)."""
        self.partition = partition
        self.gpus = dict(gpus)
        """budgethub's GPU uuid on this node → how Slurm is asked for it."""
        self.settings = partition.settings
        self.accounts: dict[str, Account] = {}
        """Per request, the Unix account its job runs as (for ``scancel`` through the
        exec prefix; after a Hub restart, root's ``scancel`` or the prefix of no one)."""

    @property
    def node(self) -> str:
        return self.config.node

    # -- health --------------------------------------------------------------------

    async def ping(self) -> Answer:
        """Slurm's word on the node (down, drained), and whether its slurmd answers:
        one that refuses or does not answer leaves the node unreachable (its jobs may
        still run: slurmstepd outlives slurmd), then down after the grace."""
        try:
            nodes = await asyncio.to_thread(self.partition.nodes)
        except SlurmError:
            return Answer.TIMEOUT
        record = nodes.get(self.slurm_node)
        if record is None:
            return Answer.DOWN
        said = node_health(record.get("State", ""))
        if said is not Answer.OK and said is not Answer.DRAINING:
            return said
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.config.address, self.partition.slurmd_port),
                self.settings.timeout / 3,
            )
            writer.close()
        except (OSError, TimeoutError):
            return Answer.TIMEOUT
        return said

    def watch(self, hub: str, on_exit: Callable[[SessionState], None]) -> None:
        self.partition.follow(self.node, on_exit)

    def held_elsewhere(self, newer_than: float = -1e9) -> Held:
        """What jobs this Hub did not submit hold on the node, as read after ``newer_than``
        (``time.monotonic``: the round's start); `spawner.runtime.foreign` counts it as
        taken. One ``scontrol`` per round for every node. Blocking."""
        return self.partition.details.held(newer_than).get(self.slurm_node, Held())

    def home_of(self, user: str) -> Path | None:
        """The Hub user's home for sessions on this node: ``slurm_home`` filled in with
        their account (None: the Hub's ``home_root`` layout). NoAccount where the user
        has none."""
        if not self.settings.home:
            return None
        account = lookup(self.settings.users, user)
        name = account.name if account is not None else user
        return Path(self.settings.home.format(account=name, user=user))

    def owner_of(self, user: str) -> tuple[int, int] | None:
        """(uid, gid) of the account the Hub user's jobs run as, which owns their home
        and snapshots from their making (None: the session user's, 1000:100). Only a
        root Hub can give files away."""
        if os.geteuid() != 0:
            return None
        try:
            account = lookup(self.settings.users, user)
        except NoAccount:
            return None
        return None if account is None else (account.uid, account.gid)

    def team_of(self, account: str) -> str:
        """The team a Slurm account's jobs are charged to: the one ``slurm_accounts``
        maps to it, else the team of the account's own name (the default map)."""
        return next((t for t, a in self.settings.accounts.items() if a == account), account)

    # -- a session as a job ------------------------------------------------------------

    def job_script(self, spec: LaunchSpec) -> tuple[str, list[str]]:
        """The batch script and sbatch's options for a session's spec."""
        paths = {m.target: m.source for m in spec.mounts if m.kind == "bind"}
        volumes = [m for m in spec.mounts if m.kind != "bind"]
        if volumes:
            raise RuntimeError(
                "a Slurm session needs its home on shared storage (set c.BudgetScheduler.home_root)"
            )

        def on_node(value: str) -> str:
            for target, source in sorted(paths.items(), key=lambda kv: -len(kv[0])):
                if value == target or value.startswith(target + "/"):
                    return source + value[len(target) :]
            return value

        gres, visible = self.gres_of(json.loads(spec.environment.get("BUDGETHUB_GPU_SLICES", "[]")))
        env = {k: on_node(v) for k, v in spec.environment.items()}
        env.pop("NVIDIA_VISIBLE_DEVICES", None)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible and not gres:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        home = env.get("HOME", "/tmp")
        command = [_on_node_option(part, on_node) for part in spec.command]
        executable = command[0]
        if not os.path.isabs(executable) and not self.settings.command_prefix:
            command[0] = os.path.join(self.settings.session_env, "bin", executable)
        lines = [
            "#!/bin/bash",
            f"# budgethub session {spec.name}: by the Hub, run by Slurm on {self.slurm_node}",
            *(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()) if _name_ok(k)),
            'export PATH="'
            + os.path.join(self.settings.session_env, "bin")
            + ':/usr/local/bin:/usr/bin:/bin"',
            f"cd {shlex.quote(home)} || exit 1",
            "exec " + " ".join(shlex.quote(p) for p in [*self.settings.command_prefix, *command]),
        ]
        labels = {**spec.labels, NODE_KEY: self.node}
        options = [
            f"--job-name={spec.name}",
            f"--comment={comment(labels)}",
            f"--partition={self.partition.partition}",
            f"--nodelist={self.slurm_node}",
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={max(1, math.ceil(spec.nano_cpus / 1e9))}",
            f"--mem={max(1, spec.mem_limit_bytes // 2**20)}M",
            f"--time={self.partition.time_limit()}",
            f"--output={home}/.budgethub-slurm-%j.log",
            f"--chdir={home}",
            "--export=NONE",
            "--no-requeue",
            "--parsable",
        ]
        if gres:
            options.append(f"--gres={','.join(gres)}")
        team = spec.labels.get(f"{LABEL_PREFIX}.team", "")
        slurm_account = self.settings.accounts.get(team, team)
        if slurm_account:
            options.append(f"--account={slurm_account}")
        if self.settings.qos:
            options.append(f"--qos={self.settings.qos}")
        account = lookup(self.settings.users, spec.labels.get(f"{LABEL_PREFIX}.user", ""))
        if account is None and os.geteuid() == 0:  # everyone as the images' session user
            uid, _, gid = SESSION_USER.partition(":")
            options += [f"--uid={uid}", f"--gid={gid}"]
        elif account is not None and os.geteuid() == 0 and not self.settings.exec_prefix:
            options += [f"--uid={account.uid}", f"--gid={account.gid}"]
        return "\n".join(lines) + "\n", options

    def gres_of(self, slices: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
        """(``--gres`` entries, GPU indices to show by ``CUDA_VISIBLE_DEVICES``) for the
        granted slices: whole GPUs by type or count, fractions as shards where the node
        has them (else shown, not asked for)."""
        counts: dict[str, int] = {}  # gpu:g1 (exact), gpu:h100 (by count), shard → how many
        visible: list[str] = []
        for piece in slices:
            gpu = self.gpus.get(str(piece.get("uuid", "")))
            if gpu is None:
                raise RuntimeError(f"Slurm has no GPU {piece.get('uuid')} on this node")
            weight = float(piece.get("weight", 1))
            if piece.get("kind") == "fraction" and weight < 1 and gpu.shards:
                # Slurm knows the GPU is shared, gives it whole to no one, and shows it.
                units = max(1, round(weight * gpu.shards))
                counts[gpu.shard] = counts.get(gpu.shard, 0) + units
            elif piece.get("kind") == "fraction" and weight < 1:
                visible.append(str(gpu.index))
            else:
                kind = (gpu.gres or gpu.typed).rsplit(":", 1)[0]
                counts[kind] = counts.get(kind, 0) + 1
        return [f"{kind}:{n}" for kind, n in counts.items()], visible

    async def launch(self, spec: LaunchSpec) -> str:
        """Submit the session's job; its id once Slurm runs it. A job Slurm refuses,
        fails, or keeps pending past ``pending_timeout`` is cancelled, with Slurm's reason."""
        script, options = self.job_script(spec)  # NoAccount: the user has no account here
        account = lookup(self.settings.users, spec.labels.get(f"{LABEL_PREFIX}.user", ""))
        prefix = submit_prefix(self.settings.exec_prefix, account)
        if account is not None:
            home, restore = node_paths(spec)
            await asyncio.to_thread(give, home, restore, account)
            self.accounts[spec.labels.get(f"{LABEL_PREFIX}.request", "")] = account
        try:
            out = await self.partition.acommand("sbatch", *options, input=script, prefix=prefix)
        except SlurmError as error:
            raise RuntimeError(f"Slurm refused the job: {error}") from None
        job = out.strip().split(";")[0]
        submitted = time.monotonic()
        deadline = submitted + self.settings.pending_timeout
        interval = 0.05
        reason = ""
        while time.monotonic() < deadline:
            state = await asyncio.to_thread(self.partition.row, job, ROUND, submitted)
            if state is None:
                raise RuntimeError(f"Slurm lost job {job}")
            if state.state in ("RUNNING", "CONFIGURING"):
                return job
            if state.state not in ACTIVE:
                ended = await asyncio.to_thread(self.partition._state, state, submitted)
                raise RuntimeError(
                    f"Slurm job {job} ended {state.state} before it ran"
                    + (f" ({state.reason})" if state.reason not in ("", "None") else "")
                    + f", exit {ended.exit_code}"
                )
            reason = state.reason
            await asyncio.sleep(interval)
            interval = min(interval * 1.5, 0.5)
        try:
            await asyncio.wait_for(self.remove(job), self.settings.timeout)
        except (TimeoutError, SlurmError) as error:  # the reason below matters more
            why = str(error) or "it did not end in time"
            log.warning("budgethub: cancelling pending Slurm job %s: %s", job, why)
        raise RuntimeError(
            f"Slurm kept job {job} pending for {self.settings.pending_timeout:g} s"
            + (f" ({reason})" if reason and reason != "None" else "")
        )

    async def state(self, runtime_id: str) -> SessionState | None:
        """From the partition's listing of this round (`SlurmPartition.listing`)."""
        return await asyncio.to_thread(self.partition.job_state, runtime_id)

    async def remove(self, runtime_id: str, grace: float = 5.0) -> None:
        """``scancel`` (SIGTERM, then SIGKILL after Slurm's KillWait), and return only once
        Slurm says the job has ended (KillWait and epilog included: COMPLETING still
        holds the node): its slices are free only then. A job already ended costs no
        call of its own."""
        row = await asyncio.to_thread(self.partition.row, runtime_id)
        if row is None or row.state not in ACTIVE:
            return
        try:
            account = self.accounts.get(row.labels.get(f"{LABEL_PREFIX}.request", ""))
            prefix = submit_prefix(self.settings.exec_prefix, account)
            await self.partition.acommand("scancel", runtime_id, prefix=prefix)
        except SlurmError as error:
            if "Invalid job id" not in str(error):
                raise
        cancelled = time.monotonic()
        interval = 0.05
        while True:  # bounded by the caller's engine_timeout
            row = await asyncio.to_thread(self.partition.row, runtime_id, ROUND, cancelled)
            if row is None or row.state not in ACTIVE:
                return
            await asyncio.sleep(interval)
            interval = min(interval * 1.5, 0.5)

    async def sessions(self, hub: str) -> list[SessionState]:
        """This Hub's jobs on the node: every node of a partition reads one listing (a
        restart's reconciliation costs one ``squeue`` per partition)."""
        rows = await asyncio.to_thread(self.partition.jobs, False, RECONCILE)
        return [
            SessionState(r.id, r.state in ACTIVE, 0, r.labels)
            for r in rows
            if r.labels.get(NODE_KEY) == self.node
        ]

    async def foreign_jobs(self) -> list[str]:
        """Jobs on this node of budgethub's partition that this Hub did not start (reported
        at the Hub's start; what they hold is counted as taken, `held_elsewhere`)."""
        rows = await asyncio.to_thread(self.partition.listing, RECONCILE)
        return [
            f"job {r.id} ({r.state})"
            for r in rows
            if r.state in ACTIVE
            and r.labels.get(f"{LABEL_PREFIX}.hub") != self.partition.hub
            and self.slurm_node in (*hostnames(r.node), *hostnames(r.asked))
        ]

    async def archive(self, runtime_id: str, path: str) -> bytes | None:
        return None  # homes are on shared storage: the Hub reads the state there

    async def logs(self, runtime_id: str, tail: int = 20) -> str:
        try:
            record = parse_record(
                await self.partition.acommand("scontrol", "-o", "show", "job", runtime_id)
            )
        except SlurmError as error:
            return f"(no log: {error})"
        path = Path(record.get("StdOut", ""))
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError as error:
            return f"(no log at {path}: {error.strerror})"
        return "\n".join(lines[-tail:])


def node_paths(spec: LaunchSpec) -> tuple[Path, Path | None]:
    """The session's home and the snapshot it restores, as the node sees them."""
    home = next(
        (Path(m.source) for m in spec.mounts if m.target == WORKSPACE_PATH), Path("/nonexistent")
    )
    restore = next((Path(m.source) for m in spec.mounts if m.target == RESTORE_PATH), None)
    return home, restore


def comment(labels: Mapping[str, str]) -> str:
    """The labels as a job's comment: JSON without a space (a space inside a value is
    escaped), so that ``scontrol -o show job`` prints it as one ``Comment=`` field."""
    return json.dumps(labels, separators=(",", ":"), sort_keys=True).replace(" ", "\\u0020")


def _on_node_option(part: str, on_node: Callable[[str], str]) -> str:
    """``--ServerApp.root_dir=/home/jovyan`` with the path as the node sees it."""
    key, equals, value = part.partition("=")
    return f"{key}={on_node(value)}" if equals else on_node(part)


def _name_ok(key: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) is not None


# -- the cluster as Slurm has it ---------------------------------------------------


@dataclass(frozen=True)
class PartitionConfig:
    """``c.BudgetScheduler.slurm_partitions[pool]``."""

    pool: str
    partition: str
    gres: str = "gpu"
    nodes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"slurm_partitions.{self.pool}"


def parse_partitions(raw: Any, pools: Mapping[str, Any]) -> list[PartitionConfig]:
    """``{'gpu': 'gpu'}`` or ``{'gpu': {'partition': 'gpu', 'gres': 'gpu', 'nodes': […]}}``."""
    if not isinstance(raw, Mapping):
        raise SlurmConfigError("slurm_partitions", "must map pool names to partitions")
    found = []
    for pool, value in raw.items():
        key = f"slurm_partitions.{pool}"
        if pool not in pools:
            raise SlurmConfigError(key, f"unknown pool {pool!r}")
        if isinstance(value, str):
            value = {"partition": value}
        if not isinstance(value, Mapping):
            raise SlurmConfigError(
                key, "must be a partition name or {'partition', 'gres', 'nodes'}"
            )
        unknown = set(value) - {"partition", "gres", "nodes"}
        if unknown:
            raise SlurmConfigError(f"{key}.{sorted(unknown)[0]}", "unknown key")
        partition = value.get("partition")
        if not isinstance(partition, str) or not partition:
            raise SlurmConfigError(f"{key}.partition", "must name a Slurm partition")
        gres = value.get("gres", "gpu")
        if not isinstance(gres, str) or not gres:
            raise SlurmConfigError(f"{key}.gres", "must name a GRES (e.g. 'gpu')")
        nodes = value.get("nodes", [])
        if (
            not isinstance(nodes, Sequence)
            or isinstance(nodes, str)
            or not all(isinstance(n, str) for n in nodes)
        ):
            raise SlurmConfigError(f"{key}.nodes", "must be a list of node names")
        found.append(PartitionConfig(str(pool), partition, gres, tuple(nodes)))
    return found


def parse_accounts(raw: Any) -> dict[str, str]:
    """``c.BudgetScheduler.slurm_accounts``: team name → Slurm account name."""
    if not isinstance(raw, Mapping):
        raise SlurmConfigError("slurm_accounts", "must map team names to Slurm accounts")
    for team, account in raw.items():
        if not isinstance(account, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", account):
            raise SlurmConfigError(
                f"slurm_accounts.{team}", f"must be a Slurm account name, not {account!r}"
            )
    return {str(team): account for team, account in raw.items()}


def parse_home(raw: Any) -> str:
    """``c.BudgetScheduler.slurm_home``: "" or an absolute path template whose only
    fields are ``{account}`` and ``{user}``."""
    if not isinstance(raw, str):
        raise SlurmConfigError("slurm_home", f"must be a path template, not {raw!r}")
    if not raw:
        return raw
    try:
        filled = raw.format(account="a", user="u")
    except (KeyError, IndexError, ValueError) as error:
        raise SlurmConfigError(
            "slurm_home", f"{raw!r} may name only {{account}} and {{user}} ({error})"
        ) from None
    if not filled.startswith("/") or "/../" in f"{filled}/":
        raise SlurmConfigError("slurm_home", f"{raw!r} must be an absolute path without '..'")
    return raw


def max_time(config: PartitionConfig, record: Mapping[str, str], cap: float) -> float | None:
    """The partition's MaxTime in seconds; one below ``cap`` is an error: a session could
    be killed by Slurm within the time budgethub promised it."""
    try:
        found = slurm_seconds(record.get("MaxTime", "UNLIMITED"))
    except ValueError:
        return None
    if found is not None and found < cap:
        raise SlurmConfigError(
            f"{config.key}.partition",
            f"partition {config.partition!r} has MaxTime={record.get('MaxTime')}, below "
            f"max_min_runtime ({slurm_time(cap)}): Slurm would end sessions within their "
            "protected time; raise the partition's MaxTime or lower max_min_runtime",
        )
    return found


MIG_TYPE = re.compile(r"(?:^|[_-])(\d+g\.\d+gb)$")
"""A GPU GRES type that is a MIG instance: ``1g.10gb``, or with its model before it
(``a100_1g.10gb``, ``nvidia_a100_3g.20gb``), as AutoDetect=nvml names them."""


def mig_profile(kind: str) -> str | None:
    """The MIG profile of a GPU GRES type (``a100_3g.20gb`` → ``3g.20gb``); None when the
    type is no MIG instance."""
    match = MIG_TYPE.search(kind)
    if match is None:
        return None
    try:
        mig_weight(match.group(1))
    except ValueError:
        return None
    return match.group(1)


def node_gpus(
    name: str, entries: Sequence[GresEntry], gres: Sequence[GresEntry]
) -> tuple[list[Gpu], dict[str, SlurmGpu]]:
    """A node's GPUs (``entries``: its GPU GRES, in Slurm's order) and how each is asked
    of Slurm; its ``shard`` GRES, if any, split evenly over the whole GPUs.

    Slurm numbers a node's GPU GRES in the order its ``Gres=`` lists them (``IDX``), MIG
    instances included, and every GPU's or instance's uuid ends in that number. MIG
    instances (types such as ``1g.10gb``) become budgethub's MIG slices, on GPUs of
    seven compute slices filled in order: Slurm does not say which GPU an instance is
    on, and budgethub needs only which instances there are and which are taken."""
    gpus: list[Gpu] = []
    binding: dict[str, SlurmGpu] = {}
    shard_entries = [e for e in gres if e.name == "shard"]
    whole = sum(e.count for e in entries if mig_profile(e.type) is None)
    shards = sum(e.count for e in shard_entries) // max(1, whole)
    kind = shard_entries[0].type if shard_entries else ""
    instances: list[tuple[int, str, GresEntry]] = []
    index = 0
    for entry in entries:
        profile = mig_profile(entry.type)
        for _ in range(entry.count):
            uuid = f"slurm:{name}:{index}"
            typed = f"{entry.name}:{entry.type}:1" if entry.type else f"{entry.name}:1"
            if profile is not None:
                instances.append((index, profile, entry))
                binding[uuid] = SlurmGpu(gres=None, typed=typed, index=index)
            else:
                gpus.append(Gpu(uuid=uuid, index=index, model=entry.type or "GPU"))
                binding[uuid] = SlurmGpu(
                    gres=entry.spec if entry.count == 1 else None,
                    typed=typed,
                    index=index,
                    shards=shards,
                    shard=f"shard:{kind}" if kind else "shard",
                )
            index += 1
    groups: list[list[tuple[int, str, GresEntry]]] = []
    for instance in instances:
        used = sum(round(mig_weight(p) * MIG_SLICES) for _, p, _ in groups[-1]) if groups else 0
        if not groups or used + round(mig_weight(instance[1]) * MIG_SLICES) > MIG_SLICES:
            groups.append([])
        groups[-1].append(instance)
    for k, group in enumerate(groups):
        gpus.append(
            Gpu(
                uuid=f"slurm:{name}:mig{k}",
                index=group[0][0],
                model="MIG",
                mig=tuple(MigInstance(f"slurm:{name}:{i}", profile) for i, profile, _ in group),
            )
        )
    return sorted(gpus, key=lambda gpu: gpu.index), binding


@dataclass
class SlurmCluster:
    """The nodes and runtimes of every pool that names a Slurm partition."""

    nodes: list[Node] = field(default_factory=list)
    runtimes: dict[str, SlurmRuntime] = field(default_factory=dict)


def read_cluster(
    configs: Sequence[PartitionConfig],
    pools: Mapping[str, Any],
    settings: SlurmSettings,
    hub: str,
    runtime: type[SlurmRuntime] | None = None,
    protection_cap: float = 0.0,
) -> SlurmCluster:
    """Ask Slurm for each partition's nodes, CPUs, memory, GPUs and states; a partition,
    node or GRES that Slurm does not have, or a MaxTime below ``protection_cap`` (the
    longest protected time a session may get), is a SlurmConfigError naming the key."""
    cluster = SlurmCluster()
    details: dict[str, JobDetails] = {}  # one scontrol per round, whatever the partitions
    claimed: set[str] = set()
    """Slurm nodes an earlier pool has: a later pool's partition over them names them
    ``NODE@POOL`` (`spawner.runtime.foreign` counts each pool's sessions in the other's)."""
    for config in configs:
        partition = SlurmPartition(config.partition, settings, hub)
        partition.details = details.setdefault(
            config.gres,
            JobDetails(
                partition.command,
                hub,
                config.gres,
                settings.watch_interval,
                slurm_seconds(settings.time_limit),
            ),
        )
        try:
            record = partition.describe()
        except SlurmError as error:
            raise SlurmConfigError(
                f"{config.key}.partition",
                f"Slurm has no partition {config.partition!r} ({error})",
            ) from None
        preempt = record.get("PreemptMode", "OFF").upper()
        if preempt not in ("OFF", ""):
            raise SlurmConfigError(
                f"{config.key}.partition",
                f"partition {config.partition!r} has PreemptMode={preempt}; budgethub owns "
                "the partition and preempts itself: set PreemptMode=OFF there",
            )
        if READ_MAX_TIME:
            partition.max_time = max_time(config, record, protection_cap)
        partition.read_config()
        names = partition.node_names(record)
        for i, name in enumerate(config.nodes):
            if name not in names:
                raise SlurmConfigError(
                    f"{config.key}.nodes[{i}]",
                    f"Slurm partition {config.partition!r} has no node {name!r} "
                    f"(it has {', '.join(names) or 'none'})",
                )
        chosen = list(config.nodes) or names
        gpu_pool = getattr(pools[config.pool], "kind", None) is PoolKind.GPU
        any_gres = False
        for name in chosen:
            info = partition.node_info(name)
            if info is None:
                raise SlurmConfigError(config.key, f"Slurm does not describe node {name!r}")
            entries = [e for e in info.gres if e.name == config.gres]
            any_gres = any_gres or bool(entries)
            own = f"{name}@{config.pool}" if name in claimed else name
            claimed.add(name)
            gpus, binding = node_gpus(own, entries, info.gres) if gpu_pool else ([], {})
            # Ready as configured: Slurm's own state (down, drained) comes with the first
            # health check, and goes again when Slurm returns the node.
            cluster.nodes.append(
                Node(own, config.pool, info.cpus, info.memory_mib / 1024, tuple(gpus))
            )
            engine = EngineConfig(node=own, address=info.address, network="host")
            cluster.runtimes[own] = (runtime or SlurmRuntime)(engine, partition, binding, name)
        if gpu_pool and not any_gres:
            raise SlurmConfigError(
                f"{config.key}.gres",
                f"no node of Slurm partition {config.partition!r} has GRES {config.gres!r}",
            )
    return cluster
