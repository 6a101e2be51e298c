"""The embedded scheduler's configuration: every ``c.BudgetScheduler`` trait, and the
cluster it declares, parsed once into the core's frozen objects.

The traits live on a base class of `BudgetScheduler` (traitlets reads a class's
config under each of its classes' names), so the facade in embedded.py holds no
trait definitions and this module holds nothing but configuration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from traitlets import (
    Bool,
    Callable,
    Dict,
    Float,
    Integer,
    List,
    Tuple,
    Type,
    Unicode,
    Union,
    default,
)
from traitlets.config import SingletonConfigurable

from scheduler_core.errors import InputError
from scheduler_core.model import Gpu, Node, Pool, Team, frozen_labels
from scheduler_core.scenario import parse_node_list, parse_pools, parse_teams
from scheduler_core.settings import (
    BOUNDS,
    SETTING_NAMES,
    SettingError,
    Settings,
    bound_fault,
    settings_from_mapping,
)
from scheduler_core.teams import share_fault
from spawner.runtime.dockernodes import EngineConfig, NodeBackend
from spawner.runtime.interface import Runtime
from spawner.runtime.inventory import InventoryError, nvml_gpus
from spawner.runtime.slurm import (
    SlurmConfigError,
    SlurmError,
    SlurmRuntime,
    SlurmSettings,
    parse_accounts,
    parse_home,
    parse_partitions,
    read_cluster,
)
from spawner.runtime.spec import DEFAULT_HUB

ENGINE_KEYS = frozenset({"engine", "tls", "address", "network", "storage"})
"""Keys of ``c.BudgetScheduler.nodes`` that only the Hub knows: how to reach each engine."""


class ConfigError(ValueError):
    """A ``c.BudgetScheduler`` setting that cannot work: ``key`` names it."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"c.BudgetScheduler.{key}: {reason}")


@dataclass(frozen=True)
class Cluster:
    """What the configuration declares, as the core's objects."""

    settings: Settings
    pools: Mapping[str, Pool]
    teams: tuple[Team, ...]
    nodes: tuple[Node, ...]
    engines: Mapping[str, EngineConfig]
    runtimes: Mapping[str, Runtime] = field(default_factory=dict)
    """Every node's runtime by name: its Docker engine (docker_runtime_class) or Slurm."""


def parse_nodes(
    raw: list[Any], pools: Mapping[str, Pool], nvml: Any = None, *, others: bool = False
) -> tuple[list[Node], dict[str, EngineConfig]]:
    """Nodes and their engines from ``c.BudgetScheduler.nodes``; ConfigError names a bad key.

    The scenario format's node parser (the same defaults and errors), plus each
    node's engine; ``gpus`` may also be ``"nvml"``, to read this machine's GPUs."""

    def read_gpus(value: str, where: str) -> tuple[Gpu, ...]:
        if value != "nvml":
            raise InputError(where, f"must be a count or 'nvml', not {value!r}")
        try:
            return tuple(nvml_gpus(nvml))
        except InventoryError as error:
            raise InputError(where, str(error)) from None

    try:
        parsed = parse_node_list(raw, pools, extra_keys=ENGINE_KEYS, read_gpus=read_gpus)
        if not parsed and not others:
            raise InputError("nodes", "declares no node")
        nodes: list[Node] = []
        engines: dict[str, EngineConfig] = {}
        for i, (node, item) in enumerate(parsed):
            storage = item.get("storage", {})
            tls = item.get("tls", {})
            for key, value in (("storage", storage), ("tls", tls)):
                if not isinstance(value, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()
                ):
                    raise InputError(f"nodes[{i}].{key}", "must map names to paths")
            if storage and "storage" not in node.labels:
                labels = {**node.labels, "storage": next(iter(storage))}
                node = replace(node, labels=frozen_labels(labels))
            nodes.append(node)
            engines[node.name] = EngineConfig(
                node=node.name,
                url=item.get("engine"),
                tls=dict(tls),
                address=item.get("address", "127.0.0.1"),
                network=item.get("network", "host"),
                storage=dict(storage),
                nvidia=item.get("gpus") == "nvml",
            )
    except InputError as error:
        raise ConfigError(error.where, error.reason) from None
    return nodes, engines


