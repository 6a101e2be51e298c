"""The embedded scheduler: one per Hub process, between the spawners and the core.

The facade the spawners talk to, over parts with one purpose each (docs/architecture.md,
"The Hub side"): its configuration (``config.py``), the session actuator that alone
holds the nodes' runtimes (``spawner.runtime.actuator``), the Hub API client
(``spawner.hubapi``), restart recovery (``recovery.py``) and the read model
(``spawner.readmodel.status``). Here: starting (or safe mode), the cycle on the Hub's
event loop (a cycle is milliseconds; runtime calls run off it), and what spawners
call: submit, wait for a grant, start, poll and stop a session.
Admissions are booked in the store before the slow session start; a start that
fails hands the slices back and waits again at its old place in the queue.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tornado.httpclient import HTTPClientError
from traitlets import Unicode

from scheduler_core.model import Allocation, Health, Node, Pool, Request, Team
from scheduler_core.scenario import why_unplaceable
from scheduler_core.scheduler import Scheduler, WallClock
from scheduler_core.settings import Settings
from scheduler_core.store import RequestForecast, RequestState, SnapshotRecord, Store
from scheduler_core.store.admin import AdminStore, SchedulerStatus
from spawner import admin
from spawner.hub.config import SchedulerConfig
from spawner.hub.notify import StartHookConfig, call_hook
from spawner.hub.recovery import recover
from spawner.hubapi import HubClient, split_request_id
from spawner.readmodel.status import QueueStatus, QueueView, usage_ledger
from spawner.runtime.actuator import (
    Agent,
    LaunchFailed,
    RunningSession,
    SessionActuator,
    SessionLaunch,
    SnapshotPolicy,
    Timeouts,
    snapshot_sentence,
)
from spawner.runtime.snaprecord import snapshot_holds
from spawner.runtime.snapshots import KEY_PATTERN, SnapshotLayout

ADMIN_CHECK = 0.5
"""Seconds between looks for admin changes (one small query) before a cycle."""
REPORT_EVERY = 5.0
"""Seconds between status reports to the store (cycle counts, for /metrics)."""
CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds (seconds) of the cycle-duration histogram; longer cycles count in +Inf."""
SESSION_ENDED = "session-ended"
"""The event of a session that ran and was then stopped by its user or ended by itself
(``user``, ``server``, ``request``, ``started``): every snapshot of that server taken
before ``started`` is no longer its latest state, so it is kept but not offered."""

HUB_START = "hub-start"
"""The event of each start of the embedded scheduler (a Hub restart too): its effective
settings, teams and shares, nodes' health, and the requests running and queued then."""
ADMIN_APPLIED = "admin-applied"
"""The event of an admin change taken in by the running scheduler (``audit_id``): what it
runs with from then on, as `HUB_START` says it."""
CANCEL = "cancel"
"""The event of a waiting request that left the queue without a session (its user gave
up, the queue's time ran out, an admin cancelled it): ``request``, ``reason``."""
GRANTED = "granted"
"""The event of an admission booked (at the grant's start): ``request``, ``funded`` and
``devices`` (node → the device ids of its slices)."""
LAUNCHED = "launched"
"""The event of a granted session that is ready: ``request``, ``node``, ``booked`` (the
grant's start) and ``latency_s`` (the spawn's own time, from the grant to ready)."""

__all__ = [
    "BudgetScheduler",
    "LaunchFailed",
    "SessionLaunch",
    "QueueStatus",
    "Waiter",
]


@dataclass
class Waiter:
    """A spawner waiting for its request's grant."""

    future: asyncio.Future[Allocation]
    changed: asyncio.Event


