"""The embedded scheduler: one per Hub process, between the spawners and the core.

It owns a `scheduler_core.Scheduler` (wall clock; this object is its actuator),
the store, and the nodes' engines. Spawners submit requests and await grants;
cycles run on every submit, stop and node change and on a tick, on the Hub's
event loop (a cycle is milliseconds; Docker calls go through `nodes.call`).
Admissions are booked in the store before the slow container start; a start
that fails hands the slices back. Preempted sessions are stopped through the
Hub's REST API, so the Hub's own state stays true, and their users are told why.

Configured with traitlets (``c.BudgetScheduler.…``); the traits become the
core's frozen `Settings` once, at start.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Bool, Dict, Float, Integer, List, Tuple, Unicode, default
from traitlets.config import SingletonConfigurable

from scheduler_core.errors import InputError
from scheduler_core.ledger import UsageLedger
from scheduler_core.model import Allocation, Health, Node, Pool, PoolKind, Request, Team
from scheduler_core.outlook import admission_order
from scheduler_core.scenario import parse_pools, parse_teams, why_unplaceable
from scheduler_core.scheduler import Scheduler, WallClock
from scheduler_core.settings import (
    SETTING_NAMES,
    SettingError,
    Settings,
    settings_from_mapping,
)
from scheduler_core.store import EventRecord, RequestState, SliceConflict, Store, StoreError
from spawner.containers import DEFAULT_HUB, LABEL_PREFIX
from spawner.inventory import InventoryError, nvml_gpus, virtual_gpus
from spawner.nodes import Answer, ContainerState, EngineConfig, NodeBackend

_NODE_KEYS = frozenset(
    {"name", "pool", "engine", "tls", "address", "network", "storage", "cpus", "memory_gib"}
    | {"labels", "gpus", "gpu_model", "mig", "state"}
)


class ConfigError(ValueError):
    """A ``c.BudgetScheduler`` setting that cannot work: ``key`` names it."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"c.BudgetScheduler.{key}: {reason}")


@dataclass
class Waiter:
    """A spawner waiting for its request's grant."""

    future: asyncio.Future[Allocation]
    changed: asyncio.Event


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """Where a waiting request stands, for ``progress()``."""

    position: int
    """1-based, among the requests waiting for the same pool."""
    waiting: int
    team_position: int
    team_waiting: int
    funded: bool | None
    """Would it be funded if it started now (None: not yet weighed)."""
    protected_s: float
    estimated_start: float | None
    """Wall time (epoch seconds) by which enough running sessions should have ended."""
    unit: str = "GPU"
    """What the pool's figures below count: GPU (GPU-equivalents) or CPU."""
    team_funded: float = 0.0
    """What the team's funded sessions in the pool hold now."""
    team_share: float = 0.0
    """The team's share of the pool, in the same units."""
    budget_used: float | None = None
    """The team's charged usage over the window, as a fraction of its budget."""
    window_days: float = 7.0
    """The lookback window, in days."""
    ahead: frozenset[str] = frozenset()
    """The requests ahead of this one now."""
    other_teams: bool = False
    """Requests of other teams wait in the pool too (so the order can move)."""


