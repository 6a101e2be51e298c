"""The budget service's tornado application: pages, the JSON API, /metrics, admin changes.

Every route but /metrics and the OpenAPI document needs a Hub login (OAuth through
``HubOAuthenticated``) carrying ``custom:budget:read``; admin routes need
``custom:budget:admin``. Pages without a login redirect to the Hub's login; the API
answers 401. A bad change is a 400 naming the field (the form comes back with it).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import OperationalError, ProgrammingError
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.ioloop import IOLoop
from tornado.web import Application, HTTPError, RedirectHandler, RequestHandler

from scheduler_core.verdict import NO_SHARE
from spawner import admin as checks
from spawner.profiles import rounded_duration
from spawner.readmodel.service import charts, openapi, replays, views
from spawner.readmodel.service.metrics import registry
from spawner.readmodel.service.views import Viewer
from spawner.readmodel.status import amount, not_funded_words, number, percent, plural
from spawner.readmodel.storeview import State, StoreModel

log = logging.getLogger("budgethub.service")
TEMPLATES = Path(__file__).parent / "templates"
IDLE_AFTER = 600.0
"""A server with no activity for this long is shown idle."""
NOT_READY = (OperationalError, ProgrammingError)
"""The store's tables are not there yet (the Hub migrates them when it starts)."""


def duration(seconds: float | None) -> str:
    """A duration as the spawn form writes it (`profiles.human_duration`: ``1 h``,
    ``90 min``, ``45 s``), rounded first to what a page needs to say: whole seconds
    under a minute, whole minutes under two hours, whole hours beyond."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    return rounded_duration(seconds)


def clock(epoch: float | None) -> str:
    if epoch is None:
        return "—"
    return time.strftime("%H:%M", time.localtime(epoch))


def stamp(epoch: float | None) -> str:
    if epoch is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def days_of(daily: list[dict[str, float]]) -> list[tuple[float, float, float]]:
    return [(d["day"], d["owed_units"], d["delivered_units"]) for d in daily]


def ratio_rows(data: dict[str, Any], pool: str) -> list[tuple[str, float, float]]:
    """Every team of the pool, one with no share included (its bar says "no share")."""
    rows = []
    for team in data["teams"]:
        for p in team["pools"]:
            if p["pool"] == pool:
                ratio = p["ratio"] if p["ratio"] is not None else float("inf")
                rows.append((team["name"], ratio, p["share"]))
    return rows


def usage_series(data: dict[str, Any], pool: str) -> list[tuple[str, list[tuple[float, float]]]]:
    """Per team of the pool, what was delivered of what it was owed; a team with no share
    is owed nothing, and its legend says so."""
    return [
        (
            team["name"] + ("" if p["share"] > 0 else " (no share)"),
            [(d["day"], d["delivered_units"]) for d in p["daily"]],
        )
        for team in data["teams"]
        for p in team["pools"]
        if p["pool"] == pool
    ]


def slice_rows(node: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(s["device"], s["kind"], s["by"] or "") for s in node["slices"]]


async def _off_loop(make: Callable[[], Any]) -> Any:
    """``make()`` on the loop's thread pool."""
    return await IOLoop.current().run_in_executor(None, make)


