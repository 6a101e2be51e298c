"""BudgetSpawner: a JupyterHub spawner whose sessions the budget scheduler places.

``start()`` checks the user's options against the profiles, submits a request
to the embedded scheduler, streams the queue position through ``progress()``
while it waits, then starts the session on the granted node with exactly
the granted GPUs and returns only once the server answers (the Hub's own
readiness polling then succeeds at once). The spawner owns the queue wait:
``start_timeout`` is derived from ``max_queue_wait``, so JupyterHub never
kills a queued spawn.

A user who leaves the queue (the spawn page's "Stop Server") is not shown a server
that was never there: ``ready`` stays false for a cancelled start, so the Hub's
progress streams end with "Spawn cancelled" rather than a false "ready" (which sent
the page round a redirect loop), and the spawn form says they left the queue.
"""

from __future__ import annotations

import asyncio
import html
import secrets
import time
from typing import Any

from jupyterhub.spawner import Spawner, SpawnException
from traitlets import Integer, List, default

from scheduler_core.model import Allocation, Request
from scheduler_core.store import RequestState
from spawner.hub import queuecontrol
from spawner.hub.embedded import BudgetScheduler, LaunchFailed, QueueStatus, SessionLaunch, Waiter
from spawner.profiles import (
    FORM_FIELDS,
    SNAPSHOT_FIELDS,
    FormError,
    Profile,
    SessionSpec,
    SliceOption,
    capped,
    human_duration,
    parse_profiles,
    render_form,
    render_snapshot_choice,
    resolve,
    snapshot_choice,
)
from spawner.readmodel.status import Outlook, estimate_words, not_funded_words, verdict_words
from spawner.runtime.actuator import Agent
from spawner.runtime.spec import DEFAULT_PIDS_LIMIT, SessionIdentity


class Refusal(SpawnException):  # type: ignore[misc]
    """A spawn refused for the user's input: a 400 whose message names the field.

    Tornado logs an ``HTTPError``'s ``get_message()`` as a WARNING of its own; the Hub
    already logs a refused spawn ("Not starting …'s server", made one WARNING line by
    ``logfilters.QuietRefusalFilter``), so here it is empty and the refusal is logged
    once. The user still gets the message (the Hub's pages and API read ``message``
    and ``jupyterhub_message``)."""

    def get_message(self) -> str:
        return ""


DEFAULT_PROFILES: list[dict[str, Any]] = [
    {
        "slug": "gpu-notebook",
        "display_name": "GPU notebook",
        "description": "JupyterLab with whole GPUs",
        "class": "interactive",
        "pool": "gpu",
        "image": "budgethub/gpu:latest",
        "gpus": [1, 2, 4, 8],
        "cpus": 2,
        "memory_gib": 4,
        "min_runtime": "1h",
        "max_min_runtime": "8h",
    },
    {
        "slug": "debug",
        "display_name": "Debug session",
        "description": "a slice of a GPU; starts fast",
        "class": "debug",
        "pool": "gpu",
        "image": "budgethub/gpu:latest",
        "slices": [{"gpu_fraction": 0.25}, {"gpus": 1}],
        "cpus": 1,
        "memory_gib": 2,
        "min_runtime": "15m",
        "max_min_runtime": "15m",
    },
    {
        "slug": "dataprep",
        "display_name": "Data-prep session",
        "description": "CPU only, next to storage (pandas, pyarrow, duckdb)",
        "class": "dataprep",
        "pool": "cpu",
        "image": "budgethub/dataprep:latest",
        "cpus": 2,
        "memory_gib": 4,
        "storage": ["weka-a"],
        "min_runtime": "1h",
        "max_min_runtime": "8h",
    },
]


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