class BudgetScheduler(StartHookConfig, SchedulerConfig):
    """The budget scheduler embedded in the Hub (one per Hub process)."""

    replay_reports = Unicode(
        "",
        help="""Directory of `budgethub replay --json` reports (and their plots); the budget
        service's admin page links to the newest and applies its what-ifs' settings.
        Empty: ``replay/`` beside a SQLite store (none for PostgreSQL).""",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.started = False
        self.broken: str | None = None
        """Why the scheduler could not start (safe mode), or None."""
        self._start_lock: asyncio.Lock | None = None
        self._retrying: asyncio.Task[None] | None = None
        self.hub = HubClient(self.hub_api_token)
        self.core: Scheduler
        self.store: Store
        self.settings: Settings
        self.actuator: SessionActuator
        self.view: QueueView
        self.node_list: list[Node] = []
        self.core_pools: dict[str, Pool] = {}
        self.core_teams: list[Team] = []
        self.notices: dict[tuple[str, str], str] = {}
        self.agents: dict[str, Agent] = {}
        """Per request, how to reach its session's agent (see `remember_agent`)."""
        self._ended: dict[tuple[str, str], float] | None = None
        """(user, server) → the start of its latest session that ended other than by a
        preemption (from the SESSION_ENDED events, read once)."""
        self._waiters: dict[str, Waiter] = {}
        self._respawning: set[str] = set()
        """Resumable requests preempted and queued again that no spawner waits for yet:
        the Hub's stop of their old spawn must not end them (`_preempted`)."""
        self._unclaimed: dict[str, tuple[Allocation, float]] = {}
        self._by_session: dict[tuple[str, str], str] = {}
        self._options: dict[str, dict[str, Any]] = {}
        self._kick: asyncio.Handle | None = None
        self._tasks: list[asyncio.Task[None]] = []  # held so the loops are not collected
        self._background: set[asyncio.Task[None]] = set()
        self.cycle_ms: list[float] = []
        """Wall time of recent cycles on the event loop (the Hub's lag from scheduling)."""
        self.admin: AdminStore
        self.applied_admin = 0
        """The newest admin change (audit id) the core runs with."""
        self._admin_checked = 0.0
        self._reported = 0.0
        self._cycle_counts = [0] * (len(CYCLE_BUCKETS) + 1)
        self._cycles = 0
        self._cycle_sum = 0.0

    # -- start, or safe mode -----------------------------------------------------------

    async def ensure_started(self, hub_api_url: str = "") -> None:
        """Open the store, seed it, find running sessions again, start the loops. Idempotent.

        Never raises: a scheduler that cannot start leaves ``broken`` set (safe mode:
        running sessions are kept, new spawns refused with the reason) and tries again
        every ``start_retry`` seconds. An exception here would reach the Hub's poll of
        every server, and the Hub forgets servers whose poll fails."""
        if hub_api_url and not self.hub.url:
            self.hub.url = hub_api_url
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

    def _background_task(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)

    def build(self) -> None:
        """Parse the configuration into the core's frozen objects (no I/O but NVML)."""
        cluster = self.cluster()
        self.settings = cluster.settings
        self.core_pools = dict(cluster.pools)
        self.core_teams = list(cluster.teams)
        self.node_list = list(cluster.nodes)
        # The engines first: a store that cannot be opened leaves them to ask in safe mode.
        self.actuator = SessionActuator(
            cluster.engines,
            cluster.nodes,
            self.hub,
            hub_name=self.hub_name,
            timeouts=Timeouts(
                engine=self.engine_timeout,
                ping=self.ping_timeout,
                launch=self.launch_timeout,
                node_down_grace=self.node_down_grace,
            ),
            port_range=self.port_range,
            granted=self._granted,
            preempted=self._preempted,
            changed=self.kick,
            respawn=self._respawn,
            notices=self.notices,
            log=self.log,
            layout=self.layout(),
            snapshots=SnapshotPolicy(
                enabled=self.snapshots, keep=self.snapshot_keep, grace=self.snapshot_grace
            ),
            agents=self.agents,
            runtimes=cluster.runtimes,
        )

    def layout(self) -> SnapshotLayout:
        """Where homes and snapshots live (docs/snapshots.md)."""
        home = Path(self.home_root).resolve() if self.home_root else None
        if self.snapshot_root:
            snapshots = Path(self.snapshot_root).resolve()
        elif home is not None:
            snapshots = home.parent / "snapshots"
        else:
            snapshots = Path("snapshots").resolve()
        return SnapshotLayout(self.hub_name, home, snapshots)

    async def _start(self) -> None:
        self.build()
        now = time.time()
        store = self.store = Store.create(self.store_url)
        self.admin = AdminStore(store)
        self.applied_admin = self.admin.version()
        self._merge_admin(self.admin.overrides())
        store.save_pools(self.core_pools.values())
        store.save_teams(self.core_teams)
        urls = {n: e.url for n, e in self.actuator.engines.items()}
        store.save_nodes(self.node_list, urls, at=now)  # an inventory change: an event
        ledger = usage_ledger(store, now - self.settings.lookback)
        self.core = Scheduler(
            self.settings,
            self.core_pools.values(),
            self.node_list,
            self.core_teams,
            WallClock(),
            self.actuator,
            ledger,
        )
        self.actuator.attach(self.core, store)
        self.view = QueueView(self.core, self.store)  # estimates rest on past sessions
        recovered = await recover(
            self.core, store, self.actuator, tuple(self.core_teams), now, self.settings.lookback
        )
        self._options.update(recovered.options)
        self._by_session.update(recovered.sessions)
        self.notices.update(recovered.notices)
        if self.watch_events:
            self.actuator.watch()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._tick_loop()), loop.create_task(self._health_loop())]
        if self.idle_poll > 0:
            self._tasks.append(loop.create_task(self._idle_loop()))
        store.append_event(now, HUB_START, self._history_state())
        self.log.info(
            "budgethub: %d nodes, %d teams, %d running and %d queued sessions recovered",
            len(self.node_list),
            len(self.core_teams),
            len(self.core.running),
            len(self.core.pending),
        )
        self.kick()

    # -- what an admin changed through the budget service ---------------------------------

    def _merge_admin(self, overrides: Mapping[str, Any]) -> admin.Effective:
        """The store's admin changes over the configuration (the store wins)."""
        cluster = self.cluster()
        merged = admin.effective(
            cluster.teams,
            cluster.settings,
            self.core_pools,
            [n.name for n in cluster.nodes],
            overrides,
        )
        for reason in merged.ignored:
            self.log.warning(
                "budgethub: an admin change no longer fits the configuration: %s", reason
            )
        self.settings = merged.settings
        self.core_teams = list(merged.teams)
        configured = {n.name: n.health for n in cluster.nodes}
        for name, health in configured.items():
            self.actuator.configured[name] = Health.DRAINING if name in merged.drained else health
        self.node_list = [
            replace(n, health=self.actuator.configured.get(n.name, n.health))
            for n in self.node_list
        ]
        return merged

    def sync_admin(self) -> bool:
        """Take in the admin changes made since the last look (True if there were any):
        teams, shares and settings swapped in the core, nodes drained or returned."""
        version = self.admin.version()
        if version == self.applied_admin:
            return False
        old_lookback = self.settings.lookback
        merged = self._merge_admin(self.admin.overrides())
        ledger = None
        if merged.settings.lookback > old_lookback:
            # Usage older than the old window was never replayed: read it again.
            ledger = usage_ledger(self.store, time.time() - merged.settings.lookback)
            for allocation in self.core.running.values():
                if allocation.funded:
                    ledger.start_charging(
                        allocation.team, allocation.pool, allocation.start, allocation.charge_rate
                    )
        self.store.save_teams(merged.teams)
        self.core.reconfigure(settings=merged.settings, teams=merged.teams, ledger=ledger)
        for name, node in self.core.nodes.items():
            wanted = self.actuator.configured[name]
            if node.health in (Health.READY, Health.DRAINING) and node.health is not wanted:
                self.core.set_health(name, wanted)
                self.store.set_node_health(name, wanted)
                self.store.append_event(time.time(), "node", {"node": name, "state": wanted.value})
        self.applied_admin = version
        self.store.append_event(
            time.time(), ADMIN_APPLIED, {"audit_id": version, **self._history_state()}
        )
        self.log.info("budgethub: admin change %d applied (teams, settings, nodes)", version)
        return True

    def _history_state(self) -> dict[str, Any]:
        """What the scheduler runs with now, for the event log's history (`HUB_START`,
        `ADMIN_APPLIED`): its effective settings, teams with their shares, each node's
        health and the requests running and queued."""
        return {
            "hub": self.hub_name,
            "settings": settings_json(self.core.settings),
            "teams": {t.name: dict(t.share) for t in self.core_teams},
            "nodes": {name: node.health.value for name, node in self.core.nodes.items()},
            "running": sorted(self.core.running),
            "queued": sorted(self.core.pending),
        }

    def _report(self, now: float) -> None:
        """Write the cycle counts and effective settings for the budget service's /metrics."""
        cumulative, total = [], 0
        for bound, count in zip(CYCLE_BUCKETS, self._cycle_counts[:-1], strict=True):
            total += count
            cumulative.append((bound, total))
        settings = settings_json(self.settings)
        self.admin.report(
            SchedulerStatus(
                hub=self.hub_name,
                updated=now,
                cycles=self._cycles,
                cycle_seconds_sum=self._cycle_sum,
                cycle_buckets=tuple(cumulative),
                settings=settings,
                applied_audit_id=self.applied_admin,
            )
        )

    # -- queued spawns that no spawner waits for -------------------------------------------

    async def _requeue_when_hub_answers(self) -> None:
        for _attempt in range(240):  # the Hub's API answers once its own start is done
            if self.hub.url and await self.requeue_detached():
                return
            await asyncio.sleep(0.5)
        self.log.warning("budgethub: the Hub's API did not answer; queued spawns not resumed")

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
                    await self.hub.spawn_server(request_id, self._options.get(request_id, {}))
                    self.log.info("budgethub: %s queued again through the Hub", request_id)
                except HTTPClientError as error:
                    self.log.warning("budgethub: could not requeue %s: %s", request_id, error)
                except OSError:
                    unanswered = True

        await asyncio.gather(*(post(r) for r in detached))
        return not unanswered

    def _respawn(self, request_id: str) -> None:
        """Preempted resumable work waits again: a spawner must wait for it.

        The Hub stopped its server already; when the session was gone by then, the
        Hub never called the spawner's ``stop`` (which detaches its old wait)."""
        self._waiters.pop(request_id, None)
        self._background_task(self._respawn_through_hub(request_id))

    async def _respawn_through_hub(self, request_id: str) -> None:
        for _attempt in range(20):  # the Hub finishes the stop first
            if request_id in self._waiters or not self._waits_again(request_id):
                return
            try:
                await self.hub.spawn_server(request_id, self._options.get(request_id, {}))
                self.log.info("budgethub: %s waits again, spawned through the Hub", request_id)
                return
            except (HTTPClientError, OSError) as error:
                self.log.info("budgethub: respawning %s: %s; trying again", request_id, error)
            await asyncio.sleep(1.0)
        self._respawning.discard(request_id)

    def preempted_again(self, request_id: str) -> bool:
        """Preempted (resumable) and queued again, with no spawner waiting for it yet: its
        old spawn's failure or end is the preemption's, not the request's."""
        return request_id in self._respawning

    def _waits_again(self, request_id: str) -> bool:
        """Queued, or preempted and already granted again (booked once its own take-down
        is over) with no spawner waiting for it yet."""
        return request_id in self.core.pending or (
            request_id in self._respawning and request_id in self.core.running
        )

    # -- loops ---------------------------------------------------------------------------

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
            await self.actuator.check_health()

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(self.idle_poll)
            try:
                await self.actuator.poll_activity()
            except Exception:
                self.log.exception("budgethub: asking the sessions' agents")

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
        now = time.time()
        changed = False
        if now - self._admin_checked >= ADMIN_CHECK:
            self._admin_checked = now
            try:
                changed = self.sync_admin()
            except Exception:
                self.log.exception("budgethub: could not take in the admin changes")
        t0 = time.perf_counter()
        decisions = self.core.settle()  # a step and its follow-ups, as in the simulator
        if decisions is not None or changed:
            self.view.changed()
            for waiter in self._waiters.values():
                waiter.changed.set()
        seconds = time.perf_counter() - t0
        self.cycle_ms.append(seconds * 1e3)
        del self.cycle_ms[:-1000]
        if decisions is not None:
            self._cycles += 1
            self._cycle_sum += seconds
            self._cycle_counts[bisect_left(CYCLE_BUCKETS, seconds)] += 1
        if changed or now - self._reported >= REPORT_EVERY:
            self._reported = now
            try:
                self._report(now)
            except Exception as error:
                self.log.warning("budgethub: could not report the scheduler's status: %s", error)

    def _granted(self, allocation: Allocation) -> None:
        """The actuator booked an admission: hand it to its spawner (or park it). The
        devices it holds go to the event log (`GRANTED`): the store forgets an ended
        allocation's slices, and a replay places a session where it really ran."""
        self.store.append_event(
            allocation.start,
            GRANTED,
            {
                "request": allocation.id,
                "funded": allocation.funded,
                "devices": {g.node: [s.device_id for s in g.slices] for g in allocation.grants},
            },
        )
        waiter = self._waiters.get(allocation.id)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(allocation)
        else:
            self._unclaimed[allocation.id] = (allocation, time.time() + self.claim_timeout)

    def _preempted(self, request_id: str) -> None:
        """A grant that was preempted is no grant any more: a parked one is dropped, and
        a waiting spawner's progress hears of it."""
        self._unclaimed.pop(request_id, None)
        # Once the cycle is applied: if it waits again (or was granted again at once), the
        # Hub's stop of its old spawn ends neither the request nor that grant (`cancel`,
        # `stop_session`); they did, and it never started again (issue 51's live run).
        asyncio.get_running_loop().call_soon(self._mark_respawning, request_id)
        waiter = self._waiters.get(request_id)
        if waiter is not None:
            waiter.changed.set()

    def _mark_respawning(self, request_id: str) -> None:
        if request_id in self.core.pending or request_id in self.core.running:
            self._respawning.add(request_id)

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

    # -- what spawners call: the queue -------------------------------------------------------

    def check_placeable(self, request: Request) -> str | None:
        """Why no node of the cluster could ever hold the request, or None."""
        return why_unplaceable(request, self.node_list)

    def find_request(self, user: str, server: str) -> str | None:
        """The queued or granted request of this user's server, if one outlives its spawner."""
        request_id = self._by_session.get((user, server))
        if request_id is None:
            return None
        if request_id in self._unclaimed or self._waits_again(request_id):
            return request_id
        return None

    def new_request_id(self, user: str, server: str) -> str:
        return f"{user}/{server}/{secrets.token_hex(4)}"

    def submit(self, request: Request, options: Mapping[str, Any]) -> Waiter:
        """Queue a request (booked in the store first, with the forecast its user is
        shown) and return what to wait on."""
        self.store.add_request(request, self.forecast_at_submit(request))
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

    def forecast_at_submit(self, request: Request) -> RequestForecast | None:
        """What the spawn page says of ``request`` as it is submitted (the read model's
        outlook: the policy run dry, and forward for the estimate), to be kept with it.
        None, logged, if the forecast fails: a spawn is never refused for it."""
        now = time.time()
        try:
            said = self.view.outlook(request)
        except Exception:
            self.log.exception("budgethub: no forecast kept for %s", request.id)
            return None
        return RequestForecast(
            time=now,
            start=said.estimated_start,
            starts_now=said.starts_now,
            funded=said.funded,
            protected_s=said.protected_s,
            position=said.position,
            waiting=said.waiting,
        )

    def attach(self, request_id: str) -> Waiter:
        """Wait for an already queued (or granted, unclaimed) request."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), asyncio.Event())
        self._waiters[request_id] = waiter
        self._respawning.discard(request_id)
        parked = self._unclaimed.pop(request_id, None)
        if parked is not None:
            waiter.future.set_result(parked[0])
        return waiter

    def detach(self, request_id: str) -> None:
        self._waiters.pop(request_id, None)

    def cancel(self, request_id: str, reason: str) -> None:
        """The user gave up waiting (or the wait ran out): out of the queue, slices freed.
        Not a preempted request's old spawn ending: that request waits again."""
        if request_id in self._respawning:
            self.log.info("budgethub: %s waits again after its preemption", request_id)
            return
        self._waiters.pop(request_id, None)
        self._unclaimed.pop(request_id, None)
        if self.core.cancel(request_id):
            self._left_queue(request_id, reason)
        elif request_id in self.core.running:
            self.finish(request_id, state=RequestState.CANCELLED, reason=reason)
        self.kick()

    def withdraw(self, request_id: str, reason: str) -> bool:
        """Take a queued request out for someone else's reason (an admin's cancel); False
        if it was not queued. A spawner that waits for it is the caller's to end, as the
        Hub ends a spawn its user leaves (queuecontrol): a cancel, not a failure."""
        if not self.core.cancel(request_id):
            return False
        self._unclaimed.pop(request_id, None)
        self._left_queue(request_id, reason)
        self.kick()
        return True

    def _left_queue(self, request_id: str, reason: str) -> None:
        """A waiting request left the queue without a session: cancelled in the store, and
        when, in the event log (`CANCEL`; the request's row keeps no time for it)."""
        self.store.set_request_state(request_id, RequestState.CANCELLED, reason)
        self.store.append_event(time.time(), CANCEL, {"request": request_id, "reason": reason})

    def reprioritize(self, request_id: str, priority: int) -> int:
        """Give a queued request a new declared priority (it orders only its team's own
        queue); the old one. KeyError if it is not queued."""
        request = self.core.pending[request_id]
        self.store.set_request_priority(request_id, priority)
        self.core.pending[request_id] = replace(request, priority=priority)
        self.core.reconfigure()  # the kept queue order is built again from `pending`
        self.view.changed()
        self.kick()
        return request.priority

    def finish(
        self,
        request_id: str,
        *,
        state: RequestState = RequestState.FINISHED,
        reason: str | None = None,
    ) -> None:
        """The session ended: stop charging, free its slices and its port."""
        self._waiters.pop(request_id, None)
        self._respawning.discard(request_id)
        self.actuator.booking.release(request_id, state, reason)
        self.kick()

    def launch_failed(self, request_id: str, reason: str) -> None:
        """The session did not start: slices back, the request waits again at its old
        place in the queue (the spawner waits for the next grant)."""
        self.store.append_event(
            time.time(), "launch-failed", {"request": request_id, "reason": reason}
        )
        self.actuator.booking.requeue(request_id, reason)
        self.kick()

    # -- what spawners call: their session ---------------------------------------------------

    async def start_session(self, allocation: Allocation, ask: SessionLaunch) -> RunningSession:
        """Start the granted session; LaunchFailed if it does not (see the actuator)."""
        session = await self.actuator.start_session(allocation, ask)
        ready = time.time()
        self.store.append_event(
            ready,
            LAUNCHED,
            {
                "request": allocation.id,
                "node": allocation.node_names[0],
                "booked": allocation.start,
                "latency_s": ready - allocation.start,
            },
        )
        waited = allocation.start - allocation.request.submit
        if self.start_hook is not None and waited >= self.start_hook_after:
            request = allocation.request
            facts = {
                "user": request.user,
                "server": ask.identity.server,
                "team": request.team,
                "profile": request.profile or "",
                "node": allocation.node_names[0],
                "request": request.id,
                "waited_s": round(waited, 1),
                "funded": allocation.funded,
                "url": ask.base_url,
            }
            self._background_task(
                call_hook(self.start_hook, facts, self.start_hook_timeout, self.log)
            )
        return session

    async def poll_session(self, request_id: str, node: str, runtime_id: str) -> int | None:
        """None while the session runs (or cannot be asked); its exit status once ended."""
        actuator: SessionActuator | None = getattr(self, "actuator", None)
        if actuator is None:
            return None  # not even the configuration could be read: keep every session
        # In safe mode only the engine can say; no core holds slices to release.
        return await actuator.poll_session(request_id, node, runtime_id, release=self.started)

    async def stop_session(self, request_id: str, node: str, runtime_id: str) -> None:
        """End the session on its runtime (bounded) and free what it held. The old spawn
        of a request preempted and queued again only loses its runtime session (if one is
        left): the request, and a grant it may hold again, are the next spawn's."""
        actuator: SessionActuator | None = getattr(self, "actuator", None)
        if request_id in self._respawning:
            if actuator is not None:
                await actuator.stop_session(node, runtime_id)
            self.log.info("budgethub: %s's old spawn stopped; it waits again", request_id)
            return
        running = self.core.running.get(request_id) if self.started and request_id else None
        if actuator is not None:
            await actuator.stop_session(node, runtime_id, request_id)
        if running is not None:
            self._session_ended(running)
        if self.started and request_id:
            self.finish(request_id)

    # -- what spawners call: snapshots ----------------------------------------------------

    def remember_agent(self, request_id: str, agent: Agent) -> None:
        """A running session's agent, from its spawner's state (after a Hub restart)."""
        self.agents.setdefault(request_id, agent)

    def snapshots_of(self, user: str, server: str) -> list[SnapshotRecord]:
        """The server's snapshots, newest first (only ever this user's)."""
        if not self.started:
            return []
        found = self.store.list_snapshots(user=user, server=server)
        return [s for s in reversed(found) if s.user == user and s.server == server]

    def _ended_since(self, user: str, server: str) -> float:
        """When the server's latest session that ended other than by a preemption had
        started (0: none did)."""
        if self._ended is None:
            ended: dict[tuple[str, str], float] = {}
            for event in self.store.list_events(kind=SESSION_ENDED):
                key = (str(event.payload.get("user")), str(event.payload.get("server")))
                started = float(event.payload.get("started") or 0.0)
                ended[key] = max(ended.get(key, 0.0), started)
            self._ended = ended
        return self._ended.get((user, server), 0.0)

    def _session_ended(self, allocation: Allocation) -> None:
        """A session that ran was stopped (by its user, the Hub, or by itself): the
        server's snapshots taken before it started are no longer its latest state."""
        user, server = split_request_id(allocation.id)
        started = allocation.start
        self._ended_since(user, server)  # the cache is read before it is added to
        assert self._ended is not None
        self._ended[(user, server)] = max(self._ended.get((user, server), 0.0), started)
        self.store.append_event(
            time.time(),
            SESSION_ENDED,
            {"request": allocation.id, "user": user, "server": server, "started": started},
        )

    def offered_snapshot(self, user: str, server: str) -> SnapshotRecord | None:
        """The snapshot a start restores by itself: the server's newest, only while it is
        the server's latest state (taken at a preemption or an idle release, and no
        session of the server has run and been stopped since). None otherwise."""
        found = self.snapshots_of(user, server)
        if not found or found[0].created <= self._ended_since(user, server):
            return None
        return found[0]

    def restorable(self, user: str, server: str, key: str | None) -> SnapshotRecord | None:
        """The snapshot a start of ``user``'s ``server`` restores: ``key`` if given
        (ValueError when it is not one of this server's), else the offered one."""
        if key is None:
            return self.offered_snapshot(user, server)
        if not KEY_PATTERN.match(key):
            raise ValueError(f"{key!r} is not a snapshot key")
        record = self.store.get_snapshot(key) if self.started else None
        if record is None or record.user != user or record.server != server:
            # Another user's snapshot is answered like one that does not exist.
            raise ValueError(f"there is no snapshot {key} of this server")
        return record

    def snapshot_notice(self, user: str, server: str = "") -> str | None:
        """The offer of the server's snapshot, for the spawn form, the home page and My
        sessions: when and where it was taken and what comes back (plain text; None when
        nothing is offered)."""
        offered = self.offered_snapshot(user, server)
        if offered is None:
            return None
        return f"Stopped at {_when(offered.created)} on {offered.node}. " + snapshot_sentence(
            offered.report
        )

    def kept_snapshot_notice(
        self, user: str, server: str = "", running_since: float | None = None
    ) -> str | None:
        """A line about the server's newest snapshot when it is kept but not offered: what
        it holds, when it was taken, and that a start does not restore it. For a server
        whose session runs, ``running_since`` is when that session started. None when
        there is no such snapshot (none, or the one offered)."""
        found = self.snapshots_of(user, server)
        if not found:
            return None
        newest = found[0]
        if running_since is None:
            if self.offered_snapshot(user, server) is not None:
                return None
            then = (
                "A session of this server ran after it, so a start does not restore it; "
                "delete it when you no longer need it."
            )
        elif newest.created < running_since:
            then = (
                "This session started after it: once you stop this session, that snapshot "
                "is not offered again (delete it then if you no longer need it)."
            )
        else:
            return None
        count, notebooks = snapshot_holds(newest.report)
        holds = f"{count} in {notebooks}" if count else "no kernel state"
        return (
            f"An older snapshot, taken at {_when(newest.created)} on {newest.node}, is kept "
            f"({holds}). {then}"
        )

    def home_snapshot_notice(self, user: str) -> str | None:
        """The home page's line: each of the user's stopped servers whose snapshot is
        offered."""
        if not self.started:
            return None
        running = {split_request_id(r) for r in self.core.running} | {
            split_request_id(r) for r in self.core.pending
        }
        servers = sorted({s.server for s in self.store.list_snapshots(user=user)})
        lines = []
        for server in servers:
            if (user, server) in running:
                continue
            notice = self.snapshot_notice(user, server)
            if notice:
                lines.append(f"{'Server ' + server if server else 'Your server'}: {notice}")
        return " ".join(lines) or None

    def delete_snapshots(self, user: str, server: str | None) -> int:
        """Delete a server's snapshots (None: every one of the user's)."""
        if not self.started:
            return 0
        return self.actuator.delete_snapshots(user, server)

    def hold_port(self, port: int, request_id: str) -> None:
        if self.started:
            self.actuator.hold_port(port, request_id)

    # -- what spawners call: the read model ----------------------------------------------------

    def queue_status(self, request_id: str) -> QueueStatus | None:
        return self.view.queue_status(request_id)

    def team_of_groups(self, groups: list[str]) -> list[str]:
        """The user's groups that are teams with an allocation."""
        names = {t.name for t in self.core_teams}
        return [g for g in groups if g in names]

    def team_hint(self, team: str) -> str:
        """A short line about a team's budget: how much of it is used, per pool."""
        return self.view.team_hint(team, self.core_pools)


def settings_json(settings: Settings) -> dict[str, Any]:
    """Settings as plain JSON values (enums by their value)."""
    return {
        key: value.value if hasattr(value, "value") else value
        for key, value in asdict(settings).items()
    }


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))
