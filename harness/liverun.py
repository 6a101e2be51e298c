"""A live run for `budgethub replay` (issue 51): a real Hub on the Docker runtime with
virtual GPUs runs a fixed, seeded scenario in real time, and its store is what the
replay then reads.

Two GPU nodes of two virtual GPUs (gpu-1, gpu-2) and a CPU node (prep-1) on the local
engine; three teams: nlp and vision with half of each pool, guests with none (their
sessions run unallocated). About forty sessions of the debug (a quarter GPU), notebook
(one GPU) and data-prep (one CPU) profiles are spawned through the Hub's REST API at
their seeded times. Each has a length of work in seconds and ends itself once it has
done it: its server is shut down from inside (Jupyter's /api/shutdown), so the Hub
sees the session exit, as a session that ends by itself. Guests' notebooks fill the GPUs
first and the funded work that follows stops them (restored later: every profile is
resumable), and gpu-2 is drained mid-run through the budget service's admin API and
returned to service later.

Why the driver reads its sessions' runs from the store: a session's work left after a
preemption is the simulator's own rule (`replay.kept_progress`, as `SimActuator.preempt`
counts it) applied to the runs the Hub recorded, so a restored session runs for what
the simulator would give it, and the replay's lengths are the ones the driver meant.
Every wait in the scenario is seconds long and every length tens of seconds, so a
late second on a loaded machine moves no start past another's.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import select

from harness.hub import ADMIN_TOKEN, Hub, remove_containers, start_hub
from scheduler_core.model import Request
from scheduler_core.research.replay import kept_progress
from scheduler_core.store import RequestState, Store
from scheduler_core.store.models import AllocationRow, RequestRow
from spawner.hubapi import split_request_id

SEED = 53
GUESTS_FIRST = 3
"""The guests' notebooks spawned first, a second apart: they take three of the four
GPUs, unallocated, and the funded work that follows stops them."""
COUNT = 42
"""Sessions in the run (the issue asks for 40 to 60)."""
SPAN = 230.0
"""Seconds over which they are submitted; the last ones end a minute or two later."""
DEADLINE = 480.0
"""Seconds after the start by which every session must have ended."""
DRAIN = ("gpu-2", 110.0, 170.0)
"""The node drained mid-run, when (seconds after the start), and when it is back."""
PREFIX = "/services/budget/"
RETRY_S = 1.0
"""Seconds before a session's shutdown is asked again when its server was not up (a
restore still starting it)."""

NODES = [
    {"name": "gpu-1", "pool": "gpu", "gpus": 2, "cpus": 8, "memory_gib": 16},
    {"name": "gpu-2", "pool": "gpu", "gpus": 2, "cpus": 8, "memory_gib": 16},
    {"name": "prep-1", "pool": "cpu", "cpus": 4, "memory_gib": 8},
]
TEAMS = [
    {"name": "nlp", "share": {"gpu": 0.5, "cpu": 0.5}},
    {"name": "vision", "share": {"gpu": 0.5, "cpu": 0.5}},
    {"name": "guests", "share": {"gpu": 0.0, "cpu": 0.0}},
]
USERS = {"nlp": ["ann", "cy"], "vision": ["bo", "di"], "guests": ["gus", "hal"]}
ADMIN = "boss"
GROUPS = {**USERS, "budget-admins": [ADMIN]}


def _profile(slug: str, klass: str, pool: str, image: str, min_runtime: str, **extra: Any) -> Any:
    return {
        "slug": slug,
        "display_name": slug,
        "description": f"the live run's {slug} profile",
        "class": klass,
        "pool": pool,
        "image": image,
        "cpus": 1,
        "memory_gib": 1,
        "min_runtime": min_runtime,
        "max_min_runtime": min_runtime,
        "resumable": True,
        **extra,
    }


PROFILES = [
    _profile(
        "debug", "debug", "gpu", "budgethub/gpu:latest", "45s", slices=[{"gpu_fraction": 0.25}]
    ),
    _profile("notebook", "interactive", "gpu", "budgethub/gpu:latest", "60s", gpus=[1]),
    _profile("dataprep", "dataprep", "cpu", "budgethub/dataprep:latest", "60s"),
]
OPTIONS: dict[str, dict[str, Any]] = {
    "debug": {"profile": "debug", "slices": "gpu-250m"},
    "notebook": {"profile": "notebook", "gpus": 1},
    "dataprep": {"profile": "dataprep"},
}
WORK = {"debug": (15.0, 30.0), "notebook": (30.0, 50.0), "dataprep": (20.0, 50.0)}
"""Seconds of work per profile (uniform between the two)."""
SETTINGS = {
    "idle_poll": 0.0,  # no agent asks: no session is idle (the scenario has no idle time)
    "unallocated_grace": 45.0,
    "snapshot_grace": 5.0,
    "cycle_tick": 1.0,
    "health_interval": 1.0,
}
"""The scheduler's settings for the run, scaled to seconds (the rest are defaults)."""