def outlook_words(outlook: Outlook) -> str:
    """One line of the form: ``would be funded, protected for 1 h; starts now`` or
    ``would run unallocated (over what …); 2 ahead in the queue; estimated start …``."""
    if outlook.funded:
        funding = f"would be funded, protected for {human_duration(outlook.protected_s)}"
    else:
        funding = f"would run unallocated, preemptible: {outlook.why}"
    wait = estimate_words(
        outlook.funded,
        outlook.estimated_start,
        time.time(),
        starts_now=outlook.starts_now,
        basis=outlook.basis,
    )
    if outlook.position > 1 and not outlook.starts_now:
        wait = f"{outlook.position - 1} ahead in the queue; {wait}"
    return f"{funding}; {wait}"


class BudgetSpawner(Spawner):  # type: ignore[misc]
    """Sessions on the nodes the budget scheduler chooses, in whichever runtime runs them
    (Docker containers on the nodes' engines, or Slurm jobs)."""

    profile_list = List(
        DEFAULT_PROFILES,
        help="""Profiles a user picks from: [{'slug', 'display_name', 'description', 'class'
        (debug, interactive, batch, dataprep), 'pool', 'image', 'cpus', 'memory_gib',
        'gpus': [1, 2, 4, 8] or 'slices': [{'gpus': 1} | {'mig': '1g.18gb'} |
        {'gpu_fraction': 0.25}], 'min_runtime', 'max_min_runtime', 'resumable', 'labels',
        'storage': [names]}]""",
    ).tag(config=True)

    pids_limit = Integer(
        DEFAULT_PIDS_LIMIT,
        help="""Most processes and threads one session may run at once (the container's
        PID limit); 0 for none. A fork bomb in a notebook then fails inside its
        container instead of taking the node's PIDs.""",
    ).tag(config=True)

    @default("start_timeout")
    def _default_start_timeout(self) -> int:
        scheduler = self.scheduler
        return int(scheduler.max_queue_wait + scheduler.launch_timeout + 60)

    @default("options_form")
    def _default_options_form(self) -> Any:
        return BudgetSpawner._render_options_form

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        return BudgetSpawner._accept_user_options

    @staticmethod
    def _accept_user_options(spawner: Any, user_options: dict[str, Any]) -> None:
        """The options are this spawner's own: ``start()`` checks them all (``resolve``)
        and refuses with a 400 naming the field. Handled here so that the Hub does not
        warn "unhandled user_options" on every spawn."""

    @property
    def ready(self) -> bool:
        """The Hub's "is the server up": never for a start the user cancelled (the Hub
        would otherwise call it ready in the second between the cancel and the stop)."""
        if self._left_queue:
            return False
        return bool(super().ready)

    @property
    def launched(self) -> bool:
        """Did this start reach the runtime (and so perhaps the proxy's routes)?"""
        return bool(self.runtime_id)

    @property
    def budget_phase(self) -> str:
        """``queued``, ``launching``, ``submitting`` or ``withdrawn`` (an admin's cancel)
        while a start is pending, else ``""`` (the Hub's templates read it)."""
        return self._phase if self._spawn_pending else ""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.request_id: str | None = None
        self.node: str | None = None
        self.runtime_id: str | None = None
        """The runtime's id for the session: a Docker container id, a Slurm job id."""
        self.last_options: dict[str, Any] = {}
        self._waiter: Waiter | None = None
        self._failure = ""
        """Why the last start failed, while the request waits again."""
        self._phase = "submitting"
        self._phase_changed = asyncio.Event()
        self._left_queue = False
        """The user cancelled this start while it waited (see ``ready``)."""
        self._withdrawn = ""
        """An administrator's cancel of this start, in the words its user is shown."""
        self._typed: dict[str, Any] = {}
        """What the user last posted on the form (shown again, once, with its refusal)."""
        self.agent: Agent | None = None
        """How the scheduler reaches this session's agent (its secret is per start)."""
        self._restore: tuple[str | None, bool] = (None, False)
        """The snapshot this start asked for (None: the newest) and whether to start fresh."""

    # -- helpers -------------------------------------------------------------------

    @property
    def scheduler(self) -> BudgetScheduler:
        return BudgetScheduler.instance(config=self.config)

    @property
    def _prefix(self) -> str:
        return f"{self.user.name}:{self.name}"

    def _profiles(self) -> list[Profile]:
        scheduler = self.scheduler
        try:
            profiles = parse_profiles(
                self.profile_list, scheduler.core_settings(), [p["name"] for p in scheduler.pools]
            )
            if scheduler.started:  # the admin's max_min_runtime, not only the configured one
                return capped(profiles, scheduler.settings.max_min_runtime)
            return profiles
        except FormError as error:
            raise SpawnException(
                f"The spawner's profile_list is misconfigured ({error}); tell an administrator.",
                reason="config",
                status_code=500,
            ) from None

    def _user_teams(self) -> list[str]:
        return self.scheduler.team_of_groups([g.name for g in self.user.groups])

    def _set_phase(self, phase: str) -> None:
        self._phase = phase
        self._phase_changed.set()

    # -- the form ------------------------------------------------------------------

    async def _render_options_form(self) -> str:
        scheduler = self.scheduler
        await scheduler.ensure_started(self.hub.api_url)
        if not scheduler.started:
            return f'<div class="alert alert-danger">{html.escape(self._broken_message())}</div>'
        teams = self._user_teams()
        notice = scheduler.notices.get((self.user.name, self.name))
        parts = []
        if notice:
            parts.append(self._notice_html(notice))
        if not teams:
            parts.append(self._no_team_message())
            return "\n".join(parts)
        offered = scheduler.offered_snapshot(self.user.name, self.name)
        if offered is not None:
            parts.append(render_snapshot_choice(offered.key, self._snapshot_words()))
        profiles = self._profiles()
        view = scheduler.view
        pools = list(dict.fromkeys(p.pool for p in profiles))
        hints = {
            team: "; ".join(view.team_status(team, pool).line() for pool in pools) for team in teams
        }
        outlooks: dict[tuple[str, str], str] = {}
        free: dict[tuple[str, str], int] = {}
        for profile in profiles:
            for option in profile.slices:
                free[(profile.slug, option.slug)] = view.free_count(
                    self._what_if(profile, option, teams[0]), slices_only=True
                )
            for team in teams:
                outlook = view.outlook(self._what_if(profile, profile.slices[0], team))
                outlooks[(profile.slug, team)] = outlook_words(outlook)
        parts.append(
            render_form(
                profiles,
                teams,
                hints,
                outlooks=outlooks,
                free=free,
                defaults=self._typed or self.last_options,
            )
        )
        # What a refused form held is shown once, with its refusal; the next form shows
        # the last accepted options again (a refused spawn's options do not outlive it).
        self._typed = {}
        return "\n".join(parts)

    def _notice_html(self, notice: str) -> str:
        """The form's notice. An admin's cancel is a notice, not a failure: a heading of
        its own, and shown once (seen here, it is gone from the form and My sessions)."""
        if not queuecontrol.is_cancel_notice(notice):
            return f'<div class="alert alert-warning budgethub-notice">{html.escape(notice)}</div>'
        queuecontrol.notice_seen(self.scheduler, self.user.name, self.name)
        return (
            '<div class="alert alert-info budgethub-notice budgethub-cancelled" role="status">'
            f'<h2 class="h5 alert-heading">{html.escape(queuecontrol.CANCEL_HEADING)}</h2>'
            f'<p class="mb-0">{html.escape(notice)}</p></div>'
        )

    def withdrawn(self, message: str) -> None:
        """An administrator took this start's request out of the queue (queuecontrol):
        the open spawn pages say so, in ``message``, before the Hub cancels the spawn."""
        self._withdrawn = message
        self._set_phase("withdrawn")

    def _no_team_message(self) -> str:
        """No team pays for this user: say so, whom to ask (or, to an administrator, what
        to change), and offer no Start button (the spawn template leaves it out when it
        sees ``data-budgethub-no-team``)."""
        known = ", ".join(t.name for t in self.scheduler.core_teams) or "none yet"
        return (
            '<div class="alert alert-warning" data-budgethub-no-team>'
            "<strong>You are in no team, so no session can start for you.</strong> "
            f"Sessions are paid for by a team's share of the cluster (teams here: "
            f"{html.escape(known)}); {html.escape(self._no_team_words())}.</div>"
        )

    def _no_team_words(self) -> str:
        """What a user in no team can do: ask an administrator, naming them; an
        administrator is told what to change instead of to ask themselves."""
        if getattr(self.user, "admin", False):
            base = getattr(getattr(self, "hub", None), "base_url", None) or "/hub/"
            return (
                "as an administrator, add yourself to a team's group on the admin page "
                f"({base}admin#/groups: a team's members are the members of the group of "
                "its name), or declare a team for one of your groups in "
                "c.BudgetScheduler.teams"
            )
        admins = sorted(getattr(self.authenticator, "admin_users", None) or ())
        if admins:
            return f"ask an administrator ({', '.join(admins)}) to add you to one"
        return "ask an administrator of this Hub to add you to one"

    def _what_if(
        self, profile: Profile, option: SliceOption, team: str, spec: SessionSpec | None = None
    ) -> Request:
        """The request a session of this profile and team would be, asked for now."""
        return Request(
            id=f"{self.user.name}/{self.name}/what-if",
            user=self.user.name,
            team=team,
            pool=profile.pool,
            submit=time.time(),
            gpus=option.gpus,
            gpu_milli=option.gpu_milli,
            mig=option.mig,
            cpus=profile.cpus,
            memory_gib=profile.memory_gib,
            labels=dict(spec.labels if spec is not None else profile.labels),
            min_runtime=spec.min_runtime if spec is not None else profile.min_runtime,
            resumable=profile.resumable,
            klass=profile.klass,
            profile=profile.slug,
        )

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        """Form fields arrive as lists; keep single values, and refuse a bad form here,
        before any spawn begins (the form comes back with the refusal and what was typed;
        ``start()`` checks again, for options that come straight from the REST API)."""
        options: dict[str, Any] = {}
        for key, values in formdata.items():
            if key.startswith("_"):
                continue  # the Hub's own fields (_xsrf)
            if key not in FORM_FIELDS and key not in SNAPSHOT_FIELDS:
                options[key] = values
                continue
            kept = [v for v in values if v != ""]
            if kept:
                options[key] = kept[0] if len(kept) == 1 else kept
        self._typed = dict(options)
        if self.scheduler.started:
            self._spec(options)
        return options

    # -- state ---------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.request_id:
            state["request_id"] = self.request_id
        if self.node:
            state["node"] = self.node
        if self.runtime_id:
            state["runtime_id"] = self.runtime_id
        if self.port:
            state["port"] = self.port
        if self.last_options:
            state["last_options"] = self.last_options
        if self.agent:
            state["agent"] = dict(self.agent.__dict__)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.request_id = state.get("request_id")
        self.node = state.get("node")
        # A Hub that ran an earlier version stored it as "container_id"; get_state
        # writes "runtime_id" from then on.
        self.runtime_id = state.get("runtime_id") or state.get("container_id")
        self.port = int(state.get("port", 0))
        self.last_options = dict(state.get("last_options", {}))
        if self.port and self.request_id:
            self.scheduler.hold_port(self.port, self.request_id)
        self.agent = Agent.from_state(state.get("agent"))
        if self.agent is not None and self.request_id:
            self.scheduler.remember_agent(self.request_id, self.agent)

    def clear_state(self) -> None:
        """Forget the ended session; ``last_options`` (the form's defaults) outlive it.

        A request still queued leaves the queue, and the spawn form says so."""
        super().clear_state()
        if self.request_id and not self.runtime_id:
            scheduler = self.scheduler
            if scheduler.started:
                self._note_left_queue()
                scheduler.cancel(self.request_id, "the spawn was cancelled")
                how = "was taken out of" if self._withdrawn else "left"
                self.log.info("%s: %s %s the queue", self._prefix, self.request_id, how)
        self.request_id = None
        self.node = None
        self.runtime_id = None
        self.port = 0
        self.agent = None

    def _note_left_queue(self) -> None:
        """The spawn form's notice for a request that leaves the queue (if it is queued)."""
        scheduler = self.scheduler
        if not self.request_id or not scheduler.started or self._withdrawn:
            return  # an administrator's cancel says why itself
        if scheduler.preempted_again(self.request_id):
            return  # it did not leave: preempted, it waits again (the preemption's notice)
        status = scheduler.queue_status(self.request_id)
        if status is not None:
            scheduler.notices[(self.user.name, self.name)] = (
                f"You left the queue at {_clock(time.time())} (you were at position "
                f"{status.position} of {status.waiting} in the pool). Nothing was "
                "started and your team was charged nothing; start again below."
            )

    # -- start ---------------------------------------------------------------------

    def _broken_message(self) -> str:
        return (
            "The budget scheduler is not running, so no session can start now "
            f"({self.scheduler.broken}). Running sessions are kept; an administrator has "
            "been told in the Hub's log."
        )

    def _refuse(self, message: str, reason: str) -> SpawnException:
        """A 400 for the user's options, which are forgotten (see ``_forget_refused``).

        The Hub logs it (its "Not starting …'s server" or "Failed to spawn … with form"
        line, which ``logfilters.QuietRefusalFilter`` makes one WARNING); here only at
        debug level."""
        self.log.debug("%s: refused: %s", self._prefix, message)
        self._forget_refused()
        refusal = Refusal(message, reason=reason, status_code=400)
        # What the Hub's pages show: the message alone, not "400 SpawnException(…)".
        refusal.jupyterhub_message = message
        return refusal

    def _forget_refused(self) -> None:
        """Options of a refused spawn must not outlive it (issue 41).

        JupyterHub saves the options of every spawn as the server's ``user_options``
        before ``start()`` sees them, and a later spawn with no options (a POST with no
        body or ``null``, the admin page's "Start Server") takes them from there: the
        refused options, refused again. Put back the options of the last spawn that was
        accepted (the form's defaults too), or none."""
        kept = dict(self.last_options)
        self.user_options = kept
        orm_spawner = getattr(self, "orm_spawner", None)
        if orm_spawner is not None and orm_spawner.user_options != kept:
            orm_spawner.user_options = dict(kept)  # committed as the Hub clears the spawn

    def _spec(self, options: dict[str, Any]) -> SessionSpec:
        teams = self._user_teams()
        if not teams:
            raise self._refuse(
                f"Cannot start: team: you are in no team that has an allocation; "
                f"{self._no_team_words()}.",
                "form",
            )
        try:
            asked = {k: v for k, v in options.items() if k not in SNAPSHOT_FIELDS}
            spec = resolve(asked, self._profiles(), teams)
        except FormError as error:
            raise self._refuse(f"Cannot start: {error.field}: {error.reason}.", "form") from None
        why = self.scheduler.check_placeable(
            self._what_if(spec.profile, spec.slices, spec.team, spec)
        )
        if why:
            raise self._refuse(
                f"Cannot start {spec.profile.display_name} with {spec.slices.display_name}: "
                f"{why}. Pick fewer GPUs or another profile.",
                "capacity",
            )
        return spec

    def _request(self, options: dict[str, Any]) -> Request:
        spec = self._spec(options)
        profile = spec.profile
        request = Request(
            id=self.scheduler.new_request_id(self.user.name, self.name),
            user=self.user.name,
            team=spec.team,
            pool=profile.pool,
            submit=time.time(),
            gpus=spec.slices.gpus,
            gpu_milli=spec.slices.gpu_milli,
            mig=spec.slices.mig,
            cpus=profile.cpus,
            memory_gib=profile.memory_gib,
            labels=spec.labels,
            min_runtime=spec.min_runtime,
            resumable=profile.resumable,
            priority=spec.priority,
            klass=profile.klass,
            profile=profile.slug,
        )
        return request

    async def start(self) -> tuple[str, int]:
        scheduler = self.scheduler
        await scheduler.ensure_started(self.hub.api_url)
        if not scheduler.started:
            raise SpawnException(self._broken_message(), reason="scheduler", status_code=503)
        options = dict(self.user_options or {})
        self._restore = self._snapshot_choice(options)
        options = {k: v for k, v in options.items() if k not in SNAPSHOT_FIELDS}
        self._left_queue = False
        self._withdrawn = ""
        self._typed = {}
        self._set_phase("submitting")
        try:
            return await self._start(scheduler, options)
        except asyncio.CancelledError:
            self._left_queue = True  # the user cancelled (or the Hub is shutting down)
            self._note_left_queue()  # before the stop: open spawn pages go to the form now
            raise

    async def _start(self, scheduler: BudgetScheduler, options: dict[str, Any]) -> tuple[str, int]:
        existing = scheduler.find_request(self.user.name, self.name)
        if existing is not None:
            # A spawn queued before a Hub restart: take its place in the queue again.
            request_id = existing
            waiter = scheduler.attach(existing)
            self.log.info("%s: rejoining queued request %s", self._prefix, request_id)
        else:
            request = self._request(options)
            request_id = request.id
            waiter = scheduler.submit(request, options)
            self.log.info(
                "%s: submitted %s (%s, team %s)",
                self._prefix,
                request_id,
                request.profile,
                request.team,
            )
        scheduler.notices.pop((self.user.name, self.name), None)
        self.request_id = request_id
        self.last_options = options
        deadline = time.monotonic() + scheduler.max_queue_wait
        for attempt in range(1, scheduler.launch_attempts + 1):
            allocation = await self._await_grant(request_id, waiter, deadline)
            try:
                return await self._launch(allocation)
            except LaunchFailed as failure:
                if scheduler.preempted_again(request_id):
                    # Stopped for other work while it started: it waits in the queue again
                    # and the scheduler spawns it anew (this spawn is the Hub's to end).
                    raise SpawnException(
                        f"Your session was stopped while it started ({failure.reason}); it "
                        "waits in the queue again and starts by itself.",
                        reason="preempted",
                        status_code=503,
                    ) from None
                if failure.final or attempt == scheduler.launch_attempts:
                    scheduler.finish(request_id, state=RequestState.CANCELLED, reason=str(failure))
                    tries = f" (attempt {attempt} of {scheduler.launch_attempts})"
                    raise SpawnException(
                        f"Your session was granted but it did not start{tries}: {failure}",
                        reason="launch",
                        status_code=500,
                    ) from None
                self._failure = (
                    f"The last start, on node {failure.node}, failed ({failure.reason}); "
                    f"queued again at the same place (attempt {attempt + 1} of "
                    f"{scheduler.launch_attempts}). "
                )
                self.log.warning("%s: launch failed, queued again: %s", self._prefix, failure)
                scheduler.launch_failed(request_id, failure.reason)
                waiter = scheduler.attach(request_id)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _await_grant(self, request_id: str, waiter: Waiter, deadline: float) -> Allocation:
        scheduler = self.scheduler
        self._waiter = waiter
        self._set_phase("queued")
        try:
            return await asyncio.wait_for(
                asyncio.shield(waiter.future), timeout=max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            scheduler.cancel(request_id, "waited the maximum queue time")
            raise SpawnException(
                f"Your session waited {scheduler.max_queue_wait / 3600:g} h in the queue, the "
                "most this Hub allows, and was withdrawn. Try a smaller profile or try later.",
                reason="queue-timeout",
                status_code=503,
            ) from None
        except asyncio.CancelledError:
            # A user's cancel is followed by the Hub stopping the server (clear_state takes
            # the request out of the queue); a Hub shutting down cancels without a stop, and
            # the request stays queued for the next Hub.
            scheduler.detach(request_id)
            self.log.info("%s: no longer waiting for %s", self._prefix, request_id)
            raise
        finally:
            self._waiter = None

    async def _launch(self, allocation: Allocation) -> tuple[str, int]:
        scheduler = self.scheduler
        request_id = allocation.id
        grant = allocation.grants[0]
        self.node = grant.node
        self._set_phase("launching")
        profile = next(p for p in self._profiles() if p.slug == allocation.request.profile)
        ask = SessionLaunch(
            identity=SessionIdentity(
                user=self.user.name,
                server=self.name,
                request_id=request_id,
                team=allocation.request.team,
                profile=profile.slug,
                hub=scheduler.hub_name,
            ),
            image=profile.image,
            hub_env=self.get_env(),
            base_url=self.server.base_url if self.server else "/",
            storage=allocation.request.labels.get("storage") if profile.storage else None,
            pids_limit=self.pids_limit,
            agent_secret=secrets.token_urlsafe(32),
            restore=self._restore_key(),
        )
        session = await scheduler.start_session(allocation, ask)
        self.runtime_id = session.runtime_id
        self.port = session.port
        self.ip = session.address
        self.agent = scheduler.agents.get(request_id)
        self._failure = ""
        # Where a start's time went (bench.spawn reads it): the queue, the wait for a
        # turn to boot on the node, the boot until the server answered.
        self.log.info(
            "%s: running on %s port %d (%s, %s; queued %.2f s, turn %.2f s, boot %.2f s)",
            self._prefix,
            grant.node,
            session.port,
            ",".join(s.device_id for s in grant.slices) or "no GPU",
            "funded" if allocation.funded else "unallocated",
            max(0.0, allocation.start - allocation.request.submit),
            session.turn_s,
            session.boot_s,
        )
        return session.address, session.port

    # -- snapshots -----------------------------------------------------------------

    def _snapshot_words(self) -> str:
        return self.scheduler.snapshot_notice(self.user.name, self.name) or ""

    def _snapshot_choice(self, options: dict[str, Any]) -> tuple[str | None, bool]:
        """The snapshot asked for (checked: this user's, this server's) and "fresh"; a
        400 naming the field otherwise. Another user's key is refused as unknown."""
        try:
            key, fresh = snapshot_choice(options)
            if key is not None and not fresh:
                self.scheduler.restorable(self.user.name, self.name, key)
        except FormError as error:
            raise self._refuse(f"Cannot start: {error.field}: {error.reason}.", "form") from None
        except ValueError as error:
            raise self._refuse(f"Cannot start: restore: {error}.", "form") from None
        return key, fresh

    def _restore_key(self) -> str | None:
        """The snapshot this launch restores: none when starting fresh, else the one asked
        for or the one offered (taken perhaps while this request waited)."""
        key, fresh = self._restore
        if fresh:
            return None
        try:
            record = self.scheduler.restorable(self.user.name, self.name, key)
        except ValueError:
            return None  # deleted meanwhile
        if record is not None:
            self.log.info("%s: restoring snapshot %s", self._prefix, record.key)
        return record.key if record is not None else None

    async def delete_forever(self) -> None:
        """The Hub deletes this server (or its user): its snapshots go with it."""
        scheduler = self.scheduler
        await scheduler.ensure_started(self.hub.api_url)
        deleted = scheduler.delete_snapshots(self.user.name, self.name)
        if deleted:
            self.log.info("%s: deleted its %d snapshots", self._prefix, deleted)

    # -- progress ------------------------------------------------------------------

    def _queue_message(self, status: QueueStatus, moved: str = "") -> str:
        if status.funded is None:
            funding = "weighing your team's budget"
        elif status.funded:
            protected = human_duration(status.protected_s)
            funding = f"funded by your team's budget, protected for {protected}"
        elif status.team_share <= 0:  # no figures to give: its verdict's words only
            funding = f"{not_funded_words(status.ground)}: it will run unallocated (preemptible)"
        else:
            used = (
                f"; {status.budget_used:.0%} of its {status.window_days:g}-day budget used"
                if status.budget_used is not None
                else ""
            )
            why = not_funded_words(status.ground)  # its verdict's words
            funding = (
                f"{why} (its funded sessions hold {status.team_funded:.3g} {status.unit}, its "
                f"share is {status.team_share:.3g} {status.unit}{used}): it will run "
                "unallocated (preemptible)"
            )
        if status.reason:  # where the dry run placed it, or why not (its verdict's words)
            funding = f"{funding}; {verdict_words(status.reason)}"
        eta = "; " + estimate_words(
            status.funded,
            status.estimated_start,
            time.time(),
            starts_now=status.starts_now,
            basis=status.basis,
        )
        order = (
            ". Teams furthest under their share go first, so positions can move"
            if status.other_teams
            else ""
        )
        return (
            f"Queued: position {status.position} of {status.waiting} in the pool{moved}, "
            f"{status.team_position} of {status.team_waiting} in your team; {funding}{eta}"
            f"{order}"
        )

    async def progress(self) -> Any:
        scheduler = self.scheduler
        last = None
        shown: QueueStatus | None = None
        moved = ""
        for _ in range(10**6):  # ends when the Hub stops listening (the spawn finished)
            if self._phase == "queued" and self.request_id:
                status = scheduler.queue_status(self.request_id)
                if status is not None and shown is not None:
                    if status.position > shown.position:  # the order says why: teams rank again
                        moved = f" (moved back from {shown.position})"
                    elif status.position < shown.position:
                        moved = ""
                if status is not None:
                    shown = status
                message = self._queue_message(status, moved) if status else "Granted; starting"
                message = self._failure + message
                event = {"progress": 10, "message": message}
                if status is not None:
                    event["queue"] = {
                        "position": status.position,
                        "waiting": status.waiting,
                        "team_position": status.team_position,
                        "team_waiting": status.team_waiting,
                        "funded": status.funded,
                        "estimated_start": status.estimated_start,
                    }
            elif self._phase == "launching":
                message = f"Granted on node {self.node}; starting the session"
                event = {"progress": 60, "message": message}
            elif self._phase == "withdrawn":
                message = self._withdrawn
                event = {
                    "progress": 100,
                    "message": message,
                    "withdrawn": queuecontrol.CANCEL_HEADING,  # the page's heading
                }
            else:
                message = "Submitting to the budget scheduler"
                event = {"progress": 5, "message": message}
            if message != last:
                last = message
                yield event
            waiter = self._waiter
            self._phase_changed.clear()
            waits = [asyncio.ensure_future(self._phase_changed.wait())]
            if waiter is not None:
                waiter.changed.clear()
                waits.append(asyncio.ensure_future(waiter.changed.wait()))
            done, pending = await asyncio.wait(waits, timeout=5, return_when="FIRST_COMPLETED")
            for task in pending:
                task.cancel()

    # -- poll and stop -------------------------------------------------------------

    async def poll(self) -> int | None:
        """None while the session runs (or cannot be asked: an unreachable node, a
        scheduler in safe mode); its exit status once it ended, its slices then freed.

        The Hub calls ``stop()`` only for servers that poll as running, so a session
        that ended by itself is released here (and, sooner, by the engine's events)."""
        scheduler = self.scheduler
        await scheduler.ensure_started(self.hub.api_url)
        if not self.runtime_id or not self.node:
            return 0
        return await scheduler.poll_session(self.request_id or "", self.node, self.runtime_id)

    async def stop(self, now: bool = False) -> None:
        scheduler = self.scheduler
        await scheduler.ensure_started(self.hub.api_url)
        request_id = self.request_id or ""
        if self.node:
            await scheduler.stop_session(request_id, self.node, self.runtime_id or "")
        self.runtime_id = None
        if request_id:
            self.log.info("%s: stopped %s", self._prefix, request_id)
        # The request is done with (or, preempted and resumable, waits again for a new
        # spawn): clear_state must not take it out of the queue.
        self.request_id = None
