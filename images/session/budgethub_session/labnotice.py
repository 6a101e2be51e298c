"""The agent's side facing JupyterLab: notices the lab shows, and the lab's saves.

The lab extension ``budgethub-lab`` (images/session/labextension, shipped prebuilt in
``budgethub_session/labextension``) long-polls ``GET budgethub-agent/lab``; when the
spawner asks for a checkpoint, the agent posts a "preempting" notice, every open lab
shows it, saves its documents with unsaved changes and answers with ``POST
budgethub-agent/lab`` what it saved and what it could not; the agent waits for the
labs it knows (bounded) before it reports the notebooks. After a restore, a
"restored" notice says what came back and what did not.

A long poll rather than Jupyter Server's event bus: the agent must know which labs
are open to wait for their saves, and a lab that polls is one. These routes use
Jupyter Server's own login (the user's browser), unlike the spawner's routes.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

__all__ = ["LabChannel", "LabHandler", "restored_notice"]

POLL_SECONDS = 25.0
"""How long a lab's poll is held when there is nothing new."""
LIVE_SECONDS = POLL_SECONDS + 10.0
"""A lab that polled this recently (or is polling) is open: its saves are waited for."""
LAB_WAIT_MAX = 10.0
"""The longest a checkpoint waits for the open labs' saves."""
MAX_CLIENTS = 64
PREEMPTING = (
    "This session is being stopped for a funded request; your variables, files and "
    "packages are being saved."
)
_CLIENT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_PATHS = 1000