def parse_team_list(raw: list[Any], pools: Mapping[str, Pool]) -> list[Team]:
    """Teams from ``c.BudgetScheduler.teams``: parsed as a scenario's, and every share 0 or
    from 0.001 to 1, as an admin may set it (scheduler_core.teams.share_fault).

    ConfigError names the team as an admin's refusal does: ``teams.vision.share`` (one
    share for every pool) or ``teams.vision.share.gpu``."""

    def by_name(where: str) -> str:
        def name(match: re.Match[str]) -> str:
            i = int(match.group(1))
            item = raw[i] if i < len(raw) else None
            found = item.get("name") if isinstance(item, Mapping) else None
            return f"teams.{found}" if isinstance(found, str) else match.group(0)

        return re.sub(r"^teams\[(\d+)\]", name, where)

    try:
        teams = parse_teams(raw, pools)
    except InputError as error:
        raise ConfigError(by_name(error.where), error.reason) from None
    for item, team in zip(raw, teams, strict=True):
        share = item.get("share", 0.0)
        pairs = share.items() if isinstance(share, Mapping) else [("", share)]
        for pool, value in pairs:
            reason = share_fault(value)
            if reason is not None:
                where = f"teams.{team.name}.share" + (f".{pool}" if pool else "")
                raise ConfigError(where, reason)
    return teams


