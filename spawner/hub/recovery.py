"""Restart recovery: running sessions and the queue as the store and the engines left
them, taken back into a new core.

A session the store says runs is adopted when it still runs, or when its node
does not answer yet (it may well still run); otherwise its slices are released.
Sessions of this Hub that ended while no Hub watched are removed. Waiting
requests re-enter the queue at their old place; their spawn options, the notices
users still have to read, and how often a debug session was stopped before it ran
its course (which sets its protection on its next start) come back from the event
log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler_core.model import Health, Team
from scheduler_core.scheduler import Scheduler
from scheduler_core.store import EventRecord, RequestState, Store
from spawner.hubapi import split_request_id
from spawner.readmodel.status import notices_from
from spawner.runtime.actuator import SessionActuator
from spawner.runtime.dockernodes import Answer
from spawner.runtime.spec import LABEL_PREFIX


@dataclass
class Recovered:
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Spawn options of the requests still waiting or running, by request id."""
    sessions: dict[tuple[str, str], str] = field(default_factory=dict)
    """(user, server name) -> request id, for spawners that come back."""
    notices: dict[tuple[str, str], str] = field(default_factory=dict)


async def recover(
    core: Scheduler,
    store: Store,
    actuator: SessionActuator,
    teams: tuple[Team, ...],
    now: float,
    lookback: float,
) -> Recovered:
    """Take the store's running sessions and queue back into ``core``."""
    found, unknown = await _survey_nodes(core, actuator, now)
    await _report_strangers(store, actuator, found, unknown, now)
    recovered = Recovered()
    _adopt_sessions(core, store, actuator, found, unknown, now, recovered)
    events = store.list_events()
    _requeue(core, store, teams, events, recovered)
    # Kept in the event log, so a Hub restart does not forget them.
    recovered.notices = notices_from(e for e in events if e.time >= now - lookback)
    for event in events:
        if event.kind != "submit":
            continue
        request_id = str(event.payload.get("request", ""))
        if request_id in core.pending or request_id in core.running:
            recovered.options[request_id] = dict(event.payload.get("options", {}))
    return recovered


async def _survey_nodes(
    core: Scheduler, actuator: SessionActuator, now: float
) -> tuple[dict[str, Mapping[str, str]], set[str]]:
    """(the labels of this Hub's running sessions by request id, the nodes that did not
    answer): each node's health set in ``core``; sessions that ended while no Hub
    watched are removed, as nothing holds them any more."""
    found: dict[str, Mapping[str, str]] = {}
    unknown: set[str] = set()
    """Nodes whose engine did not answer: their sessions may well still run."""
    for name, backend in actuator.backends.items():
        answer = await backend.ping()
        if answer is Answer.DRAINING:
            core.set_health(name, Health.DRAINING)  # it answers: its sessions are listed
        elif answer is not Answer.OK:
            down = answer in (Answer.REFUSED, Answer.DOWN)
            health = Health.DOWN if down else Health.UNREACHABLE
            core.set_health(name, health)
            if health is Health.UNREACHABLE:
                actuator.mark_unreachable(name, now)
                unknown.add(name)
            continue
        for session in await backend.sessions(actuator.hub_name):
            request_id = session.labels.get(f"{LABEL_PREFIX}.request", "")
            if session.running:
                found[request_id] = session.labels
            else:  # ended while no Hub watched: nothing holds it any more
                await backend.remove(session.id)
    return found, unknown


async def _report_strangers(
    store: Store,
    actuator: SessionActuator,
    found: Mapping[str, Mapping[str, str]],
    unknown: set[str],
    now: float,
) -> None:
    """Log and record what runs that the store does not know. Reported, never killed."""
    active = {a.id for a in store.active_allocations()}
    for request_id in sorted(set(found) - active):
        # Running, labelled by this Hub, but not a session the store holds: it holds
        # resources nothing charges. Reported, never killed blindly.
        actuator.log.warning(
            "budgethub: a session of this Hub runs that the store does not know: %s", request_id
        )
        store.append_event(now, "unknown", {"request": request_id})
    for name, backend in actuator.backends.items():
        foreign = getattr(backend, "foreign_jobs", None)
        if foreign is not None and name not in unknown:
            for job in await foreign():
                actuator.log.warning(
                    "budgethub: node %s: a job budgethub did not start: %s", name, job
                )
                store.append_event(now, "unknown", {"node": name, "job": job})


def _adopt_sessions(
    core: Scheduler,
    store: Store,
    actuator: SessionActuator,
    found: Mapping[str, Mapping[str, str]],
    unknown: set[str],
    now: float,
    recovered: Recovered,
) -> None:
    """The store's running sessions: adopted when found running (or on a node that did
    not answer), their ports held; the others' slices released."""
    for allocation in store.active_allocations():
        kept = allocation.id in found or bool(unknown & set(allocation.node_names))
        if kept and allocation.request.pool in core.pools:
            core.adopt(allocation)
            port = found.get(allocation.id, {}).get(f"{LABEL_PREFIX}.port")
            if port and port.isdigit():
                actuator.hold_port(int(port), allocation.id)
            _note(recovered, allocation.id)
            actuator.live.add(allocation.id)
        else:
            store.release(
                allocation.id,
                max(now, allocation.start),
                state=RequestState.FINISHED,
                reason="its session was gone when the Hub started",
            )


def _requeue(
    core: Scheduler,
    store: Store,
    teams: tuple[Team, ...],
    events: Sequence[EventRecord],
    recovered: Recovered,
) -> None:
    """Waiting requests back in the queue at their old place; those whose pool or team
    is no longer configured cancelled."""
    team_names = {t.name for t in teams}
    # A waiting request was stopped once per preempt event (request ids are new on each
    # spawn): the count sets a debug session's protection on its next start.
    stops = Counter(str(e.payload.get("request", "")) for e in events if e.kind == "preempt")
    for request in store.pending_requests():
        if request.pool not in core.pools or request.team not in team_names:
            store.set_request_state(
                request.id, RequestState.CANCELLED, "its pool or team is no longer configured"
            )
            continue
        core.submit(request, stops.get(request.id, 0))
        _note(recovered, request.id)


def _note(recovered: Recovered, request_id: str) -> None:
    try:
        recovered.sessions[split_request_id(request_id)] = request_id
    except ValueError:
        pass  # not a server's request (written by another tool): no spawner comes back