@dataclass(frozen=True)
class Session:
    """One session of the scenario."""

    index: int
    at: float
    """Seconds after the run's start when it is spawned."""
    team: str
    user: str
    profile: str
    work: float
    """Seconds of work; the session ends itself once it has done them."""

    @property
    def server(self) -> str:
        return f"r{self.index:02d}"

    @property
    def options(self) -> dict[str, Any]:
        return dict(OPTIONS[self.profile])


def plan_sessions(seed: int = SEED, count: int = COUNT, span: float = SPAN) -> list[Session]:
    """The scenario: the guests' notebooks first (`GUESTS_FIRST`), then a seeded mix of
    the three profiles and teams over ``span``."""
    rng = random.Random(seed)
    found = [
        Session(i, 1.0 + i, "guests", USERS["guests"][i % 2], "notebook", rng.uniform(70, 90))
        for i in range(GUESTS_FIRST)
    ]
    gap = (span - 12.0) / (count - len(found))
    at = 12.0
    while len(found) < count:
        profile = rng.choices(["debug", "notebook", "dataprep"], weights=[3, 4, 3])[0]
        # Guests' later work is data prep only: on the GPUs they would be stopped again
        # and again by each funded arrival (each a snapshot and a restore).
        teams = ["nlp", "vision", "guests"] if profile == "dataprep" else ["nlp", "vision"]
        team = rng.choices(teams, weights=[4, 4, 2][: len(teams)])[0]
        low, high = WORK[profile]
        found.append(
            Session(
                len(found),
                round(at, 1),
                team,
                rng.choice(USERS[team]),
                profile,
                round(rng.uniform(low, high), 1),
            )
        )
        at += rng.uniform(0.4, 1.6) * gap
    return found


