"""Jupyter Server extension: the spawner's agent inside a session (docs/snapshots.md).

Routes, relative to the server's base_url:

* ``GET  budgethub-agent/status``: ``last_activity`` (Jupyter Server's own figure),
  ``busy`` (any kernel executing) and each kernel's notebook, state and activity.
* ``POST budgethub-agent/checkpoint`` with ``{"within": seconds}``: every kernel
  saves what changed since its last cell (:func:`budgethub_session.checkpoint.flush_json`
  run as a silent execute request with a user expression, so it runs on the
  kernel's own thread between cells and adds no history); a kernel that does not
  answer in time is reported ``busy``, its state as of its last finished cell being
  on disk already. Then the open notebooks: the server holds no copy of unsaved
  edits (without real-time collaboration they live in the browser), so a notebook
  whose kernel ran after the file was last saved is reported as not flushed.

Only the spawner may ask: the header ``X-Budgethub-Agent`` must equal
``$BUDGETHUB_AGENT_SECRET`` (compared in constant time), a request carrying
``X-Forwarded-For``/``Forwarded`` came through the Hub's proxy and is refused, and
without a secret the agent answers 503. It does not use the Hub's login: the
spawner has no user cookie, and the secret is per session. The secret is removed
from the server's environment at load so kernels and terminals never see it.
A checkpoint counts as kernel activity for Jupyter Server (its execute request
shows on IOPub); the spawner only asks for one right before it stops the session.
"""

from __future__ import annotations

import ast
import asyncio
import hmac
import json
import os
import queue
import time
from datetime import datetime
from typing import Any

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.utils import url_path_join
from tornado import web

from budgethub_session import NOTEBOOK_ENV, ROOT_ENV, SECRET_ENV, notebook_path

__all__ = ["Agent"]

HEADER = "X-Budgethub-Agent"
FLUSH_EXPRESSION = (
    "__import__('budgethub_session.checkpoint', fromlist=['flush_json']).flush_json()"
)
MAX_WITHIN = 3600.0
DEFAULT_WITHIN = 30.0


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class Agent:
    def __init__(self, serverapp: Any, secret: str) -> None:
        self.app = serverapp
        self.secret = secret

    async def _sessions(self) -> dict[str, dict[str, Any]]:
        """kernel id -> session model, its path the notebook's one key (`notebook_path`)."""
        out = {}
        for s in await ensure_async(self.app.session_manager.list_sessions()):
            kernel = s.get("kernel") or {}
            if kernel.get("id"):
                out[kernel["id"]] = {**s, "path": notebook_path(s.get("path") or "")}
        return out

    async def status(self) -> dict[str, Any]:
        km = self.app.kernel_manager
        sessions = await self._sessions()
        kernels = []
        for kid in km.list_kernel_ids():
            k = km.get_kernel(kid)
            kernels.append(
                {
                    "kernel_id": kid,
                    "notebook": sessions.get(kid, {}).get("path"),
                    "execution_state": getattr(k, "execution_state", None),
                    "last_activity": _iso(getattr(k, "last_activity", None)),
                }
            )
        return {
            "last_activity": _iso(self.app.web_app.last_activity()),
            "busy": any(k["execution_state"] == "busy" for k in kernels),
            "kernels": kernels,
        }

    async def checkpoint(self, within: float) -> dict[str, Any]:
        t0 = time.monotonic()
        deadline = t0 + within
        km = self.app.kernel_manager
        sessions = await self._sessions()
        kids = list(km.list_kernel_ids())
        before = {kid: getattr(km.get_kernel(kid), "last_activity", None) for kid in kids}
        reports = await asyncio.gather(
            *(self._flush(kid, sessions.get(kid, {}).get("path"), deadline, within) for kid in kids)
        )
        notebooks = await self._notebooks(sessions, before)
        return {
            "kernels": list(reports),
            "notebooks": notebooks,
            "elapsed": round(time.monotonic() - t0, 3),
        }

    async def _flush(
        self, kid: str, notebook: str | None, deadline: float, within: float
    ) -> dict[str, Any]:
        report: dict[str, Any] = {
            "kernel_id": kid,
            "notebook": notebook,
            "state": "failed",
            "saved": [],
            "unsaved": {},
            "bytes": 0,
            "error": None,
        }
        try:
            kernel = self.app.kernel_manager.get_kernel(kid)
            client = AsyncKernelClient()
            client.load_connection_info(kernel.get_connection_info())
            client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
        except Exception as error:
            report["error"] = f"cannot reach the kernel: {error}"
            return report
        try:
            msg_id = client.execute(
                "",
                silent=True,
                store_history=False,
                user_expressions={"budgethub": FLUSH_EXPRESSION},
                allow_stdin=False,
            )
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise queue.Empty
                reply = await client.get_shell_msg(timeout=left)
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    break
            content = reply["content"]
            if content.get("status") != "ok":
                report["error"] = f"{content.get('ename')}: {content.get('evalue')}"
                return report
            expr = content.get("user_expressions", {}).get("budgethub", {})
            if expr.get("status") != "ok":
                report["error"] = (
                    f"no budgethub checkpoint in this kernel ({expr.get('ename')}: "
                    f"{expr.get('evalue')})"
                )
                return report
            result = json.loads(ast.literal_eval(expr["data"]["text/plain"]))
            for key in ("state", "saved", "unsaved", "bytes", "error"):
                if key in result:
                    report[key] = result[key]
        except queue.Empty:
            report["state"] = "busy"
            report["error"] = (
                f"no answer within {within:g} s (a cell is running); the state as of its "
                "last finished cell is on disk"
            )
        except Exception as error:
            report["error"] = f"{type(error).__name__}: {error}"
        finally:
            client.stop_channels()
        return report

    async def _notebooks(
        self, sessions: dict[str, dict[str, Any]], before: dict[str, datetime | None]
    ) -> dict[str, Any]:
        saved: list[str] = []
        not_flushed: dict[str, str] = {}
        cm = self.app.contents_manager
        for kid, s in sessions.items():
            path = s.get("path")
            if not path or s.get("type") not in (None, "notebook"):
                continue
            try:
                model = await ensure_async(cm.get(path, content=False))
            except Exception as error:
                not_flushed[path] = f"not on disk: {error}"
                continue
            modified = model.get("last_modified")
            ran = before.get(kid)
            if isinstance(modified, datetime) and ran is not None and ran > modified:
                not_flushed[path] = (
                    f"its kernel ran after the file was last saved ({modified:%Y-%m-%d %H:%M:%S} "
                    "UTC); unsaved edits live in the browser, which the server cannot flush; "
                    "the file is kept as last saved"
                )
            else:
                saved.append(path)
        return {"saved": sorted(saved), "not_flushed": dict(sorted(not_flushed.items()))}