class SchedulerConfig(SingletonConfigurable):
    """The settings of the budget scheduler embedded in the Hub (``c.BudgetScheduler``)."""

    # -- the core's settings (rule IDs: docs/architecture.md), one trait each ----

    policy = Unicode("budget", help="Policy by name (`budget`, or a registered baseline).").tag(
        config=True
    )
    lookback = Float(7 * 86400.0, help="Sliding window of charged usage, seconds.").tag(config=True)
    max_min_runtime = Float(
        8 * 3600.0, help="Cap on any session's minimum runtime (protected time), seconds."
    ).tag(config=True)
    default_min_runtime = Float(
        3600.0, help="Minimum runtime of a session whose profile names none, seconds."
    ).tag(config=True)
    debug_min_runtime = Float(
        900.0, help="Cap on a debug session's minimum runtime, seconds (S1)."
    ).tag(config=True)
    debug_max_gpus = Integer(2, help="Most GPUs a debug session may hold.").tag(config=True)
    unallocated_grace = Float(
        60.0, help="Seconds an unallocated session runs before it may be preempted (R4)."
    ).tag(config=True)
    cycle_tick = Float(30.0, help="Seconds between periodic scheduling cycles.").tag(config=True)
    budget_recheck = Float(
        300.0, help="Seconds after which a periodic cycle weighs the whole queue again."
    ).tag(config=True)
    starvation_bound = Float(
        7200.0, help="Seconds a funded request waits before it holds nodes (R7)."
    ).tag(config=True)
    max_reservations_per_pool = Integer(
        1, help="Most holds (nodes held for one starving request) at once in a pool (R7)."
    ).tag(config=True)
    guaranteed_share = Float(
        1.0,
        help="""A session is funded, whatever the team's budget over the window, while the
        team's funded sessions in the pool stay within this multiple of its share (R2); a job
        larger than that runs in day slices (S5). 0: off, and no day slices.""",
    ).tag(config=True)
    funded_burst = Float(
        1.25,
        help="""The window budget funds a team's sessions up to this multiple of its share
        of the pool at once; beyond, they run unallocated (R2; 0: no cap).""",
    ).tag(config=True)
    day_rank_weight = Float(
        0.3,
        help="""Weight, from 0 to 1, of a team's last day in its rank against other teams
        (who goes first, and whose work past protection a request may stop); the rest is
        its ratio over the window (R1, R4). Funding keeps the window alone (0: the window
        alone).""",
    ).tag(config=True)
    placement = Unicode("best-fit", help="best-fit, worst-fit or first-fit (R3).").tag(config=True)
    idle_release = Float(
        0.0,
        help="""Seconds a funded session must be idle (no kernel busy, no activity), past its
        protected window, before a funded request of any team may snapshot and release it
        (R4; 0: never). Idle sessions are always the first victims.""",
    ).tag(config=True)
    own_slice_after = Float(
        7200.0,
        help="""Seconds a job larger than its team's share must wait beside other funded
        work of its team before it is funded from the team's day and may stop that work
        and other resumable work (the team time-slices itself, S6; 0: never).""",
    ).tag(config=True)
    policy_settings: Dict[str, Any] = Dict(
        help="""Settings of the policy that have no trait of their own (e.g. a baseline's),
        by their scenario names: {'fairshare_half_life': '7d'}."""
    ).tag(config=True)

    # -- the cluster -------------------------------------------------------------

    store_url = Unicode(
        "sqlite:///budgethub.sqlite",
        help="SQLAlchemy URL of the store: SQLite (default) or postgresql+psycopg://…",
    ).tag(config=True)
    pools = List(
        [{"name": "gpu", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"}],
        help="Pools: [{'name': 'h100', 'kind': 'gpu'}, …], as in a scenario file.",
    ).tag(config=True)
    teams: List[dict[str, Any]] = List(
        help="""Teams (JupyterHub groups) and their allocations, seeded into the store:
        [{'name': 'nlp', 'share': {'h100': 0.5}}, {'name': 'olmo', 'parent': 'nlp',
        'share': 0.5}]. A team's members are the members of the group of that name."""
    ).tag(config=True)
    nodes: List[dict[str, Any]] = List(
        help="""Nodes: [{'name', 'pool', 'engine': 'unix:///…' or 'tcp://…' (None: local),
        'tls': {'ca', 'cert', 'key'}, 'address': where sessions answer, 'cpus',
        'memory_gib', 'labels', 'storage': {name: path on the node}, 'gpus': count of
        virtual GPUs or 'nvml', 'gpu_model', 'mig': {index: [profiles]}}]"""
    ).tag(config=True)

    # -- Slurm (docs/slurm.md) -----------------------------------------------------

    slurm_partitions: Dict[str, Any] = Dict(
        help="""Pools whose nodes, GPUs and sessions are a Slurm partition's: {'gpu': 'gpu'} or
        {'gpu': {'partition': 'gpu', 'gres': 'gpu', 'nodes': ['n1', 'n2']}}. Their nodes are
        read from Slurm (not listed in ``nodes``) and each session is a job pinned to the
        node and GPUs the scheduler chose. Slurm preemption must be off in the partition."""
    ).tag(config=True)
    slurm_conf = Unicode(
        "", help="SLURM_CONF for Slurm's commands run by the Hub (empty: Slurm's default)."
    ).tag(config=True)
    slurm_bin_dir = Unicode(
        "", help="Directory of sbatch, squeue, scancel and scontrol (empty: on PATH)."
    ).tag(config=True)
    slurm_session_env = Unicode(
        "/opt/budgethub/session-env",
        help="""Prefix, on every node of the partition, of the session environment that
        ``images/session-env PREFIX`` makes (the session image's software in a venv).""",
    ).tag(config=True)
    slurm_command_prefix = List(
        Unicode(),
        help="""Words put before the session's command in its job, e.g. a container
        runtime: ['apptainer', 'exec', '--bind', '/shared', '/shared/session.sif'].""",
    ).tag(config=True)
    slurm_time_limit = Unicode(
        "7-00:00:00", help="Time limit of a session's job (sbatch --time)."
    ).tag(config=True)
    slurm_pending_timeout = Float(
        30.0,
        help="""Seconds a session's job may stay pending before it is cancelled and counts as
        a failed start (with Slurm's reason); it waits again, up to ``launch_attempts``.""",
    ).tag(config=True)
    slurm_accounts: Dict[str, Any] = Dict(
        help="""Team -> Slurm account of its sessions' jobs (sbatch --account), so that
        sacct shows each session under its team's account; a team not listed uses its own
        name. The accounts must exist where Slurm enforces associations."""
    ).tag(config=True)
    slurm_qos = Unicode(
        "", help="QOS of every session's job (sbatch --qos; empty: the account's default)."
    ).tag(config=True)
    slurm_users = Union(
        [Unicode(), Dict(), Callable()],
        default_value="{user}",
        help="""The Unix account each Hub user's Slurm jobs run as: a template ("{user}",
        the default: the same name), a map (Hub user -> account; others keep their name),
        a callable (user -> account), or "" for one account for everyone (uid 1000, the
        images' session user). A user with no such account is refused
        with a message saying so.""",
    ).tag(config=True)
    slurm_exec_prefix = List(
        Unicode(),
        help="""Words before sbatch and scancel, to run them as the user's account when
        the Hub is not root, as batchspawner's exec_prefix: ['sudo', '-n', '-u',
        '{account}'] (sudoers must let the Hub run sbatch and scancel so). Empty: a root
        Hub submits with sbatch --uid/--gid.""",
    ).tag(config=True)
    slurm_home = Unicode(
        "",
        help="""A Slurm session's home as a path template: "/home/{account}" runs each
        session in its user's own Unix account's home ({account}: slurm_users' account,
        {user}: the Hub user), owned by that account. Empty: home_root/<hub>/<user>.""",
    ).tag(config=True)
    slurm_runtime_class = Type(
        SlurmRuntime, help="The runtime of Slurm nodes (a site may subclass it)."
    ).tag(config=True)
    docker_runtime_class = Type(
        NodeBackend, help="The runtime of nodes with a Docker engine (a site may subclass it)."
    ).tag(config=True)

    # -- sessions ----------------------------------------------------------------

    max_queue_wait = Float(
        8 * 3600.0, help="A spawn that waits longer than this in the queue ends, with a message."
    ).tag(config=True)
    launch_timeout = Float(120.0, help="Seconds from grant to a session whose server answers.").tag(
        config=True
    )
    launch_attempts = Integer(
        3,
        min=1,
        help="""Starts a granted session gets: a start that fails (a bad image,
        an engine error, a server that never answers) hands its slices back and waits again
        at its old place in the queue, until this many have failed; then the spawn ends
        with a message naming the node and the reason.""",
    ).tag(config=True)
    claim_timeout = Float(
        120.0,
        help="""Seconds a grant waits for its spawner (after a Hub restart, queued spawns are
        started again through the Hub; a grant nobody claims is handed back).""",
    ).tag(config=True)
    health_interval = Float(10.0, help="Seconds between engine health checks.").tag(config=True)
    port_range = Tuple(
        Integer(),
        Integer(),
        default_value=(61000, 61999),
        help="""Ports for sessions on host networking; above Linux's ephemeral range
        (32768-60999), so no outgoing connection on the node takes one first.""",
    ).tag(config=True)
    hub_api_token = Unicode(
        help="""Token of the `budgethub` service (scopes: servers, read:users), used to stop
        preempted servers and restart queued spawns through the Hub. Set by
        `spawner.hubconfig.configure_hub`."""
    ).tag(config=True)
    hub_name = Unicode(
        DEFAULT_HUB,
        help="""Names and labels every session this Hub starts (containers, Slurm jobs);
        Hubs sharing an engine need different names, and never touch each other's
        sessions.""",
    ).tag(config=True)
    ping_timeout = Float(
        5.0, help="Seconds a health ping waits for an engine before the node is unreachable."
    ).tag(config=True)
    node_down_grace = Float(
        120.0,
        help="""Seconds an unreachable node (an engine that stopped answering in time, e.g.
        frozen or cut off) keeps its sessions before it is declared down and they are
        released. An engine that refuses connections is down at once.""",
    ).tag(config=True)
    engine_timeout = Float(
        10.0,
        help="""Seconds a stop or a poll waits for a node's engine; past it the Hub goes on
        (a container left behind is removed when its node answers again).""",
    ).tag(config=True)
    watch_events = Bool(
        True,
        help="""Follow each engine's container events, so a session whose container ends by
        itself gives its slices back within seconds (without it, at the Hub's next poll of
        the server, every ``c.Spawner.poll_interval``).""",
    ).tag(config=True)
    start_retry = Float(
        30.0,
        help="""When the scheduler cannot start (its store unreadable, say), the Hub keeps
        running sessions, refuses new spawns with the reason, and tries again this often.""",
    ).tag(config=True)

    # -- homes and snapshots (docs/snapshots.md) ---------------------------------

    home_root = Unicode(
        "",
        help="""Host path under which each user's whole home lives, bind-mounted at
        /home/jovyan: ``{home_root}/{hub_name}/{user}`` (made 1000:100, 0700). Put it on
        storage every node reaches, so a session (and its restore) starts on any node.
        Empty: the user's named volume on each node, at /home/jovyan.""",
    ).tag(config=True)
    snapshot_root = Unicode(
        "",
        help="""Host path of the snapshot store (on storage every node reaches):
        ``{snapshot_root}/{hub_name}/{user}/{server}/{key}/``. Empty: ``snapshots`` beside
        ``home_root`` (or in the Hub's directory when that is empty too).""",
    ).tag(config=True)
    snapshots = Bool(
        True,
        help="""Snapshot a preempted session (its kernels' state, through the agent in the
        image) and restore it on its next start.""",
    ).tag(config=True)
    snapshot_keep = Integer(
        3, min=1, help="Snapshots kept per server; older ones are deleted."
    ).tag(config=True)
    snapshot_grace = Float(
        20.0,
        help="""Seconds a preempted session's agent gets to checkpoint its kernels; a kernel
        still busy then keeps the state of its last finished cell.""",
    ).tag(config=True)
    idle_poll = Float(
        60.0,
        help="""Seconds between asks of each session's agent whether its kernels are busy;
        idle sessions are the first victims (0: never ask).""",
    ).tag(config=True)

    @default("teams")
    def _default_teams(self) -> list[dict[str, Any]]:
        return []

    def core_settings(self) -> Settings:
        """The core's frozen settings from the traits; ConfigError names a bad one."""
        values = {key: getattr(self, key) for key in SETTING_NAMES if self.has_trait(key)}
        values.update(self.policy_settings)
        values["name"] = self.policy
        try:
            settings = settings_from_mapping(values)
        except SettingError as error:
            raise ConfigError(error.key, error.reason) from None
        for key in BOUNDS:  # the bounds an admin's change has too (spawner/admin.py)
            reason = bound_fault(key, getattr(settings, key))
            if reason is not None:
                raise ConfigError(key, reason)
        return settings

    def cluster(self) -> Cluster:
        """Pools, teams, nodes and engines as declared (no I/O but NVML)."""
        settings = self.core_settings()
        try:
            pools = parse_pools(self.pools)
        except InputError as error:
            raise ConfigError(error.where, error.reason) from None
        teams = parse_team_list(self.teams, pools)
        nodes, engines = parse_nodes(self.nodes, pools, others=bool(self.slurm_partitions))
        slurm_nodes, runtimes = self._slurm(pools)
        for i, node in enumerate(nodes):
            if node.pool in self._slurm_pools:
                raise ConfigError(
                    f"nodes[{i}].pool",
                    f"pool {node.pool!r} takes its nodes from Slurm (slurm_partitions); "
                    "do not list them in nodes",
                )
        ping = self.ping_timeout
        for name, engine in engines.items():
            runtimes[name] = self.docker_runtime_class(engine, ping_timeout=ping)
        return Cluster(settings, pools, tuple(teams), (*nodes, *slurm_nodes), engines, runtimes)

    _slurm_pools: frozenset[str] = frozenset()
    _slurm_read: tuple[list[Node], dict[str, Runtime]] | None = None

    def _slurm(self, pools: Mapping[str, Pool]) -> tuple[list[Node], dict[str, Runtime]]:
        """The nodes and runtimes of the pools on Slurm, read from Slurm once."""
        if not self.slurm_partitions:
            return [], {}
        if self._slurm_read is None:
            try:
                configs = parse_partitions(self.slurm_partitions, pools)
                if not self.home_root:
                    raise SlurmConfigError(
                        "home_root",
                        "must be set when a pool runs on Slurm (slurm_partitions): a session's "
                        "home must be on storage every node of the partition mounts",
                    )
                settings = SlurmSettings(
                    conf=self.slurm_conf,
                    bin_dir=self.slurm_bin_dir,
                    session_env=self.slurm_session_env,
                    command_prefix=tuple(self.slurm_command_prefix),
                    time_limit=self.slurm_time_limit,
                    pending_timeout=self.slurm_pending_timeout,
                    timeout=self.engine_timeout,
                    accounts=parse_accounts(self.slurm_accounts),
                    qos=self.slurm_qos,
                    users=self.slurm_users,
                    exec_prefix=tuple(self.slurm_exec_prefix),
                    home=parse_home(self.slurm_home),
                )
                read = read_cluster(
                    configs,
                    pools,
                    settings,
                    self.hub_name,
                    runtime=self.slurm_runtime_class,
                    protection_cap=self.core_settings().max_min_runtime,
                )
            except SlurmConfigError as error:
                raise ConfigError(error.key, error.reason) from None
            except SlurmError as error:
                raise ConfigError("slurm_conf", f"Slurm does not answer: {error}") from None
            self._slurm_pools = frozenset(c.pool for c in configs)
            self._slurm_read = (read.nodes, dict(read.runtimes))
        nodes, runtimes = self._slurm_read
        return list(nodes), dict(runtimes)