class Base(HubOAuthenticated, RequestHandler):  # type: ignore[misc]
    """Login and scopes for every route; errors as JSON (API) or a page."""

    api = False
    needs_admin = False

    @property
    def model(self) -> StoreModel:
        return cast(StoreModel, self.settings["model"])

    @property
    def prefix(self) -> str:
        return str(self.settings["prefix"])

    def viewer(self) -> Viewer:
        user = self.current_user
        assert user is not None
        return Viewer(
            name=str(user["name"]),
            groups=frozenset(user.get("groups") or ()),
            scopes=frozenset(user.get("scopes") or ()),
        )

    def check_xsrf_cookie(self) -> None:
        """Token requests need no XSRF token (JupyterHub's rule); the login is looked
        up first, so that the Hub's check knows which kind this is."""
        if not getattr(self, "_looking_up", False):  # the lookup itself checks XSRF
            self._looking_up = True
            try:
                _ = self.current_user
            finally:
                self._looking_up = False
        super().check_xsrf_cookie()

    def prepare(self) -> None:
        if self.current_user is None:
            if self.api or self.request.method not in ("GET", "HEAD"):
                raise HTTPError(401, "log in to the Hub, or send an API token")
            self.redirect(self.get_login_url())
            return
        viewer = self.viewer()
        if not viewer.can_read:
            raise HTTPError(403, f"{views.READ} is needed (ask an admin for the role)")
        if self.needs_admin and not viewer.admin:
            raise HTTPError(403, f"{views.ADMIN} is needed for the admin routes")

    stale = False
    """The answer was worked out from the model before a change it has not caught up with
    yet (its build took longer than the model's ``wait``): the page says how old it is
    and reloads itself."""

    async def state(self, *, fresh: bool = False) -> State:
        """The model as the store is now: a change made before this request shows (the
        model is built again; past its ``wait``, a page gets the previous one marked stale).
        The JSON API always waits for the build: its answers carry no age a client could
        read, so one is never stale."""
        try:
            state, self.stale = await self.model.current(fresh=fresh or self.api)
        except NOT_READY as error:
            log.warning("the store is not ready: %s", error)
            raise HTTPError(503, "the scheduler's store is not ready yet; try again") from None
        return state

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        field = getattr(exc, "field", None)
        if self.api or self.request.path.rstrip("/").endswith("metrics"):
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"error": message, "field": field, "status": status_code}))
            return
        self.render_page(
            "error.html", status=status_code, message=message, field=field, title="Error"
        )

    # -- pages ----------------------------------------------------------------------------

    def render_page(self, template: str, **context: Any) -> None:
        self.finish(self.render_html(template, **context))

    def render_html(self, template: str, **context: Any) -> str:
        env: Environment = self.settings["jinja"]
        user = self.current_user
        viewer = self.viewer() if user else None
        html = env.get_template(template).render(
            prefix=self.prefix,
            hub_prefix=self.settings["hub_prefix"],
            viewer=viewer,
            active=template.removesuffix(".html"),
            xsrf_form_html=self.xsrf_form_html,
            charts=charts,
            days_of=days_of,
            ratio_rows=ratio_rows,
            usage_series=usage_series,
            slice_rows=slice_rows,
            duration=duration,
            clock=clock,
            stamp=stamp,
            amount=amount,
            percent=percent,
            number=number,
            plural=plural,
            no_share=not_funded_words(NO_SHARE),  # the one map's words, for the charts
            stale=self.stale,
            age=lambda state: duration(time.time() - state.now) if state else "",
            **context,
        )
        return str(html)

    async def memo(self, state: State, key: tuple[Any, ...], make: Callable[[], str]) -> str:
        """An answer worked out once per state and viewer (the store unchanged); a stale
        one (it says its age) is worked out each time. It is worked out on a thread: the
        first estimates of a long queue run the scheduler forward for seconds, and the
        service's loop must go on answering meanwhile."""
        if self.stale:
            return str(await _off_loop(make))
        viewer = self.viewer()
        full = (*key, viewer.name, viewer.groups, viewer.scopes)
        found = state.memo.get(full)
        if found is None:
            found = await _off_loop(make)
            if len(state.memo) > 2048:
                state.memo.clear()
            state.memo[full] = found
        return str(found)

    async def page(self, state: State, template: str, data: Any, title: str, *key: Any) -> None:
        _ = self.xsrf_token  # made (its cookie set) here on the loop, not on the thread
        html = await self.memo(
            state,
            ("page", template, *key),
            lambda: self.render_html(template, data=data(), state=state, title=title),
        )
        self.finish(html)

    async def json_memo(self, state: State, key: tuple[Any, ...], make: Callable[[], Any]) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(await self.memo(state, ("json", *key), lambda: json.dumps(make())))

    def json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))


class ApiError(HTTPError):
    def __init__(self, status: int, field: str | None, reason: str) -> None:
        super().__init__(status, f"{field}: {reason}" if field else reason)
        self.field = field


async def activity(handler: Base, user: str) -> dict[str, str]:
    """Idle or busy per server of ``user``, from the Hub's last-activity (unknown if the
    Hub does not answer in time)."""
    url = handler.settings.get("hub_api_url")
    token = handler.settings.get("api_token")
    if not url or not token:
        return {}
    try:
        response = await AsyncHTTPClient().fetch(
            HTTPRequest(
                f"{url.rstrip('/')}/users/{quote(user)}",
                headers={"Authorization": f"token {token}"},
                request_timeout=2.0,
            )
        )
        servers = json.loads(response.body).get("servers", {})
    except Exception as error:
        log.info("no activity of %s from the Hub: %s", user, error)
        return {}
    now = time.time()
    out = {}
    for name, server in servers.items():
        seen = server.get("last_activity")
        if not seen:
            out[name] = "unknown"
            continue
        from datetime import datetime

        when = datetime.fromisoformat(seen.replace("Z", "+00:00")).timestamp()
        out[name] = "busy" if now - when < IDLE_AFTER else "idle"
    return out