def _error(status: int, message: str) -> web.HTTPError:
    """An HTTP error whose JSON body says what was wrong (tornado keeps reason phrases
    to a narrow alphabet, so the message travels on the exception)."""
    error = web.HTTPError(status)
    error.budgethub_message = message  # type: ignore[attr-defined]
    return error


class _Handler(web.RequestHandler):
    agent: Agent

    def initialize(self, agent: Agent) -> None:
        self.agent = agent

    def check_xsrf_cookie(self) -> None:
        """No cookies here: the secret header authenticates (and a browser cannot send it
        cross-origin without a preflight this server does not grant)."""

    def prepare(self) -> None:
        if not self.agent.secret:
            raise _error(503, "the agent has no secret (BUDGETHUB_AGENT_SECRET)")
        headers = self.request.headers
        if "X-Forwarded-For" in headers or "Forwarded" in headers:
            raise _error(403, "proxied requests are refused")
        given = headers.get(HEADER, "")
        if not hmac.compare_digest(given.encode(), self.agent.secret.encode()):
            raise _error(403, f"missing or wrong {HEADER} header")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "budgethub_message", None) or self._reason
        self.finish(json.dumps({"error": message, "status": status_code}))

    def reply(self, body: dict[str, Any]) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))


class StatusHandler(_Handler):
    @allow_unauthenticated
    async def get(self) -> None:
        self.reply(await self.agent.status())


class CheckpointHandler(_Handler):
    @allow_unauthenticated
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as error:
            raise _error(400, f"body: not JSON ({error})") from error
        if not isinstance(body, dict):
            raise _error(400, "body: must be a JSON object")
        within = body.get("within", DEFAULT_WITHIN)
        if isinstance(within, bool) or not isinstance(within, int | float):
            raise _error(400, "within: must be a number of seconds")
        if not 0 < within <= MAX_WITHIN:
            raise _error(400, f"within: must be > 0 and <= {MAX_WITHIN:g} seconds")
        self.reply(await self.agent.checkpoint(float(within)))


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "budgethub_session.agent"}]


def _key_kernels_by_path(session_manager: Any) -> None:
    """Every kernel a session starts (or restarts after a rename) gets
    ``$BUDGETHUB_NOTEBOOK``: its session's API path, whatever name the client sent."""
    get_kernel_env = session_manager.get_kernel_env

    def with_notebook(path: str | None, name: Any = None) -> dict[str, str]:
        env = dict(get_kernel_env(path, name))
        notebook = notebook_path(path or "")
        if notebook:
            env[NOTEBOOK_ENV] = notebook
        else:
            env.pop(NOTEBOOK_ENV, None)
        return env

    session_manager.get_kernel_env = with_notebook


def _load_jupyter_server_extension(serverapp: Any) -> None:
    secret = os.environ.pop(SECRET_ENV, "")  # kernels and terminals do not inherit it
    os.environ[ROOT_ENV] = os.path.abspath(os.path.expanduser(serverapp.root_dir))
    os.environ.pop(NOTEBOOK_ENV, None)
    _key_kernels_by_path(serverapp.session_manager)
    agent = Agent(serverapp, secret)
    base = serverapp.web_app.settings.get("base_url", "/")
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "budgethub-agent/status"), StatusHandler, {"agent": agent}),
            (
                url_path_join(base, "budgethub-agent/checkpoint"),
                CheckpointHandler,
                {"agent": agent},
            ),
        ],
    )
    serverapp.log.info(
        "budgethub agent at %sbudgethub-agent/ (%s)",
        base,
        "secret set" if secret else "no secret: 503",
    )