def scenario(sessions: list[Session]) -> dict[str, Any]:
    """The run as a simulator scenario (`scheduler_core.scenario`), as planned: what the
    scenario asks of the policy, before any live second is lost (a check of the plan)."""
    profiles = {p["slug"]: p for p in PROFILES}
    requests_ = []
    for s in sessions:
        profile = profiles[s.profile]
        shape: dict[str, Any] = {"gpus": 1} if s.profile == "notebook" else {}
        if s.profile == "debug":
            shape = {"gpu_fraction": 0.25}
        requests_.append(
            {
                "id": f"{s.user}/{s.server}",
                "user": s.user,
                "team": s.team,
                "pool": profile["pool"],
                "submit": s.at,
                "cpus": 1,
                "memory_gib": 1,
                "min_runtime": float(profile["min_runtime"].removesuffix("s")),
                "duration": s.work,
                "resumable": True,
                "class": profile["class"],
                "profile": s.profile,
                **shape,
            }
        )
    node, drained, back = DRAIN
    return {
        "name": "live-run",
        "horizon": DEADLINE,
        "pools": [{"name": "gpu", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"}],
        "nodes": NODES,
        "teams": TEAMS,
        "policy": {k: v for k, v in SETTINGS.items() if k in ("unallocated_grace", "cycle_tick")},
        "requests": requests_,
        "events": [
            {"at": drained, "node": node, "state": "draining"},
            {"at": back, "node": node, "state": "ready"},
        ],
    }


def hub_extra() -> str:
    return "".join(f"c.BudgetScheduler.{k} = {v!r}\n" for k, v in SETTINGS.items())


@dataclass
class Outcome:
    """What the driver saw of the run."""

    store_url: str
    started: float
    """Epoch seconds of the run's start (the first spawn is a second later)."""
    ended: float
    sessions: list[Session]
    spawn_status: dict[str, int] = field(default_factory=dict)
    """Server → the HTTP status of its spawn's POST (201 started, 202 queued)."""
    shutdowns: dict[str, int] = field(default_factory=dict)
    """Server → how many times its session ended itself (one per run it finished)."""
    drained: tuple[float, float] = (0.0, 0.0)
    """Epoch seconds of the drain and of the node's return (the admin API's answers)."""
    problems: list[str] = field(default_factory=list)


class Driver:
    """Spawns the scenario's sessions at their times, ends each once its work is done,
    drains and returns the node, and waits until every session has ended."""

    def __init__(self, hub: Hub, sessions: list[Session], admin_token: str) -> None:
        self.hub = hub
        self.sessions = {(s.user, s.server): s for s in sessions}
        self.store_url = f"sqlite:///{hub.directory}/budgethub.sqlite"
        self.admin_token = admin_token
        self.pool = ThreadPoolExecutor(max_workers=12, thread_name_prefix="liverun")
        self.stopping: dict[tuple[str, float], tuple[Future[int], float]] = {}
        """(request, its run's start) → the shutdown asked of that run, and when."""
        self.requests: dict[str, Request] = {}
        self.outcome = Outcome(self.store_url, 0.0, 0.0, sessions)
        self._lock = threading.Lock()

    # -- the Hub's REST API (one session per call: requests' Session is not thread-safe) --

    def _post(self, url: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"token {ADMIN_TOKEN}"}
        return requests.post(url, headers=headers, timeout=60, **kwargs)

    def _spawn(self, session: Session) -> int:
        url = f"{self.hub.api}/users/{session.user}/servers/{session.server}"
        status = self._post(url, json=session.options).status_code
        with self._lock:
            self.outcome.spawn_status[session.server] = status
        return status

    def _shutdown(self, user: str, server: str) -> int:
        """Ask the session's own server to shut down (through the proxy, as its user's
        browser would); 200 once it is on its way out."""
        try:
            return self._post(f"{self.hub.url}/user/{user}/{server}/api/shutdown").status_code
        except requests.RequestException:
            return 0

    def _node(self, node: str, state: str) -> float:
        response = requests.patch(
            f"{self.hub.url}{PREFIX}api/v1/admin/nodes/{node}",
            json={"state": state},
            headers={"Authorization": f"token {self.admin_token}"},
            timeout=30,
        )
        if response.status_code != 200:
            self.outcome.problems.append(f"{state} {node}: {response.status_code} {response.text}")
        return time.time()

    # -- the store: each request's runs --------------------------------------------------

    def _runs(self, store: Store) -> dict[str, list[tuple[float, float | None]]]:
        query = (
            select(AllocationRow.request_id, AllocationRow.start_time, AllocationRow.end_time)
            .join(RequestRow, AllocationRow.request_id == RequestRow.id)
            .order_by(AllocationRow.id)
        )
        runs: dict[str, list[tuple[float, float | None]]] = {}
        with store.engine.connect() as connection:
            for request_id, start, end in connection.execute(query):
                runs.setdefault(request_id, []).append((start, end))
        return runs

    def _due(self, request: Request, work: float, runs: list[tuple[float, float | None]]) -> float:
        """When the running (last) run has done the session's work left: the runs before
        it were preempted, and each kept what the simulator's rule keeps."""
        done = restart = 0.0
        for start, end in runs[:-1]:
            assert end is not None
            done += kept_progress(request, end - start, restart)
            restart = request.restart_seconds
        start = runs[-1][0]
        return start + restart + max(0.0, work - done)

    def _end_due_sessions(self, store: Store, now: float) -> None:
        for request_id, runs in self._runs(store).items():
            start, end = runs[-1]
            if end is not None:
                continue
            user, server = split_request_id(request_id)
            session = self.sessions.get((user, server))
            if session is None:
                continue
            if request_id not in self.requests:
                self.requests[request_id] = store.load_request(request_id)
            if now < self._due(self.requests[request_id], session.work, runs):
                continue
            asked = self.stopping.get((request_id, start))
            if asked is not None:
                future, when = asked
                if not future.done() or future.result() == 200 or now - when < RETRY_S:
                    continue  # asked already; a server not up yet is asked again later
            self.stopping[(request_id, start)] = (
                self.pool.submit(self._shutdown, user, server),
                now,
            )

    def _all_ended(self, store: Store) -> bool:
        with store.engine.connect() as connection:
            states = dict(connection.execute(select(RequestRow.id, RequestRow.state)).all())
        ended = {RequestState.FINISHED.value, RequestState.CANCELLED.value}
        mine = {
            rid: str(getattr(state, "value", state))
            for rid, state in states.items()
            if split_request_id(rid) in self.sessions
        }
        return len(mine) == len(self.sessions) and all(s in ended for s in mine.values())

    def run(self, log: Callable[[str], None] = print) -> Outcome:
        sessions = sorted(self.sessions.values(), key=lambda s: s.at)
        for user in {s.user for s in sessions}:
            self._post(f"{self.hub.api}/users/{user}")
        node, drain_at, back_at = DRAIN
        t0 = self.outcome.started = time.time()
        spawns: list[Future[int]] = []
        store = Store.create(self.store_url, migrate_schema=False)
        try:
            drained = back = 0.0
            while True:
                now = time.time()
                elapsed = now - t0
                while sessions and sessions[0].at <= elapsed:
                    spawns.append(self.pool.submit(self._spawn, sessions.pop(0)))
                if not drained and elapsed >= drain_at:
                    drained = self._node(node, "draining")
                    log(f"liverun: {node} drained at {drained - t0:.1f} s")
                if drained and not back and elapsed >= back_at:
                    back = self._node(node, "ready")
                    log(f"liverun: {node} back at {back - t0:.1f} s")
                self._end_due_sessions(store, now)
                if not sessions and back and self._all_ended(store):
                    break
                if elapsed > DEADLINE:
                    self.outcome.problems.append(
                        f"not every session ended within {DEADLINE:g} s of the start"
                    )
                    break
                time.sleep(0.25)
            self.outcome.drained = (drained, back)
        finally:
            store.close()
            for spawned in spawns:
                spawned.cancel()
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.outcome.ended = time.time()
        for (request_id, _start), (asked, _when) in self.stopping.items():
            if asked.done() and asked.result() == 200:
                server = split_request_id(request_id)[1]
                self.outcome.shutdowns[server] = self.outcome.shutdowns.get(server, 0) + 1
        return self.outcome


def user_token(hub: Hub, user: str) -> str:
    """A token of ``user`` (the admin's, for the budget service's admin API)."""
    hub.http.post(f"{hub.api}/users/{user}", timeout=10)
    response = hub.http.post(
        f"{hub.api}/users/{user}/tokens", json={"note": "live run"}, timeout=10
    )
    response.raise_for_status()
    return str(response.json()["token"])


def wait_for_service(hub: Hub, token: str, timeout: float = 60.0) -> None:
    """Until the budget service (started by the Hub) answers its admin API."""
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"token {token}"}
    while time.monotonic() < deadline:
        try:
            url = f"{hub.url}{PREFIX}api/v1/admin"
            if requests.get(url, headers=headers, timeout=10).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the budget service did not answer in {timeout:g} s")


def start_live_hub(directory: Path, hub_name: str) -> Hub:
    """The run's Hub (not started: `Hub.start`)."""
    return start_hub(
        directory,
        hub_name=hub_name,
        nodes=NODES,
        teams=TEAMS,
        groups=GROUPS,
        profiles=PROFILES,
        extra=hub_extra(),
        start=False,
    )


def live_run(hub: Hub, log: Callable[[str], None] = print) -> Outcome:
    """Run the scenario on a started ``hub`` (`start_live_hub`); every session has ended
    when it returns, or the outcome's problems say what did not."""
    token = user_token(hub, ADMIN)
    wait_for_service(hub, token)
    return Driver(hub, plan_sessions(), token).run(log)


def replay_report(outcome: Outcome, directory: Path, *extra: str) -> tuple[dict[str, Any], str]:
    """`budgethub replay` on the run's store over the run's period (``extra``: more
    flags, such as a what-if): its JSON report, and what it printed."""
    path = directory / "replay.json"
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "budgethub"),
            "replay",
            outcome.store_url,
            "--since",
            f"{outcome.started - 1:.3f}",
            "--until",
            f"{outcome.ended + 1:.3f}",
            "--json",
            str(path),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"budgethub replay failed: {done.stderr.strip()}")
    found: dict[str, Any] = json.loads(path.read_text())
    return found, done.stdout


def figures(report: dict[str, Any]) -> dict[str, float]:
    """The replay's agreement with the live run, as `python -m bench` names it."""
    comparison = report["comparison"]
    return {
        "order_agreement": float(comparison["order_agreement"]),
        "wait_error_p50_s": float(comparison["wait_abs_error_s"]["p50"]),
        "wait_error_p90_s": float(comparison["wait_abs_error_s"]["p90"]),
    }


def live_figures(directory: Path, hub_name: str) -> dict[str, float]:
    """The live run in ``directory`` (its Hub stopped and its containers removed after),
    replayed: `figures` of its report. RuntimeError if the run did not complete."""
    hub = start_live_hub(directory, hub_name)
    try:
        hub.start()
        outcome = live_run(hub)
    finally:
        hub.stop()
        remove_containers(hub_name)
    if outcome.problems:
        raise RuntimeError(f"the live run did not complete: {outcome.problems}")
    report, _printed = replay_report(outcome, directory)
    return figures(report)