# -- pages ------------------------------------------------------------------------------


class MyPage(Base):
    async def get(self) -> None:
        state = await self.state()
        viewer = self.viewer()
        seen = await activity(self, viewer.name)
        key = tuple(sorted(seen.items()))
        await self.page(state, "my.html", lambda: views.me(state, viewer, seen), "My budget", key)


class TeamsPage(Base):
    async def get(self) -> None:
        state = await self.state()
        await self.page(state, "teams.html", lambda: views.teams(state, self.viewer()), "Teams")


def page_args(handler: Base) -> tuple[int, int]:
    """``limit`` and ``offset`` of a list (the queue): whole numbers, limit 1 to 5000."""
    out = []
    for name, default, low, high in (("limit", 200, 1, 5000), ("offset", 0, 0, 10**9)):
        raw = handler.get_query_argument(name, str(default))
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(400, name, f"must be a whole number, not {raw!r}") from None
        if not low <= value <= high:
            raise ApiError(400, name, f"must be between {low} and {high}, not {value}")
        out.append(value)
    return out[0], out[1]


class QueuePage(Base):
    async def get(self) -> None:
        state = await self.state()
        limit, offset = page_args(self)
        await self.page(
            state,
            "queue.html",
            lambda: views.queue(state, self.viewer(), limit=limit, offset=offset),
            "Queue",
            limit,
            offset,
        )


class NodesPage(Base):
    async def get(self) -> None:
        state = await self.state()
        await self.page(state, "nodes.html", lambda: views.nodes(state, self.viewer()), "Nodes")


class AdminPage(Base):
    needs_admin = True

    async def get(self) -> None:
        await self.show()

    async def show(
        self, error: checks.AdminError | None = None, form: dict[str, str] | None = None
    ) -> None:
        state = await self.state(fresh=True)  # the change just made, and its audit entry
        if error is not None:
            self.set_status(400)
        self.render_page(
            "admin.html",
            data=views.admin(state),
            state=state,
            error=error,
            form=form or {},
            done=self.get_argument("done", ""),
            replay=await _off_loop(lambda: replays.newest(self.settings["reports"])),
            title="Admin",
        )

    async def post(self) -> None:
        form = {k: self.get_body_argument(k, "") for k in self.request.body_arguments}
        action = form.get("action", "")
        state = await self.state(fresh=True)
        try:
            if action == "share":
                pool = form.get("pool", "")
                raw = form.get("share", "").strip()
                try:
                    value: Any = checks.form_number(raw)  # "-1" is said back as -1
                except ValueError:
                    raise checks.AdminError(
                        f"share.{pool}", f"must be a number, not {raw!r}"
                    ) from None
                change_team(self, state, form.get("team"), {"share": {pool: value}})
            elif action == "parent":
                parent = form.get("parent") or None
                change_team(self, state, form.get("team"), {"parent": parent})
            elif action == "settings":
                body = {k: _number_or_text(form[k]) for k in checks.LIMITS if form.get(k, "")}
                if not body:
                    raise checks.AdminError("lookback", "give a value to change")
                change_settings(self, state, body)
            elif action == "node":
                change_node(self, state, form.get("node"), {"state": form.get("state")})
            else:
                raise checks.AdminError("action", f"unknown action {action!r}")
        except checks.AdminError as error:
            await self.show(error, form)
            return
        self.redirect(f"{self.prefix}admin?done={quote(action)}", status=303)


class ReplayFile(Base):
    """A replay report of the reports' directory (its JSON, or its plot), by name."""

    needs_admin = True

    def get(self, name: str) -> None:
        path = replays.report_file(self.settings["reports"], name)
        if path is None:
            raise HTTPError(404, f"no replay report {name!r}")
        kind = "image/png" if path.suffix == ".png" else "application/json"
        self.set_header("Content-Type", kind)
        self.finish(path.read_bytes())


