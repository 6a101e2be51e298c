"""A real Slurm cluster for the tests: one ``slurmctld`` and a ``slurmd`` per node, each
node in a network namespace of its own, with fake GPUs.

Debian's daemons run under their own names (``/usr/sbin/slurmd``), or a node's ``Gres=``
is ignored. Each ``slurmd`` joins its namespace with ``nsenter --net`` and gets its
hostname from ``unshare --uts``: ``ip netns exec`` would remount ``/sys`` and slurmd then
fails on cgroups. The GPUs are character devices named in ``gres.conf``
(``AutoDetect=off``), one GRES type per GPU (``g0``, ``g1``) so a job can ask for one exact
GPU, as Slurm's own test suite fakes them. ``munged`` has a socket of its own
(``AuthInfo=socket=``), so nothing of this machine's Slurm or munge is touched.

Addresses: node ``i`` has a veth pair with a /30 (host side ``10.232.B.1``, namespace side
``10.232.B.2``, B from the xdist worker and ``i``), and a default route back to the host,
so every node reaches ``slurmctld`` on the first node's host-side address and the Hub
reaches each session at its node's address. No traffic leaves this machine.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the test cluster (not root, no Slurm, no namespaces)."""


def slurm_possible() -> str | None:
    """None when the cluster can run here; otherwise why not."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces, slurmd)"
    missing = [d for d in DAEMONS if not os.path.exists(d)]
    if missing:
        return f"missing {', '.join(missing)}: apt-get install {' '.join(SLURM_PACKAGES)}"
    for tool in ("ip", "nsenter", "unshare", "sbatch", "scontrol"):
        if shutil.which(tool) is None:
            return f"the {tool} command is needed"
    return None


def sudoers(name: str, hub: str, accounts: Iterable[str], conf: Path, log: Path) -> Path:
    """``/etc/sudoers.d/NAME``: ``hub`` may run ``sbatch`` and ``scancel`` (through
    ``env SLURM_CONF=conf``, as the Hub's ``slurm_exec_prefix`` does) as each account and
    nothing else, without a password; sudo logs each command to ``log``. Checked with
    ``visudo -c`` before it is put in place; the caller removes it."""
    runas = ",".join(accounts)
    commands = ", ".join(
        f"/usr/bin/env SLURM_CONF={conf} /usr/bin/{command} *" for command in ("sbatch", "scancel")
    )
    text = f"Defaults:{hub} logfile={log}, loglinelen=0\n{hub} ALL=({runas}) NOPASSWD: {commands}\n"
    target = Path("/etc/sudoers.d") / name
    draft = target.with_name(f".{name}")
    draft.write_text(text)
    os.chmod(draft, 0o440)
    checked = subprocess.run(["visudo", "-cf", str(draft)], capture_output=True, text=True)
    if checked.returncode != 0:
        draft.unlink()
        raise SlurmUnavailable(f"visudo refused the drop-in: {checked.stdout}{checked.stderr}")
    draft.rename(target)
    return target


def _worker() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = "".join(c for c in name if c.isdigit())
    return int(digits) if digits else 0


@dataclass
class SlurmNode:
    name: str
    gpus: int
    cpus: int = 4
    memory_mib: int = 8192
    address: str = ""
    host_address: str = ""
    netns: str = ""
    veth: str = ""
    slurmd: subprocess.Popen[bytes] | None = None
    mig: tuple[str, ...] = ()
    """MIG instances beside the whole GPUs, by type (``1g.10gb``), as AutoDetect=nvml
    declares a GPU in MIG mode: each a GRES ``gpu`` of that type with a device of its own."""


@dataclass
class SlurmCluster:
    """``start`` it, hand ``env`` (``SLURM_CONF``) to whoever runs Slurm's commands, and
    ``stop`` it; ``stop`` also ends every job's processes in the namespaces."""

    root: Path
    nodes: list[SlurmNode]
    partition: str = "gpu"
    port: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gpu_model: str = ""
    """"": one GRES type per GPU (``gpu:g0:1,gpu:g1:1``); a model name: Slurm's standard
    form, every GPU of the node one type (``gpu:fake:2``), as AutoDetect declares them."""
    shards: int = 0
    """``gres/shard`` units per GPU (0: none), for fractions of a GPU."""
    accounts: dict[str, list[str]] = field(default_factory=dict)
    """Slurm account → its users: with any, ``slurmdbd`` keeps the accounting in a MariaDB
    database of its own (``mysql_url``), with ``AccountingStorageEnforce=associations``."""
    mysql: tuple[str, int] = ("127.0.0.1", 3306)
    """Where MariaDB listens (its ``root`` user, no password, makes the database)."""
    cgroup: tuple[str, ...] = ()
    """cgroup.conf lines (with ``TaskPlugin=task/cgroup`` in ``extra``); none: no file."""
    extra: tuple[str, ...] = ()
    """More slurm.conf lines (KillWait, an Epilog, TaskPlugin ...), each in place of the
    default line of its key."""
    more_partitions: tuple[str, ...] = ()
    """Partitions over the same nodes as ``partition`` (overlapping partitions)."""

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def controller(self) -> str:
        return self.nodes[0].host_address

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        """One of Slurm's commands against this cluster; its output."""
        done = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    # -- start -----------------------------------------------------------------

    def start(self) -> None:
        why = slurm_possible()
        if why:
            raise SlurmUnavailable(why)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        worker = _worker()
        self.port = 6900 + 10 * worker
        for i, node in enumerate(self.nodes):
            block = 4 * (8 * worker + i)
            node.netns = f"bhslurm{worker}-{node.name}"
            node.veth = f"bhs{worker}x{i}"
            node.host_address = f"10.232.{block // 256}.{block % 256 + 1}"
            node.address = f"10.232.{block // 256}.{block % 256 + 2}"
            self._netns(node)
        self._munge()
        self._config()
        if self.accounts:
            self._slurmdbd()
        ctl = self._spawn(
            [
                "unshare",
                "--uts",
                "sh",
                "-c",
                'hostname bhctl && exec "$@"',
                "-",
                "/usr/sbin/slurmctld",
                "-D",
                "-i",
                "-f",
                str(self.conf),
            ],
            "slurmctld.out",
        )
        self.procs.append(ctl)
        self._wait(lambda: self.run("scontrol", "ping", check=False).count("UP") > 0, "slurmctld")
        if self.accounts:
            self._associations()
        for node in self.nodes:
            self.start_slurmd(node)
        self.wait_idle()

    def _netns(self, node: SlurmNode) -> None:
        self._drop_netns(node)
        steps = [
            ["ip", "netns", "add", node.netns],
            [
                "ip",
                "link",
                "add",
                node.veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                node.netns,
            ],
            ["ip", "addr", "add", f"{node.host_address}/30", "dev", node.veth],
            ["ip", "link", "set", node.veth, "up"],
            ["ip", "-n", node.netns, "addr", "add", f"{node.address}/30", "dev", "eth0"],
            ["ip", "-n", node.netns, "link", "set", "eth0", "up"],
            ["ip", "-n", node.netns, "link", "set", "lo", "up"],
            ["ip", "-n", node.netns, "route", "add", "default", "via", node.host_address],
        ]
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=30)

    def _drop_netns(self, node: SlurmNode) -> None:
        subprocess.run(["ip", "link", "del", node.veth], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", node.netns], capture_output=True, timeout=30)

    def _munge(self) -> None:
        key = self.root / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        self.procs.append(
            self._spawn(
                [
                    "/usr/sbin/munged",
                    "-F",
                    "--force",
                    f"--socket={self.root / 'munge.sock'}",
                    f"--key-file={key}",
                    f"--log-file={self.root / 'munged.log'}",
                    f"--pid-file={self.root / 'munged.pid'}",
                    f"--seed-file={self.root / 'munged.seed'}",
                ],
                "munged.out",
            )
        )
        self._wait(lambda: (self.root / "munge.sock").exists(), "munged")

    def _config(self) -> None:
        dev = self.root / "dev"
        lines = [
            "ClusterName=bhtest",
            f"SlurmctldHost=bhctl({self.controller})",
            f"SlurmctldPort={self.port}",
            f"SlurmdPort={self.port + 1}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.root / 'munge.sock'}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd'}-%n.pid",
            f"SlurmctldLogFile={self.root / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'slurmd'}-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SlurmdParameters=config_overrides",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            "GresTypes=gpu,shard" if self.shards else "GresTypes=gpu",
            "PreemptType=preempt/none",
            "PreemptMode=OFF",
            "SchedulerType=sched/backfill",
            "SlurmdTimeout=20",
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=600",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            *(
                [
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    f"AccountingStorageHost={self.controller}",
                    f"AccountingStoragePort={self.port + 2}",
                    "AccountingStorageEnforce=associations",
                    # The munge socket of slurmdbd's connections (not AuthInfo's).
                    f"AccountingStoragePass={self.root / 'munge.sock'}",
                ]
                if self.accounts
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
        ]
        gres = ["AutoDetect=off"]
        for node in self.nodes:
            lines.append(
                f"NodeName={node.name} NodeAddr={node.address} NodeHostname={node.name} "
                f"CPUs={node.cpus} RealMemory={node.memory_mib}"
                + (f" Gres={self.node_gres(node)}" if node.gpus else "")
                + " State=UNKNOWN"
            )
            gres.extend(self._gres_lines(node, dev / node.name))
        names = ",".join(n.name for n in self.nodes)
        lines.append(
            f"PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE "
            "State=UP PreemptMode=OFF OverSubscribe=NO"
        )
        for name in self.more_partitions:
            lines.append(
                f"PartitionName={name} Nodes={names} Default=NO MaxTime=INFINITE State=UP "
                "PreemptMode=OFF OverSubscribe=NO"
            )
        replaced = {line.split("=", 1)[0] for line in self.extra}
        lines = [line for line in lines if line.split("=", 1)[0] not in replaced]
        lines.extend(self.extra)
        self.conf.write_text("\n".join(line for line in lines if line) + "\n")
        (self.root / "gres.conf").write_text("\n".join(gres) + "\n")
        if self.cgroup:
            (self.root / "cgroup.conf").write_text("\n".join(self.cgroup) + "\n")
        (self.root / "state").mkdir(exist_ok=True)
        for node in self.nodes:
            (self.root / "spool" / node.name).mkdir(parents=True, exist_ok=True)

    def node_gres(self, node: SlurmNode) -> str:
        """The node's ``Gres=`` in slurm.conf."""
        if self.gpu_model:
            found = f"gpu:{self.gpu_model}:{node.gpus}"
        else:
            found = ",".join(f"gpu:g{g}:1" for g in range(node.gpus))
        for kind in dict.fromkeys(node.mig):
            found += f",gpu:{kind}:{node.mig.count(kind)}"
        if self.shards:
            found += f",shard:{self.gpu_model or 'g'}:{self.shards * node.gpus}"
        return found

    def _gres_lines(self, node: SlurmNode, dev: Path) -> list[str]:
        """gres.conf for the node's fake GPUs (character devices, major 195 as NVIDIA's)."""
        dev.mkdir(parents=True, exist_ok=True)
        devices = []
        for g in range(node.gpus):
            device = dev / f"nvidia{g}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(195, g))
            devices.append(device)
        found = []
        for g, device in enumerate(devices):
            kind = self.gpu_model or f"g{g}"
            found.append(f"NodeName={node.name} Name=gpu Type={kind} File={device}")
            if self.shards:
                found.append(
                    f"NodeName={node.name} Name=shard Type={self.gpu_model or 'g'} "
                    f"Count={self.shards} File={device}"
                )
        for m, kind in enumerate(node.mig):  # as nvidia-caps devices stand for instances
            device = dev / f"nvidia-cap{m + 1}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(237, m + 1))
            found.append(f"NodeName={node.name} Name=gpu Type={kind} File={device}")
        return found

    @property
    def database(self) -> str:
        return f"bhslurm_acct_{_worker()}"

    def _slurmdbd(self) -> None:
        """slurmdbd on the controller's address, over a fresh MariaDB database."""
        host, port = self.mysql
        if not os.path.exists("/usr/sbin/slurmdbd"):
            raise SlurmUnavailable("missing /usr/sbin/slurmdbd: apt-get install slurmdbd")
        reached = subprocess.run(
            ["mysql", "-h", host, "-P", str(port), "-u", "root", "-e", "SELECT 1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if reached.returncode != 0:
            raise SlurmUnavailable(
                f"slurmdbd needs MariaDB at {host}:{port} (user root, no password): "
                f"{reached.stderr.strip() or 'mysql failed'}"
            )
        subprocess.run(
            [
                "mysql",
                "-h",
                host,
                "-P",
                str(port),
                "-u",
                "root",
                "-e",
                f"DROP DATABASE IF EXISTS {self.database}; CREATE DATABASE {self.database}",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        conf = self.root / "slurmdbd.conf"
        conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.root / 'munge.sock'}",
                    "DbdHost=bhctl",
                    f"DbdAddr={self.controller}",
                    f"DbdPort={self.port + 2}",
                    "SlurmUser=root",
                    f"PidFile={self.root / 'slurmdbd.pid'}",
                    f"LogFile={self.root / 'slurmdbd.log'}",
                    "StorageType=accounting_storage/mysql",
                    f"StorageHost={host}",
                    f"StoragePort={port}",
                    "StorageUser=root",
                    f"StorageLoc={self.database}",
                ]
            )
            + "\n"
        )
        os.chmod(conf, 0o600)
        self.procs.append(  # under the controller's host name, which DbdHost names
            self._spawn(
                ["unshare", "--uts", "sh", "-c", 'hostname bhctl && exec "$@"', "-"]
                + ["/usr/sbin/slurmdbd", "-D"],
                "slurmdbd.out",
            )
        )
        self._wait(
            lambda: (
                subprocess.run(
                    ["sacctmgr", "-n", "list", "cluster"],
                    env=self.env,
                    capture_output=True,
                    timeout=10,
                ).returncode
                == 0
            ),
            "slurmdbd",
        )

    def _associations(self) -> None:
        """The cluster, its accounts and their users in slurmdbd (root under ``root``)."""
        self._wait(
            lambda: (
                "bhtest"
                in self.run("sacctmgr", "-n", "-p", "list", "cluster", check=False, timeout=10)
            ),
            "slurmctld to register with slurmdbd",
        )
        for account, users in self.accounts.items():
            self.run("sacctmgr", "-i", "add", "account", account, "cluster=bhtest", check=False)
            for user in users:
                self.run(
                    "sacctmgr",
                    "-i",
                    "add",
                    "user",
                    user,
                    f"account={account}",
                    "cluster=bhtest",
                    check=False,
                )

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(self.root / log, "ab") as out:  # the daemon keeps its own copy
            return subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )

    def start_slurmd(self, node: SlurmNode) -> None:
        """(Re)start a node's slurmd in its namespace, under its own hostname."""
        node.slurmd = self._spawn(
            [
                "nsenter",
                f"--net=/run/netns/{node.netns}",
                "unshare",
                "--uts",
                "sh",
                "-c",
                f'hostname {node.name} && exec "$@"',
                "-",
                "/usr/sbin/slurmd",
                "-D",
                "-N",
                node.name,
                "-f",
                str(self.conf),
            ],
            f"slurmd-{node.name}.out",
        )

    def kill_slurmd(self, node: SlurmNode) -> None:
        """SIGKILL a node's slurmd (its jobs' processes are left to ``stop``)."""
        if node.slurmd is not None:
            os.killpg(node.slurmd.pid, signal.SIGKILL)
            node.slurmd.wait(timeout=30)
            node.slurmd = None

    def _wait(
        self,
        ready: Callable[[], bool],
        what: str,
        timeout: float = 60,
        detail: Callable[[], str] = lambda: "",
    ) -> None:
        """Until ``ready()``; past ``timeout``, an error with what Slurm shows (its nodes,
        its jobs, ``detail()``) and the ends of the daemons' logs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.3)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.root.glob("*.log"))
        )
        seen = self.run("sinfo", "-h", "-N", "-o", "%N %T %E", check=False)
        seen += self.run("squeue", "-h", "-a", "-t", "all", "-o", "%i %j %T %N %r", check=False)
        raise SlurmUnavailable(f"{what} did not come up in {timeout:g} s\n{seen}{detail()}\n{logs}")

    def node_state(self, name: str) -> str:
        """The node's state as ``sinfo`` names it ("idle", "mixed", "drained" ...), read
        from a listing of every node: slurmctld 22.05 answers a one-node query (``sinfo
        -n``) with the allocations as of its last full listing, so a node whose jobs
        have ended reads "mixed" until something lists them all."""
        for line in self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).splitlines():
            node, _, state = line.partition(" ")
            if node == name:
                return state.strip()
        return ""

    def wait_idle(self, timeout: float = 60) -> None:
        """Until every node is idle in Slurm's view; past ``timeout``, the error shows
        ``scontrol show node`` of each node that was not."""
        busy: dict[str, str] = {}

        def idle() -> bool:
            states = {n.name: self.node_state(n.name) for n in self.nodes}
            busy.clear()
            busy.update((name, state) for name, state in states.items() if state != "idle")
            return not busy

        def detail() -> str:
            return f"last seen not idle: {busy}\n" + "".join(
                self.run("scontrol", "show", "node", name, check=False) for name in busy
            )

        self._wait(idle, "idle slurmd nodes", timeout, detail)

    def jobs(self) -> list[dict[str, str]]:
        """Every job Slurm knows now (``squeue``): id, name, state, node, comment."""
        out = self.run("squeue", "-h", "-a", "-t", "all", "-o", "%i|%j|%T|%N|%k")
        rows = []
        for line in out.splitlines():
            job, name, state, node, comment = line.split("|", 4)
            rows.append({"id": job, "name": name, "state": state, "node": node, "comment": comment})
        return rows

    def job_detail(self, job: str) -> str:
        return self.run("scontrol", "show", "-d", "job", job)

    # -- stop ------------------------------------------------------------------

    def stop(self) -> None:
        for node in self.nodes:
            self._kill_netns_procs(node)
            if node.slurmd is not None:
                self.kill_slurmd(node)
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for node in self.nodes:
            self._kill_netns_procs(node)
            self._drop_netns(node)

    def _kill_netns_procs(self, node: SlurmNode) -> None:
        """Every process in the node's namespace: slurmd, slurmstepd and the sessions."""
        found = subprocess.run(
            ["ip", "netns", "pids", node.netns], capture_output=True, text=True, timeout=30
        )
        for pid in found.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