class LabChannel:
    """Notices for the open labs, which labs are open, and what they saved."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.instance = secrets.token_hex(8)  # a restarted server's notices start at 1 again
        self.seq = 0
        self.notices: list[dict[str, Any]] = []
        self.seen: dict[str, float] = {}  # client -> last poll (or its end)
        self.polling: dict[str, int] = {}  # client -> polls held now
        self.answers: dict[int, dict[str, dict[str, Any]]] = {}  # seq -> client -> answer
        self._wake = asyncio.Event()

    def _changed(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def announce(self, notice: Mapping[str, Any]) -> dict[str, Any]:
        self.seq += 1
        entry = {**notice, "seq": self.seq}
        self.notices.append(entry)
        self._changed()
        return entry

    def live(self) -> set[str]:
        now = self.clock()
        return {c for c, t in self.seen.items() if self.polling.get(c) or now - t <= LIVE_SECONDS}

    async def poll(self, client: str, after: int, timeout: float = POLL_SECONDS) -> dict[str, Any]:
        """The notices newer than ``after``, as soon as there is one (or none after
        ``timeout``)."""
        if client not in self.seen and len(self.seen) >= MAX_CLIENTS:
            oldest = min(self.seen, key=lambda c: self.seen[c])
            self.seen.pop(oldest)
        self.seen[client] = self.clock()
        self.polling[client] = self.polling.get(client, 0) + 1
        deadline = self.clock() + timeout
        try:
            while True:
                new = [n for n in self.notices if n["seq"] > after]
                left = deadline - self.clock()
                if new or left <= 0:
                    return {"instance": self.instance, "seq": self.seq, "notices": new}
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except TimeoutError:
                    pass
        finally:
            self.polling[client] -= 1
            if not self.polling[client]:
                del self.polling[client]
            self.seen[client] = self.clock()

    def answer(self, client: str, seq: int, saved: list[str], failed: dict[str, str]) -> None:
        if not any(n["seq"] == seq and n["kind"] == "preempting" for n in self.notices):
            raise ValueError(f"seq: {seq} is not a preemption notice")
        self.answers.setdefault(seq, {})[client] = {"saved": saved, "failed": failed}
        self._changed()

    async def preempting(self, message: str, wait: float) -> dict[str, Any]:
        """Tell the open labs, and wait (at most ``wait`` s) until each has answered
        with what it saved."""
        notice = self.announce({"kind": "preempting", "message": message})
        asked = self.live()
        deadline = self.clock() + wait
        while True:
            answered = self.answers.get(notice["seq"], {})
            left = deadline - self.clock()
            if asked <= set(answered) or left <= 0:
                break
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                pass
        answered = dict(self.answers.get(notice["seq"], {}))
        return {
            "asked": len(asked),
            "answered": len(answered),
            "saved": sorted({p for a in answered.values() for p in a["saved"]}),
            "failed": {p: w for a in answered.values() for p, w in a["failed"].items()},
        }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def restored_notice(data: Mapping[str, Any]) -> dict[str, Any]:
    """The "restored" notice from the snapshot's summary (the Hub writes it beside the
    kernel state): a line for the toast (at most 140 characters, JupyterLab's limit)
    and the full lists for its details."""
    when = data.get("time")
    stamp = time.strftime("%H:%M UTC", time.gmtime(when)) if isinstance(when, int | float) else ""
    kernels = [k for k in data.get("kernels") or [] if isinstance(k, dict)]
    variables = sum(len(k.get("variables") or []) for k in kernels)
    notebooks = sum(1 for k in kernels if k.get("variables"))
    unsaved = {str(k): str(v) for k, v in dict(data.get("unsaved") or {}).items()}
    edits = [str(p) for p in data.get("edits_saved") or []]
    files = data.get("files")
    where = "the whole home" if files in (None, "kept in the home") else str(files)
    back = [f"Your files and installed packages ({where})."]
    for k in kernels:
        names = [str(v) for v in k.get("variables") or []]
        if names:
            back.append(
                f"{k.get('notebook')}: {_plural(len(names), 'variable')} ({', '.join(names)}),"
                " loaded when its kernel starts"
            )
    back += [f"{p}: the edits you had not saved" for p in edits]
    lost = [f"{name}: {why}" for name, why in sorted(unsaved.items())]
    message = (
        f"Restored from the snapshot of {stamp}: your files, packages"
        + (f" and {_plural(variables, 'variable')} of {_plural(notebooks, 'notebook')}")
        + (f"; {len(lost)} not kept" if lost else "")
        + "."
    )
    return {
        "kind": "restored",
        "key": str(data.get("key") or ""),
        "message": message[:140],
        "back": back,
        "lost": lost,
    }


class LabHandler(APIHandler):
    """``budgethub-agent/lab``: a lab's long poll (GET) and its saves (POST)."""

    auth_resource = "contents"
    _track_activity = False  # a lab's polls and saves asked for by the spawner are not the user's
    channel: LabChannel

    def initialize(self, channel: LabChannel) -> None:
        self.channel = channel
        self._poll: asyncio.Future[dict[str, Any]] | None = None

    def _client(self, value: Any) -> str:
        if not isinstance(value, str) or not _CLIENT.match(value):
            raise web.HTTPError(400, "client: must be 1 to 64 letters, digits, - or _")
        return value

    @web.authenticated
    @authorized
    async def get(self) -> None:
        client = self._client(self.get_query_argument("client", ""))
        after_arg = self.get_query_argument("after", "0")
        if not after_arg.isdigit():
            raise web.HTTPError(400, "after: must be a whole number >= 0")
        try:
            wait = float(self.get_query_argument("wait", str(POLL_SECONDS)))
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= POLL_SECONDS:
            raise web.HTTPError(400, f"wait: must be 0 to {POLL_SECONDS:g} seconds")
        self._poll = asyncio.ensure_future(self.channel.poll(client, int(after_arg), wait))
        try:
            body = await self._poll
        except asyncio.CancelledError:
            return  # the lab went away
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def on_connection_close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()

    @web.authenticated
    @authorized
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as error:
            raise web.HTTPError(400, f"body: not JSON ({error})") from error
        if not isinstance(body, dict):
            raise web.HTTPError(400, "body: must be a JSON object")
        client = self._client(body.get("client"))
        seq = body.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise web.HTTPError(400, "seq: must be the notice's number")
        saved, failed = body.get("saved", []), body.get("failed", {})
        if not isinstance(saved, list) or not all(isinstance(p, str) for p in saved):
            raise web.HTTPError(400, "saved: must be a list of paths")
        if not isinstance(failed, dict) or not all(isinstance(v, str) for v in failed.values()):
            raise web.HTTPError(400, "failed: must map paths to reasons")
        if len(saved) + len(failed) > MAX_PATHS:
            raise web.HTTPError(400, f"saved, failed: at most {MAX_PATHS} paths")
        try:
            self.channel.answer(client, seq, saved, {k: v[:500] for k, v in failed.items()})
        except ValueError as error:
            raise web.HTTPError(400, str(error)) from None
        self.set_status(204)
        self.finish()