def _number_or_text(raw: str) -> float | str:
    try:
        return checks.form_number(raw)
    except ValueError:
        return raw.strip()


# -- changes (the form and the API) -------------------------------------------------------


def _write(
    handler: Base, values: dict[str, Any], audit: list[tuple[str, Any, Any]]
) -> dict[str, Any]:
    actor = handler.viewer().name
    now = time.time()
    audit_id = handler.model.admin.change(actor, now, values, audit)
    log.info("admin %s changed %s", actor, ", ".join(t for t, _, _ in audit))
    return {
        "audit_id": audit_id,
        "changed": [
            {"id": audit_id, "time": now, "actor": actor, "target": t, "old": o, "new": n}
            for t, o, n in audit
        ],
    }


def change_team(handler: Base, state: State, name: Any, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise checks.AdminError("body", "must be a JSON object")
    extra = set(body) - {"share", "parent"}
    if extra:
        raise checks.AdminError(sorted(extra)[0], "unknown field (fields: share, parent)")
    current = list(state.core.teams.teams.values())
    new = checks.change_team(current, state.core.pools, name, **body)
    old_specs = {s["name"]: s for s in checks.team_specs(current)}
    new_specs = {s["name"]: s for s in checks.team_specs(new)}
    audit: list[tuple[str, Any, Any]] = []
    for team, spec in new_specs.items():
        before = old_specs[team]
        if before["parent"] != spec["parent"]:
            audit.append((f"teams.{team}.parent", before["parent"], spec["parent"]))
        for pool in sorted(set(before["share"]) | set(spec["share"])):
            a, b = before["share"].get(pool, 0.0), spec["share"].get(pool, 0.0)
            if a != b:
                audit.append((f"teams.{team}.share.{pool}", a, b))
    if not audit:
        audit.append((f"teams.{name}", "unchanged", "unchanged"))
    return _write(handler, {"teams": list(new_specs.values())}, audit)


def change_settings(handler: Base, state: State, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not body:
        raise checks.AdminError("body", "must be a JSON object with lookback or max_min_runtime")
    values, audit = {}, []
    for key, raw in body.items():
        seconds = checks.check_setting(key, raw)
        values[key] = seconds
        audit.append((key, getattr(state.settings, key), seconds))
    return _write(handler, values, audit)


def change_node(handler: Base, state: State, name: Any, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise checks.AdminError("body", "must be a JSON object")
    extra = set(body) - {"state"}
    if extra:
        raise checks.AdminError(sorted(extra)[0], "unknown field (fields: state)")
    if "state" not in body:
        raise checks.AdminError("state", "is required (ready or draining)")
    wanted = checks.check_node_state(state.core.nodes, name, body["state"])
    drained = set(state.overrides.get("drained") or [])
    was = "draining" if name in drained else "ready"
    if wanted == "draining":
        drained.add(name)
    else:
        drained.discard(name)
    return _write(handler, {"drained": sorted(drained)}, [(f"nodes.{name}.state", was, wanted)])


# -- the API ------------------------------------------------------------------------------


class Api(Base):
    api = True

    def body(self) -> Any:
        try:
            return checks.json_body(self.request.body or b"")
        except checks.AdminError as error:  # a NaN or an infinity, named where it is
            raise ApiError(400, error.field, error.reason) from None
        except (ValueError, UnicodeDecodeError) as error:
            raise ApiError(400, "body", f"is not JSON: {error}") from None

    async def changed(self, work: Callable[[State], dict[str, Any]]) -> None:
        state = await self.state(fresh=True)  # what the change is made over
        try:
            result = work(state)
        except checks.AdminError as error:
            raise ApiError(400, error.field, error.reason) from None
        self.json(result)


class MeApi(Api):
    async def get(self) -> None:
        viewer, state = self.viewer(), await self.state()
        seen = await activity(self, viewer.name)
        key = ("me", *sorted(seen.items()))
        await self.json_memo(state, key, lambda: views.me(state, viewer, seen))


class TeamsApi(Api):
    async def get(self) -> None:
        state = await self.state()
        await self.json_memo(state, ("teams",), lambda: views.teams(state, self.viewer()))


class QueueApi(Api):
    async def get(self) -> None:
        limit, offset = page_args(self)
        state = await self.state()
        await self.json_memo(
            state,
            ("queue", limit, offset),
            lambda: views.queue(state, self.viewer(), limit=limit, offset=offset),
        )


class NodesApi(Api):
    async def get(self) -> None:
        state = await self.state()
        await self.json_memo(state, ("nodes",), lambda: views.nodes(state, self.viewer()))


class AdminApi(Api):
    needs_admin = True

    async def get(self) -> None:
        self.json(views.admin(await self.state(fresh=True)))


class TeamApi(Api):
    needs_admin = True

    async def patch(self, team: str) -> None:
        body = self.body()
        await self.changed(lambda state: change_team(self, state, team, body))


class SettingsApi(Api):
    needs_admin = True

    async def patch(self) -> None:
        body = self.body()
        await self.changed(lambda state: change_settings(self, state, body))


class NodeApi(Api):
    needs_admin = True

    async def patch(self, node: str) -> None:
        body = self.body()
        await self.changed(lambda state: change_node(self, state, node, body))


class OpenApi(RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(openapi.document(self.settings["prefix"])))


class Metrics(RequestHandler):
    """Prometheus text format; open like the Hub's /metrics with
    ``authenticate_prometheus = False`` (team totals only, no user names)."""

    async def get(self) -> None:
        try:
            # The model as the store is now, built off the event loop; the collector then
            # finds it up to date.
            await cast(StoreModel, self.settings["model"]).current(fresh=True)
            output = generate_latest(self.settings["registry"])
        except NOT_READY:
            raise HTTPError(503, "the scheduler's store is not ready yet") from None
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(output)


class Callback(HubOAuthCallbackHandler):  # type: ignore[misc]
    """The OAuth callback: a missing or forged state (or code) is a 403, never a 500."""

    async def get(self) -> None:
        state = self.get_argument("state", "")
        if not state or not self.get_argument("code", ""):
            raise HTTPError(403, "OAuth state or code is missing; log in again")
        # Stricter than JupyterHub's (which lets a logged-in user through with a stale
        # state): the state must be the one this browser was given.
        cookie = self.get_secure_cookie(self.hub_auth.get_state_cookie_name(state))
        if cookie is None or cookie.decode("ascii", "replace") != state:
            raise HTTPError(403, "OAuth state does not match; log in again")
        try:
            await super().get()
        except HTTPError as error:
            if error.status_code >= 500 or error.status_code == 400:
                raise HTTPError(403, "OAuth login failed; log in again") from None
            raise
        except Exception as error:
            log.warning("OAuth callback failed: %s", error)
            raise HTTPError(403, "OAuth login failed; log in again") from None


class NotFound(Base):
    def prepare(self) -> None:
        self.api = "/api/" in self.request.path
        super().prepare()
        raise HTTPError(404, f"no such page: {self.request.path}")


def make_app(
    model: StoreModel,
    *,
    prefix: str = "/services/budget/",
    hub_prefix: str = "/hub/",
    hub_api_url: str = "",
    api_token: str = "",
    cookie_secret: bytes | None = None,
    reports: str = "",
) -> Application:
    if not prefix.endswith("/"):
        prefix += "/"
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    routes: list[Any] = [
        (prefix, RedirectHandler, {"url": prefix + "my"}),
        (prefix + "my", MyPage),
        (prefix + "teams", TeamsPage),
        (prefix + "queue", QueuePage),
        (prefix + "nodes", NodesPage),
        (prefix + "admin", AdminPage),
        (prefix + r"admin/replay/([^/]+)", ReplayFile),
        (prefix + "oauth_callback", Callback),
        (prefix + "metrics", Metrics),
        (prefix + "api/v1/openapi.json", OpenApi),
        (prefix + "api/v1/me", MeApi),
        (prefix + "api/v1/teams", TeamsApi),
        (prefix + "api/v1/queue", QueueApi),
        (prefix + "api/v1/nodes", NodesApi),
        (prefix + "api/v1/admin", AdminApi),
        (prefix + "api/v1/admin/settings", SettingsApi),
        (prefix + r"api/v1/admin/teams/([^/]+)", TeamApi),
        (prefix + r"api/v1/admin/nodes/([^/]+)", NodeApi),
    ]
    return Application(
        routes,
        default_handler_class=NotFound,
        model=model,
        registry=registry(model),
        jinja=env,
        prefix=prefix,
        hub_prefix=hub_prefix,
        hub_api_url=hub_api_url,
        api_token=api_token,
        cookie_secret=cookie_secret,
        reports=reports,
        xsrf_cookies=True,
    )
