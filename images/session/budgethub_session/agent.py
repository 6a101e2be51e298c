"""Jupyter Server extension: the spawner's agent inside a session (docs/snapshots.md).

Routes, relative to the server's base_url:

* ``GET  budgethub-agent/status``: ``last_activity`` (Jupyter Server's own figure),
  ``busy`` (any kernel executing) and each kernel's notebook, state and activity.
* ``POST budgethub-agent/checkpoint`` with ``{"within": seconds}``: every kernel
  saves what changed since its last cell (:func:`budgethub_session.snapshot.flush_json`
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
import posixpath
import queue
import time
from datetime import datetime
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.utils import url_path_join
from tornado import web

from budgethub_session import NOTEBOOK_ENV, RESTORE_ENV, ROOT_ENV, SECRET_ENV, notebook_path
from budgethub_session.labnotice import (
    LAB_WAIT_MAX,
    PREEMPTING,
    LabChannel,
    LabHandler,
    restored_notice,
)

__all__ = ["Agent"]

HEADER = "X-Budgethub-Agent"
FLUSH_EXPRESSION = "__import__('budgethub_session.snapshot', fromlist=['flush_json']).flush_json()"
MAX_WITHIN = 3600.0
MAX_MESSAGE = 300
RESTORE_NOTICE = "restore-notice.json"
"""The snapshot's summary the Hub writes beside the kernel state, for the lab's notice."""
DEFAULT_WITHIN = 30.0


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class Agent:
    def __init__(self, serverapp: Any, secret: str) -> None:
        self.app = serverapp
        self.secret = secret
        self.lab = LabChannel()

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

    async def checkpoint(self, within: float, message: str = PREEMPTING) -> dict[str, Any]:
        """Flush every kernel while the open labs show ``message`` and save their
        documents (at most half of ``within``)."""
        t0 = time.monotonic()
        deadline = t0 + within
        km = self.app.kernel_manager
        sessions = await self._sessions()
        kids = list(km.list_kernel_ids())
        before = {kid: getattr(km.get_kernel(kid), "last_activity", None) for kid in kids}
        labs = asyncio.ensure_future(self.lab.preempting(message, min(within / 2, LAB_WAIT_MAX)))
        reports = await asyncio.gather(
            *(self._flush(kid, sessions.get(kid, {}).get("path"), deadline, within) for kid in kids)
        )
        notebooks = await self._notebooks(sessions, before, await labs)
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
            for key in ("state", "saved", "unsaved", "reopened", "bytes", "error"):
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
        self,
        sessions: dict[str, dict[str, Any]],
        before: dict[str, datetime | None],
        labs: dict[str, Any],
    ) -> dict[str, Any]:
        """Each open notebook kept as saved, or why not. The open labs saved their
        documents with unsaved changes (``edits_saved``) or said why they could not;
        without an answer from every open lab, a notebook whose kernel ran after its
        last save may hold edits that live only in a browser."""
        saved: list[str] = []
        not_flushed: dict[str, str] = {}
        edits = {notebook_path(p) or p for p in labs["saved"]}
        failed = {notebook_path(p) or p: why for p, why in labs["failed"].items()}
        every_lab = labs["answered"] > 0 and labs["answered"] == labs["asked"]
        cm = self.app.contents_manager
        for kid, s in sessions.items():
            path = s.get("path")
            if not path or s.get("type") not in (None, "notebook") or path in failed:
                continue
            try:
                model = await ensure_async(cm.get(path, content=False))
            except Exception as error:
                not_flushed[path] = f"not on disk: {error}"
                continue
            modified = model.get("last_modified")
            ran = before.get(kid)
            if path in edits or every_lab:
                saved.append(path)
            elif isinstance(modified, datetime) and ran is not None and ran > modified:
                not_flushed[path] = (
                    f"its kernel ran after the file was last saved ({modified:%Y-%m-%d %H:%M:%S} "
                    f"UTC) and {_no_lab(labs)}; the file is kept as last saved"
                )
            else:
                saved.append(path)
        for path, why in failed.items():
            not_flushed[path] = f"JupyterLab could not save it ({why}); kept as last saved"
        return {
            "saved": sorted(set(saved)),
            "not_flushed": dict(sorted(not_flushed.items())),
            "edits_saved": sorted(edits),
            "labs": {"asked": labs["asked"], "answered": labs["answered"]},
        }


def _no_lab(labs: dict[str, Any]) -> str:
    if not labs["asked"]:
        return "no JupyterLab was open to save its unsaved edits"
    return (
        f"{labs['asked'] - labs['answered']} of {labs['asked']} open JupyterLab pages did "
        "not answer in time to save their unsaved edits"
    )


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
        message = body.get("message", PREEMPTING)
        if not isinstance(message, str) or not 0 < len(message) <= MAX_MESSAGE:
            raise _error(400, f"message: must be a text of 1 to {MAX_MESSAGE} characters")
        self.reply(await self.agent.checkpoint(float(within), message))


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "budgethub_session.agent"}]


def session_notebook(path: str | None, name: str | None, root: str) -> str | None:
    """The notebook of a session that starts a kernel: its path when that is a file;
    else (JupyterLab starts a session at ``<notebook's directory>/<uuid>`` and moves it
    to the notebook's path once the kernel runs) that directory and the name's last
    part (JupyterLab's name is the file's name; other clients send the whole path)."""
    rel = notebook_path(path or "")
    if rel and os.path.isfile(os.path.join(root, rel)):
        return rel
    if name:
        return notebook_path(posixpath.join(posixpath.dirname(rel or ""), posixpath.basename(name)))
    return rel


def _key_kernels_by_path(session_manager: Any, root: str) -> None:
    """Every kernel a session starts (or restarts after a rename) gets
    ``$BUDGETHUB_NOTEBOOK``: its notebook's path, whatever name the client sent."""
    get_kernel_env = session_manager.get_kernel_env

    def with_notebook(path: str | None, name: Any = None) -> dict[str, str]:
        env = dict(get_kernel_env(path, name))
        notebook = session_notebook(path, name if isinstance(name, str) else None, root)
        if notebook:
            env[NOTEBOOK_ENV] = notebook
        else:
            env.pop(NOTEBOOK_ENV, None)
        return env

    session_manager.get_kernel_env = with_notebook


def _announce_restore(agent: Agent, log: Any) -> None:
    """A restored session's labs say what came back (the Hub's summary, if any)."""
    source = os.environ.get(RESTORE_ENV)
    if not source:
        return
    try:
        with open(os.path.join(source, RESTORE_NOTICE), encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as error:
        log.warning("budgethub agent: the snapshot's %s: %s", RESTORE_NOTICE, error)
        return
    if isinstance(data, dict):
        agent.lab.announce(restored_notice(data))


def _load_jupyter_server_extension(serverapp: Any) -> None:
    secret = os.environ.pop(SECRET_ENV, "")  # kernels and terminals do not inherit it
    os.environ[ROOT_ENV] = os.path.abspath(os.path.expanduser(serverapp.root_dir))
    os.environ.pop(NOTEBOOK_ENV, None)
    _key_kernels_by_path(serverapp.session_manager, os.environ[ROOT_ENV])
    agent = Agent(serverapp, secret)
    _announce_restore(agent, serverapp.log)
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
            (url_path_join(base, "budgethub-agent/lab"), LabHandler, {"channel": agent.lab}),
        ],
    )
    serverapp.log.info(
        "budgethub agent at %sbudgethub-agent/ (%s)",
        base,
        "secret set" if secret else "no secret: 503",
    )