def parse_nodes(
    raw: list[Any], pools: Mapping[str, Pool], nvml: Any = None
) -> tuple[list[Node], dict[str, EngineConfig]]:
    """Nodes and their engines from ``c.BudgetScheduler.nodes``; ConfigError names a bad key.

    ``gpus`` is a count of virtual GPUs, or ``"nvml"`` to read this machine's GPUs.
    """
    nodes: list[Node] = []
    engines: dict[str, EngineConfig] = {}
    for i, item in enumerate(raw):
        where = f"nodes[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(where, "must be a dict")
        unknown = set(item) - _NODE_KEYS
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}", "unknown key")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name", "must be a non-empty string")
        if name in engines:
            raise ConfigError(f"{where}.name", f"node {name!r} is defined twice")
        pool = item.get("pool")
        if not isinstance(pool, str) or pool not in pools:
            raise ConfigError(f"{where}.pool", f"unknown pool {pool!r}")
        gpus_spec = item.get("gpus", 0)
        nvidia = False
        if gpus_spec == "nvml":
            try:
                gpus = nvml_gpus(nvml)
            except InventoryError as error:
                raise ConfigError(f"{where}.gpus", str(error)) from None
            nvidia = True
        elif isinstance(gpus_spec, int) and not isinstance(gpus_spec, bool) and gpus_spec >= 0:
            mig_raw = item.get("mig", {})
            try:
                mig = {int(k): list(v) for k, v in mig_raw.items()}
            except (AttributeError, TypeError, ValueError):
                raise ConfigError(f"{where}.mig", "must map GPU index to profiles") from None
            gpus = virtual_gpus(name, gpus_spec, item.get("gpu_model", "virtual GPU"), mig)
        else:
            raise ConfigError(f"{where}.gpus", f"must be a count or 'nvml', not {gpus_spec!r}")
        if gpus and pools[pool].kind is PoolKind.CPU:
            raise ConfigError(f"{where}.gpus", f"pool {pool!r} is a CPU pool")
        cpus, memory = item.get("cpus", 4), item.get("memory_gib", 8)
        for key, value in (("cpus", cpus), ("memory_gib", memory)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{where}.{key}", f"must be a positive number, not {value!r}")
        labels = dict(item.get("labels", {}))
        storage = dict(item.get("storage", {}))
        for storage_name in storage:
            labels.setdefault("storage", storage_name)
        nodes.append(
            Node(
                name=name,
                pool=pool,
                cpus=float(cpus),
                memory_gib=float(memory),
                gpus=gpus,
                labels=labels,
                health=Health(item.get("state", "ready")),
            )
        )
        engines[name] = EngineConfig(
            node=name,
            url=item.get("engine"),
            tls=dict(item.get("tls", {})),
            address=item.get("address", "127.0.0.1"),
            network=item.get("network", "host"),
            storage=storage,
            nvidia=nvidia,
        )
    if not nodes:
        raise ConfigError("nodes", "declares no node")
    return nodes, engines


def split_request_id(request_id: str) -> tuple[str, str]:
    """(user, server name) from a request id ``user/server/token``."""
    user, server, _token = request_id.rsplit("/", 2)
    return user, server


def notices_from(events: Iterable[EventRecord]) -> dict[tuple[str, str], str]:
    """The "your session was stopped" notices still to show, per (user, server name),
    from the event log in order: a preemption sets its server's notice, a later
    submit for that server (the user started again) clears it."""
    notices: dict[tuple[str, str], str] = {}
    for event in events:
        if event.kind not in ("submit", "preempt"):
            continue
        try:
            session = split_request_id(str(event.payload.get("request", "")))
        except ValueError:
            continue
        if event.kind == "submit":
            notices.pop(session, None)
        elif event.payload.get("message"):
            notices[session] = str(event.payload["message"])
    return notices


def server_path(request_id: str) -> str:
    """The Hub REST path of the server a request is for."""
    user, server = split_request_id(request_id)
    return f"users/{user}/servers/{server}" if server else f"users/{user}/server"


def describe_exit(state: ContainerState | None) -> str:
    """How a container ended, in words for its user."""
    if state is None:
        return "was gone"
    if state.oom_killed:
        return f"ran out of memory and was killed (exit code {state.exit_code})"
    if state.exit_code == 0:
        return "exited (its server was shut down)"
    if state.exit_code == 137:
        return "was killed (exit code 137)"
    return f"exited with code {state.exit_code}"


class BudgetScheduler(SingletonConfigurable):
    """The budget scheduler embedded in the Hub (one per Hub process)."""

    # -- the core's settings (DESIGN.md §4), one trait each ---------------------

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
    debug_min_runtime = Float(900.0, help="Cap on a debug session's minimum runtime, seconds.").tag(
        config=True
    )
    debug_max_gpus = Integer(2, help="Most GPUs a debug session may hold.").tag(config=True)
    unallocated_grace = Float(
        60.0, help="Seconds an unallocated session runs before it may be preempted."
    ).tag(config=True)
    cycle_tick = Float(30.0, help="Seconds between periodic scheduling cycles.").tag(config=True)
    budget_recheck = Float(
        300.0, help="Seconds after which a periodic cycle weighs the whole queue again."
    ).tag(config=True)
    starvation_bound = Float(
        7200.0, help="Seconds a request waits before it gets a reservation."
    ).tag(config=True)
    max_reservations_per_pool = Integer(
        2, help="Most nodes held at once in a pool for starving requests."
    ).tag(config=True)
    guaranteed_share = Float(
        1.0,
        help="""A session is funded, whatever the team's budget over the window, while the
        team's funded sessions in the pool stay within this multiple of its share (0: off).""",
    ).tag(config=True)
    funded_burst = Float(
        1.5,
        help="""The window budget funds a team's sessions up to this multiple of its share
        of the pool at once; beyond, they run unallocated (0: no cap).""",
    ).tag(config=True)
    placement = Unicode("best-fit", help="best-fit, worst-fit or first-fit.").tag(config=True)
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
        help="Pools: [{'name': 'h100', 'kind': 'gpu'}, …] (DESIGN.md §5 format).",
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

    # -- sessions ----------------------------------------------------------------

    max_queue_wait = Float(
        8 * 3600.0, help="A spawn that waits longer than this in the queue ends, with a message."
    ).tag(config=True)
    launch_timeout = Float(
        120.0, help="Seconds from grant to a container whose server answers."
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
        help="""Names and labels every container this Hub starts; Hubs sharing an engine
        need different names, and never touch each other's containers.""",
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

    @default("teams")
    def _default_teams(self) -> list[dict[str, Any]]:
        return []

    # -------------------------------------------------------------------------------

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.started = False
        self._start_lock: asyncio.Lock | None = None
        self.hub_api_url = ""
        self.core: Scheduler
        self.store: Store
        self.settings: Settings
        self.node_list: list[Node] = []
        self.engines: dict[str, EngineConfig] = {}
        self.backends: dict[str, NodeBackend] = {}
        self.core_pools: dict[str, Pool] = {}
        self.core_teams: list[Team] = []
        self._waiters: dict[str, Waiter] = {}
        self._unclaimed: dict[str, tuple[Allocation, float]] = {}
        self._by_session: dict[tuple[str, str], str] = {}
        self._options: dict[str, dict[str, Any]] = {}
        self._ports: dict[int, str] = {}
        self._order: dict[str, None] = {}
        """Waiting requests in projected admission order (`scheduler_core.outlook`)."""
        self._order_stale = True
        self._kick: asyncio.Handle | None = None
        self._tasks: list[asyncio.Task[None]] = []  # held so the loops are not collected
        self._background: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.notices: dict[tuple[str, str], str] = {}
        self.broken: str | None = None
        """Why the scheduler could not start (safe mode), or None."""
        self._retrying: asyncio.Task[None] | None = None
        self._live: set[str] = set()
        """Requests whose server runs (its spawner's start returned, or adopted)."""
        self._stopping: set[str] = set()
        """Requests whose container this Hub is removing on purpose."""
        self._unreachable_since: dict[str, float] = {}
        self._orphans: dict[str, set[str]] = {}
        """Per node, containers to remove once the node answers again."""
        self.cycle_ms: list[float] = []
        """Wall time of recent cycles on the event loop (the Hub's lag from scheduling)."""

    # -- start -------------------------------------------------------------------

    def core_settings(self) -> Settings:
        values = {key: getattr(self, key) for key in SETTING_NAMES if self.has_trait(key)}
        values.update(self.policy_settings)
        values["name"] = self.policy
        try:
            return settings_from_mapping(values)
        except SettingError as error:
            raise ConfigError(error.key, error.reason) from None

    def build(self) -> None:
        """Parse the configuration into the core's frozen objects (no I/O but NVML)."""
        self.settings = self.core_settings()
        try:
            self.core_pools = parse_pools(self.pools)
            self.core_teams = parse_teams(self.teams, self.core_pools)
        except InputError as error:
            raise ConfigError(error.where, error.reason) from None
        self.node_list, self.engines = parse_nodes(self.nodes, self.core_pools)
        self.backends = {
            name: NodeBackend(engine, ping_timeout=self.ping_timeout)
            for name, engine in self.engines.items()
        }

    async def ensure_started(self, hub_api_url: str = "") -> None:
        """Open the store, seed it, find running sessions again, start the loops. Idempotent.

        Never raises: a scheduler that cannot start leaves ``broken`` set (safe mode:
        running sessions are kept, new spawns refused with the reason) and tries again
        every ``start_retry`` seconds. An exception here would reach the Hub's poll of
        every server, and the Hub forgets servers whose poll fails."""
        if hub_api_url and not self.hub_api_url:
            self.hub_api_url = hub_api_url
        if self.started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self.started or self._retrying is not None:
                return
            await self._try_start()
            if not self.started:
                self._retrying = asyncio.get_running_loop().create_task(self._retry_start())

    async def _try_start(self) -> None:
        try:
            await self._start()
        except Exception as error:
            reason = f"{type(error).__name__}: {error}"
            if reason != self.broken:
                self.log.critical(
                    "budgethub: the embedded scheduler cannot start (%s). Safe mode: running "
                    "sessions are kept, new spawns are refused; trying again every %g s.",
                    reason,
                    self.start_retry,
                    exc_info=error,
                )
            self.broken = reason
            return
        if self.broken:
            self.log.warning("budgethub: the embedded scheduler started; safe mode is over")
        self.broken = None
        self.started = True
        self._background_task(self._requeue_when_hub_answers())

    async def _retry_start(self) -> None:
        while not self.started:
            await asyncio.sleep(self.start_retry)
            assert self._start_lock is not None
            async with self._start_lock:
                await self._try_start()
        self._retrying = None

    async def _requeue_when_hub_answers(self) -> None:
        for _attempt in range(240):  # the Hub's API answers once its own start is done
            if self.hub_api_url and await self.requeue_detached():
                return
            await asyncio.sleep(0.5)
        self.log.warning("budgethub: the Hub's API did not answer; queued spawns not resumed")

    def _background_task(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)

    async def _start(self) -> None:
        self.build()
        now = time.time()
        self.store = Store.create(self.store_url)
        self.store.save_pools(self.core_pools.values())
        self.store.save_teams(self.core_teams)
        self.store.save_nodes(self.node_list, {n: e.url for n, e in self.engines.items()})
        ledger = UsageLedger()
        for team, pool, start, end, units in self.store.usage_records(now - self.lookback):
            if end > start:
                rate = units / (end - start)
                ledger.start_charging(team, pool, start, rate)
                ledger.stop_charging(team, pool, end, rate)
            else:
                ledger.add(team, pool, end, units)
        self.core = Scheduler(
            self.settings,
            self.core_pools.values(),
            self.node_list,
            self.core_teams,
            WallClock(),
            self,
            ledger,
        )
        await self._recover(now)
        loop = self._loop = asyncio.get_running_loop()
        for backend in self.backends.values() if self.watch_events else ():
            backend.watch(self.hub_name, self._exited_from_thread)
        self._tasks = [
            loop.create_task(self._tick_loop()),
            loop.create_task(self._health_loop()),
        ]
        self.log.info(
            "budgethub: %d nodes, %d teams, %d running and %d queued sessions recovered",
            len(self.node_list),
            len(self.core_teams),
            len(self.core.running),
            len(self.core.pending),
        )
        self.kick()

    async def _recover(self, now: float) -> None:
        """Running sessions and the queue as the store and the engines left them."""
        found: dict[str, tuple[str, Mapping[str, str]]] = {}
        unknown: set[str] = set()
        """Nodes whose engine did not answer: their sessions may well still run."""
        for name, backend in self.backends.items():
            answer = await backend.ping()
            if answer is not Answer.OK:
                health = Health.DOWN if answer is Answer.REFUSED else Health.UNREACHABLE
                self.core.set_health(name, health)
                if health is Health.UNREACHABLE:
                    self._unreachable_since[name] = now
                    unknown.add(name)
                continue
            for container in await backend.sessions(self.hub_name):
                request_id = container.labels.get(f"{LABEL_PREFIX}.request", "")
                if container.running:
                    found[request_id] = (name, container.labels)
                else:  # ended while no Hub watched: nothing holds it any more
                    await backend.remove(container.id)
        for allocation in self.store.active_allocations():
            kept = allocation.id in found or bool(unknown & set(allocation.node_names))
            if kept and allocation.request.pool in self.core_pools:
                self.core.adopt(allocation)
                labels = found.get(allocation.id, ("", {}))[1]
                port = labels.get(f"{LABEL_PREFIX}.port")
                if port and port.isdigit():
                    self._ports[int(port)] = allocation.id
                self._note_session(allocation.id)
                self._live.add(allocation.id)
            else:
                self.store.release(
                    allocation.id,
                    max(now, allocation.start),
                    state=RequestState.FINISHED,
                    reason="its container was gone when the Hub started",
                )
        for request in self.store.pending_requests():
            if request.pool not in self.core_pools or request.team not in {
                t.name for t in self.core_teams
            }:
                self.store.set_request_state(
                    request.id, RequestState.CANCELLED, "its pool or team is no longer configured"
                )
                continue
            self.core.submit(request)
            self._note_session(request.id)
        events = self.store.list_events()
        # Kept in the event log, so a Hub restart does not forget them.
        self.notices.update(notices_from(e for e in events if e.time >= now - self.lookback))
        for event in events:
            if event.kind != "submit":
                continue
            request_id = str(event.payload.get("request", ""))
            if request_id in self.core.pending or request_id in self.core.running:
                self._options[request_id] = dict(event.payload.get("options", {}))

    def _note_session(self, request_id: str) -> None:
        try:
            self._by_session[split_request_id(request_id)] = request_id
        except ValueError:
            pass

    async def requeue_detached(self) -> bool:
        """Start again, through the Hub, the queued spawns no spawner waits for (after a
        Hub restart). False if the Hub did not answer (ask again later).

        All at once: each POST waits out the Hub's ``slow_spawn_timeout`` (the spawn stays
        queued), so one after another 20 queued spawns took over three minutes."""
        if not self.started:
            return False
        detached = [
            r for r in list(self.core.pending) + list(self._unclaimed) if r not in self._waiters
        ]
        gate = asyncio.Semaphore(64)
        unanswered = False

        async def post(request_id: str) -> None:
            nonlocal unanswered
            async with gate:
                if request_id in self._waiters:
                    return  # its spawner came back meanwhile
                try:
                    await self.hub_api(
                        "POST", server_path(request_id), self._options.get(request_id, {})
                    )
                    self.log.info("budgethub: %s queued again through the Hub", request_id)
                except HTTPClientError as error:
                    self.log.warning("budgethub: could not requeue %s: %s", request_id, error)
                except OSError:
                    unanswered = True

        await asyncio.gather(*(post(r) for r in detached))
        return not unanswered

    # -- loops -------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            wake = self.core.next_wake()
            delay = self.cycle_tick
            if wake is not None:
                delay = min(delay, max(0.05, wake - time.time()))
            await asyncio.sleep(delay)
            self._expire_unclaimed()
            self.run_cycle()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            await self.check_health()

    async def check_health(self) -> None:
        """Ping every engine (DESIGN rule 6, as built: docs/architecture.md).

        An engine that refuses connections is down: its containers went with it. One
        that does not answer in time is unreachable: nothing new lands there, its
        sessions are kept, and only after ``node_down_grace`` is it down. A node that
        answers again first loses the containers stopped while it was away."""
        results = await asyncio.gather(*(b.ping() for b in self.backends.values()))
        now = time.time()
        for (name, backend), answer in zip(self.backends.items(), results, strict=True):
            current = self.core.nodes[name].health
            configured = next(n.health for n in self.node_list if n.name == name)
            if answer is Answer.OK:
                self._unreachable_since.pop(name, None)
                if not await self._remove_orphans(name, backend):
                    continue  # it answers pings but not yet the rest: ask again next time
                wanted = configured
            elif answer is Answer.REFUSED:
                wanted = Health.DOWN
            else:
                since = self._unreachable_since.setdefault(name, now)
                wanted = Health.DOWN if now - since >= self.node_down_grace else Health.UNREACHABLE
                if current is Health.DOWN:
                    wanted = Health.DOWN
            if current is wanted:
                continue
            self.log.warning("budgethub: node %s is now %s", name, wanted.value)
            self.core.set_health(name, wanted)
            if wanted is not Health.UNREACHABLE:  # the store keeps ready, draining, down
                self.store.set_node_health(name, wanted)
            self.store.append_event(now, "node", {"node": name, "state": wanted.value})
            if answer is Answer.OK and current is not Health.READY:
                self._background_task(self._sweep(name, backend))
            self.kick()

    async def _remove_orphans(self, node: str, backend: NodeBackend) -> bool:
        """Remove the containers stopped while the node was away; True when none is left."""
        for container_id in list(self._orphans.get(node, ())):
            try:
                await asyncio.wait_for(backend.remove(container_id), self.engine_timeout)
            except Exception as error:
                self.log.warning("budgethub: node %s: removing %s: %s", node, container_id, error)
                return False
            self._orphans[node].discard(container_id)
            self.log.info("budgethub: node %s: removed %s, stopped while away", node, container_id)
        return True

    async def _sweep(self, node: str, backend: NodeBackend) -> None:
        """After an absence: sessions of the node whose container ended meanwhile end now."""
        try:
            containers = await backend.sessions(self.hub_name)
        except Exception as error:
            self.log.warning("budgethub: node %s: listing sessions: %s", node, error)
            return
        running = {c.labels.get(f"{LABEL_PREFIX}.request", "") for c in containers if c.running}
        for request_id in list(self._live):
            allocation = self.core.running.get(request_id)
            if allocation is not None and node in allocation.node_names:
                if request_id not in running:
                    self.container_ended(request_id, None, through_hub=True)

    # -- containers that end on their own ----------------------------------------------

    def _exited_from_thread(self, state: ContainerState) -> None:
        """An engine's event thread saw one of this Hub's containers end."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._exited, state)

    def _exited(self, state: ContainerState) -> None:
        request_id = state.labels.get(f"{LABEL_PREFIX}.request", "")
        if request_id in self._live and request_id not in self._stopping:
            self._background_task(self._inspect_exit(request_id, state))

    async def _inspect_exit(self, request_id: str, event: ContainerState) -> None:
        """The event says that it ended; the container says how (out of memory?)."""
        state = event
        allocation = self.core.running.get(request_id)
        if allocation is not None:
            backend = self.backends[allocation.grants[0].node]
            try:
                seen = await asyncio.wait_for(backend.state(event.id), self.engine_timeout)
                state = seen if seen is not None else event
            except Exception as error:
                self.log.info("budgethub: %s: inspecting its container: %s", request_id, error)
        self.container_ended(request_id, state, through_hub=True)

    def container_ended(
        self, request_id: str, state: ContainerState | None, *, through_hub: bool = False
    ) -> None:
        """A session's container ended by itself (shut down from inside, killed, out of
        memory, gone): its slices are free at once, its user is told, the container is
        removed and, ``through_hub``, the Hub is told its server stopped."""
        if request_id not in self._live or request_id in self._stopping:
            return
        allocation = self.core.running.get(request_id)
        self._live.discard(request_id)
        if allocation is None:
            return
        why = describe_exit(state)
        now = time.time()
        self.log.warning("budgethub: %s ended by itself: %s", request_id, why)
        self.finish(request_id, reason=f"its container ended: {why}")
        message = (
            f"Your session ended at {time.strftime('%H:%M', time.localtime(now))}: "
            f"its container {why}."
        )
        self.store.append_event(
            now, "exit", {"request": request_id, "reason": why, "message": message}
        )
        if state is None or state.exit_code != 0:  # a clean shutdown needs no notice
            self.notices[split_request_id(request_id)] = message
        node = allocation.grants[0].node
        self._background_task(self._after_exit(request_id, node, state, through_hub))

    async def _after_exit(
        self, request_id: str, node: str, state: ContainerState | None, through_hub: bool
    ) -> None:
        backend = self.backends[node]
        if state is not None and state.id:
            try:
                logs = await asyncio.wait_for(backend.logs(state.id), self.engine_timeout)
                self.log.info("budgethub: %s: last lines of its container:\n%s", request_id, logs)
                await asyncio.wait_for(backend.remove(state.id), self.engine_timeout)
            except Exception as error:
                self.log.warning("budgethub: %s: cleaning up its container: %s", request_id, error)
        if through_hub:
            try:
                await self.hub_api("DELETE", server_path(request_id))
            except (HTTPClientError, OSError) as error:
                self.log.info("budgethub: the Hub did not take %s's stop: %s", request_id, error)

    # -- what a spawner's start, poll and stop tell the scheduler -------------------------

    def session_running(self, request_id: str) -> None:
        """The server of this request answers: from now on its container's end is watched."""
        if request_id in self.core.running:
            self._live.add(request_id)

    def stopping(self, request_id: str) -> None:
        """This Hub is about to remove the request's container on purpose."""
        self._stopping.add(request_id)

    def node_answers(self, node: str) -> bool:
        """False while the node is unreachable or down: calls to its engine would hang."""
        health = self.core.nodes[node].health if node in self.core.nodes else Health.DOWN
        return health not in (Health.UNREACHABLE, Health.DOWN)

    def orphan(self, node: str, container_id: str) -> None:
        """A container this Hub could not remove now: removed when the node answers."""
        self._orphans.setdefault(node, set()).add(container_id)

    def kick(self) -> None:
        """Run a cycle soon (coalescing bursts of events into one cycle)."""
        if self._kick is not None:
            return
        loop = asyncio.get_running_loop()
        self._kick = loop.call_soon(self._kicked)

    def _kicked(self) -> None:
        self._kick = None
        self.run_cycle()

    def run_cycle(self) -> None:
        t0 = time.perf_counter()
        decisions = self.core.step()
        if decisions is not None and decisions.follow_up:
            self.core.cycle()
        if decisions is not None:
            self._order_stale = True
            for waiter in self._waiters.values():
                waiter.changed.set()
        self.cycle_ms.append((time.perf_counter() - t0) * 1e3)
        del self.cycle_ms[:-1000]

    # -- the actuator (called by the core inside a cycle) ------------------------

    def launch(self, allocation: Allocation) -> None:
        try:
            self.store.book(allocation)
        except (SliceConflict, StoreError) as error:
            # Another scheduler writing to the same store got there first.
            self.log.warning("budgethub: cannot book %s: %s", allocation.id, error)
            asyncio.get_running_loop().call_soon(self._book_failed, allocation.id)
            return
        self.log.info(
            "budgethub: granted %s on %s, %.1f ms after its submission (%s)",
            allocation.id,
            ",".join(allocation.node_names),
            (time.time() - allocation.request.submit) * 1e3,
            "funded" if allocation.funded else "unallocated",
        )
        waiter = self._waiters.get(allocation.id)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(allocation)
        else:
            self._unclaimed[allocation.id] = (allocation, time.time() + self.claim_timeout)

    def _book_failed(self, request_id: str) -> None:
        if request_id in self.core.running:
            self.core.launch_failed(request_id)
        self.kick()

    def preempt(self, allocation: Allocation, reason: str) -> bool:
        now = time.time()
        how = (
            "its protected time was over"
            if allocation.funded
            else "your session ran unallocated, on idle capacity"
        )
        why = {
            "funded": f"a session funded by a team's budget needed its GPUs ({how})",
            "drain": "its node is being drained",
            "node-down": "its node stopped answering",
        }.get(reason, reason)
        message = (
            f"Your session was stopped at {time.strftime('%H:%M', time.localtime(now))}: {why}."
        )
        self.store.release(allocation.id, now, state=RequestState.FINISHED, reason=message)
        self.store.append_event(
            now, "preempt", {"request": allocation.id, "reason": reason, "message": message}
        )
        user, server = split_request_id(allocation.id)
        self.notices[(user, server)] = message
        self._unclaimed.pop(allocation.id, None)
        self._live.discard(allocation.id)
        waiter = self._waiters.get(allocation.id)
        if waiter is not None:
            waiter.changed.set()
        self._background_task(self._stop_through_hub(allocation))
        return False

    async def _stop_through_hub(self, allocation: Allocation) -> None:
        path = server_path(allocation.id)
        try:
            await self.hub_api("DELETE", path)
        except (HTTPClientError, OSError) as error:
            self.log.warning(
                "budgethub: the Hub did not stop %s (%s); stopping its container", path, error
            )
            node = allocation.grants[0].node
            backend = self.backends[node]
            try:
                found = await asyncio.wait_for(backend.sessions(self.hub_name), self.engine_timeout)
                for container in found:
                    if container.labels.get(f"{LABEL_PREFIX}.request") == allocation.id:
                        await asyncio.wait_for(backend.remove(container.id), self.engine_timeout)
            except Exception as error:
                self.log.warning("budgethub: node %s: stopping %s: %s", node, path, error)

    async def hub_api(self, method: str, path: str, body: Any = None) -> Any:
        """Call the Hub's REST API as the `budgethub` service."""
        if not self.hub_api_url or not self.hub_api_token:
            raise OSError("the Hub's API URL or the budgethub service token is not known")
        request = HTTPRequest(
            f"{self.hub_api_url.rstrip('/')}/{path}",
            method=method,
            headers={"Authorization": f"token {self.hub_api_token}"},
            body=json.dumps(body)
            if body is not None
            else (None if method in ("GET", "DELETE") else ""),
            request_timeout=30,
        )
        response = await AsyncHTTPClient().fetch(request)
        return json.loads(response.body) if response.body else None

    # -- what spawners call --------------------------------------------------------

    def check_placeable(self, request: Request) -> str | None:
        """Why no node of the cluster could ever hold the request, or None."""
        return why_unplaceable(request, self.node_list)

    def find_request(self, user: str, server: str) -> str | None:
        """The queued or granted request of this user's server, if one outlives its spawner."""
        request_id = self._by_session.get((user, server))
        if request_id is None:
            return None
        if request_id in self.core.pending or request_id in self._unclaimed:
            return request_id
        return None

    def new_request_id(self, user: str, server: str) -> str:
        return f"{user}/{server}/{secrets.token_hex(4)}"

    def submit(self, request: Request, options: Mapping[str, Any]) -> Waiter:
        """Queue a request (booked in the store first) and return what to wait on."""
        self.store.add_request(request)
        request = self.core.submit(request)
        self._options[request.id] = dict(options)
        self.store.append_event(
            request.submit,
            "submit",
            {"request": request.id, "options": dict(options), "team": request.team},
        )
        self._by_session[split_request_id(request.id)] = request.id
        waiter = self.attach(request.id)
        self.kick()
        return waiter

    def attach(self, request_id: str) -> Waiter:
        """Wait for an already queued (or granted, unclaimed) request."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), asyncio.Event())
        self._waiters[request_id] = waiter
        parked = self._unclaimed.pop(request_id, None)
        if parked is not None:
            waiter.future.set_result(parked[0])
        return waiter

    def detach(self, request_id: str) -> None:
        self._waiters.pop(request_id, None)

    def cancel(self, request_id: str, reason: str) -> None:
        """The user gave up waiting (or the wait ran out): out of the queue, slices freed."""
        self._waiters.pop(request_id, None)
        self._unclaimed.pop(request_id, None)
        if self.core.cancel(request_id):
            self.store.set_request_state(request_id, RequestState.CANCELLED, reason)
        elif request_id in self.core.running:
            self.finish(request_id, state=RequestState.CANCELLED, reason=reason)
        self.kick()

    def finish(
        self,
        request_id: str,
        *,
        state: RequestState = RequestState.FINISHED,
        reason: str | None = None,
    ) -> None:
        """The session ended: stop charging, free its slices and its port."""
        self._waiters.pop(request_id, None)
        self._live.discard(request_id)
        self._stopping.discard(request_id)
        for port, holder in list(self._ports.items()):
            if holder == request_id:
                del self._ports[port]
        if request_id in self.core.running:
            self.core.finish(request_id)
            try:
                self.store.release(request_id, time.time(), state=state, reason=reason)
            except StoreError as error:
                self.log.warning("budgethub: releasing %s: %s", request_id, error)
        self.kick()

    def launch_failed(self, request_id: str, reason: str) -> None:
        """The container did not start: slices back, the request waits again."""
        self._ports = {p: r for p, r in self._ports.items() if r != request_id}
        if request_id in self.core.running:
            self.store.release(request_id, time.time(), state=RequestState.REQUEUED, reason=reason)
            self.core.launch_failed(request_id)
        self.kick()

    def _expire_unclaimed(self) -> None:
        now = time.time()
        for request_id, (_allocation, deadline) in list(self._unclaimed.items()):
            if deadline <= now and request_id not in self._waiters:
                del self._unclaimed[request_id]
                self.finish(
                    request_id,
                    state=RequestState.CANCELLED,
                    reason="granted while no spawner waited for it",
                )

    def allocate_port(self, request_id: str) -> int:
        """A free port for a session, never one another session holds."""
        low, high = self.port_range
        for _ in range(high - low + 1):
            port = secrets.randbelow(high - low + 1) + low
            if port in self._ports:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            self._ports[port] = request_id
            return int(port)
        raise RuntimeError(f"no free port in {low}-{high}")

    def hold_port(self, port: int, request_id: str) -> None:
        self._ports[port] = request_id

    def queue_status(self, request_id: str) -> QueueStatus | None:
        """Position in the queue (overall in the pool, inside the team) and an estimate."""
        request = self.core.pending.get(request_id)
        if request is None:
            return None
        if self._order_stale:
            now = time.time()
            self._order = dict.fromkeys(admission_order(self.core.snapshot(now), now))
            self._order_stale = False
        same_pool = [
            r
            for r in self._order
            if r in self.core.pending and self.core.pending[r].pool == request.pool
        ]
        if request_id not in same_pool:
            same_pool.append(request_id)
        position = same_pool.index(request_id) + 1
        team = [r for r in same_pool if self.core.pending[r].team == request.team]
        funded = self.core.funded.get(request_id)
        ahead = [self.core.pending[r] for r in same_pool[: position - 1]]
        pool = request.pool
        return QueueStatus(
            position=position,
            waiting=len(same_pool),
            team_position=team.index(request_id) + 1,
            team_waiting=len(team),
            funded=funded,
            protected_s=request.min_runtime if funded else 0.0,
            estimated_start=self._estimate(request, ahead),
            unit="CPU" if self.core_pools[pool].kind is PoolKind.CPU else "GPU",
            team_funded=self.core.funded_rate(request.team, pool),
            team_share=self.core.teams.share(request.team, pool) * self.core.capacity[pool],
            budget_used=self.budget_used(request.team, pool),
            window_days=self.settings.lookback / 86400,
            ahead=frozenset(same_pool[: position - 1]),
            other_teams=len(team) < len(same_pool),
        )

    def why_behind(self, request_id: str, passed_by: Iterable[str]) -> str:
        """Why requests that were not ahead of this one are ahead now (the policy ranks
        teams again after every admission), in words for its user."""
        request = self.core.pending.get(request_id)
        others = [self.core.pending[r] for r in passed_by if r in self.core.pending]
        if request is None or not others:
            return "the queue was weighed again"
        reasons = []
        if any(r.team != request.team for r in others):
            reasons.append("other teams are further under their share than yours")
        if any(r.team == request.team for r in others):
            reasons.append("your team has a request of higher priority")
        return " and ".join(reasons)

    def _estimate(self, request: Request, ahead: list[Request]) -> float | None:
        """When running sessions of the pool, ending as their protected windows do, free
        the GPU-equivalents (or cores) of this request and those ahead of it."""
        kind = self.core_pools[request.pool].kind
        need = request.charge_rate(kind) + sum(r.charge_rate(kind) for r in ahead)
        ends = sorted(
            (a.protected_until, a.charge_rate if a.funded else a.request.charge_rate(kind))
            for a in self.core.running.values()
            if a.pool == request.pool
        )
        freed = 0.0
        for end, units in ends:
            freed += units
            if freed >= need:
                return max(end, time.time())
        return None

    def team_of_groups(self, groups: list[str]) -> list[str]:
        """The user's groups that are teams with an allocation."""
        names = {t.name for t in self.core_teams}
        return [g for g in groups if g in names]

    def budget_used(self, team: str, pool: str) -> float | None:
        """The team's charged usage over the window as a fraction of its budget in the
        pool (None: it has no budget there)."""
        budget = (
            self.core.teams.share(team, pool) * self.core.capacity[pool] * self.settings.lookback
        )
        if budget <= 0:
            return None
        now = time.time()
        return self.core.ledger.charged(team, pool, now - self.settings.lookback, now) / budget

    def team_hint(self, team: str, pool: str | None = None) -> str:
        """A short line about a team's budget: occupancy ratio per pool."""
        parts = []
        for pool_name in self.core_pools:
            if pool is not None and pool_name != pool:
                continue
            used = self.budget_used(team, pool_name)
            if used is not None:
                parts.append(f"{pool_name}: {used:.0%} of budget used")
        return f"({'; '.join(parts)})" if parts else ""
