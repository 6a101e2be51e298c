"""What this session was granted, shown where a JupyterLab user looks: a launcher card.

jupyter-server-proxy's ``launcher_entry`` gives a real card on JupyterLab's launcher
with no JavaScript build: the card's title already says what was granted ("1 GPU,
virtual · nlp · funded"), and clicking it opens this module's page in a Lab tab
(served by a small stdlib ``http.server`` that jupyter-server-proxy starts on demand).
A prebuilt labextension (a status-bar item) would need a Node toolchain in the image
build for one line of text; this needs one pip package and no build step.

Everything comes from the environment the spawner gave the container
(``spawner/runtime/spec.py``): ``BUDGETHUB_GPU_SLICES`` (each slice's kind, weight and
whether it is virtual), ``BUDGETHUB_TEAM``, ``BUDGETHUB_FUNDED``,
``BUDGETHUB_PROTECTED_UNTIL``, ``BUDGETHUB_NODE`` and ``BUDGETHUB_PROFILE``.
``server_proxy_servers`` is read by ``jupyter_server_config.py`` (installed by the
base image) each time the server starts, so the card fits this session.

    python -m budgethub_session.grant --port 8123     # the page, for jupyter-server-proxy
    python -m budgethub_session.grant --print         # the facts, as text
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

NAME = "budgethub-grant"
"""The proxied server's name: its URL is ``/user/NAME/budgethub-grant/``."""
ICON = Path(__file__).resolve().parent / "etc" / "grant.svg"


@dataclass(frozen=True)
class Grant:
    """What the scheduler granted this session, as the spawner put it in the environment."""

    slices: tuple[Mapping[str, Any], ...]
    team: str
    funded: bool | None
    protected_until: float | None
    node: str
    profile: str

    @property
    def virtual(self) -> bool | None:
        """True if every GPU slice is virtual (declared in config, no device), False if
        they are real, None without GPUs (or when the spawner did not say)."""
        marks = {s.get("virtual") for s in self.slices}
        if not self.slices or None in marks:
            return None
        return marks == {True}

    @property
    def gpus(self) -> str:
        """``1 GPU``, ``2 GPUs``, ``one 1g.10gb MIG instance``, ``0.25 of a GPU``, ``no GPU``."""
        if not self.slices:
            return "no GPU"
        kinds = {str(s.get("kind")) for s in self.slices}
        weight = sum(float(s.get("weight", 0)) for s in self.slices)
        if kinds == {"mig"}:
            n = len(self.slices)
            return f"{n} MIG instance{'s' if n > 1 else ''} ({weight:.3g} of a GPU)"
        if kinds == {"fraction"}:
            return f"{weight:.3g} of a GPU"
        n = len(self.slices)
        return f"{n} GPU{'s' if n > 1 else ''}"

    def summary(self) -> str:
        """One line for the launcher card: ``1 GPU, virtual · nlp · funded``."""
        kind = {None: "", True: ", virtual", False: ", real"}[self.virtual]
        parts = [self.gpus + kind]
        if self.team:
            parts.append(self.team)
        if self.funded is not None:
            parts.append("funded" if self.funded else "unallocated")
        return " · ".join(parts)

    def rows(self, now: float | None = None) -> list[tuple[str, str]]:
        """The page's table: (what, value)."""
        now = time.time() if now is None else now
        if self.virtual is True:
            kind = "virtual (declared for this cluster; no real device is attached)"
        elif self.virtual is False:
            kind = "real (the NVIDIA runtime gave this container exactly these devices)"
        else:
            kind = "none" if not self.slices else "not said"
        if self.funded is None:
            funding = "not said"
        elif self.funded:
            funding = "funded by your team's budget"
        else:
            funding = "unallocated: on idle capacity, and may be stopped for funded work"
        if self.protected_until is None:
            protected = "not said"
        elif self.protected_until <= now:
            protected = f"no longer (since {_clock(self.protected_until)})"
        else:
            left = (self.protected_until - now) / 60
            protected = f"until {_clock(self.protected_until)} ({left:.0f} min from now)"
        rows = [
            ("GPUs", self.gpus),
            ("GPU kind", kind),
            ("Team", self.team or "not said"),
            ("Funding", funding),
            ("Protected from preemption", protected),
            ("Node", self.node or "not said"),
            ("Profile", self.profile or "not said"),
        ]
        for i, piece in enumerate(self.slices):
            what = f"{piece.get('kind')} {piece.get('uuid')} ({piece.get('weight')} GPU)"
            rows.append((f"Slice {i + 1}", what))
        return rows


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


def grant_from(env: Mapping[str, str]) -> Grant:
    """The grant from an environment (bad or missing values read as "not said")."""
    try:
        raw = json.loads(env.get("BUDGETHUB_GPU_SLICES", "[]") or "[]")
        slices = tuple(s for s in raw if isinstance(s, Mapping)) if isinstance(raw, list) else ()
    except ValueError:
        slices = ()
    funded_text = env.get("BUDGETHUB_FUNDED")
    funded = None if funded_text not in ("0", "1") else funded_text == "1"
    try:
        protected: float | None = float(env["BUDGETHUB_PROTECTED_UNTIL"])
    except (KeyError, ValueError):
        protected = None
    return Grant(
        slices=slices,
        team=env.get("BUDGETHUB_TEAM", ""),
        funded=funded,
        protected_until=protected,
        node=env.get("BUDGETHUB_NODE", ""),
        profile=env.get("BUDGETHUB_PROFILE", ""),
    )


def render(grant: Grant, now: float | None = None) -> str:
    """The page (it opens in a Lab tab's iframe, which gets none of Lab's styles: it
    follows the browser's light or dark scheme instead)."""
    esc = html.escape
    rows = "\n".join(
        f"<tr><th scope='row'>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in grant.rows(now)
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Your session: {esc(grant.summary())}</title>
<meta name="color-scheme" content="light dark">
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5rem; }}
h1 {{ font-size: 1.25rem; }}
table {{ border-collapse: collapse; }}
th, td {{ text-align: left; padding: .35rem .8rem; border-bottom: 1px solid #8884; }}
th {{ font-weight: 600; }}
.summary {{ font-size: 1.05rem; margin-bottom: 1rem; }}
</style></head>
<body><h1>What this session was granted</h1>
<p class="summary" id="summary">{esc(grant.summary())}</p>
<table id="grant">{rows}</table>
<p><small>From the budget scheduler, when this session started.</small></p>
</body></html>
"""


def server_proxy_servers(env: Mapping[str, str]) -> dict[str, Any]:
    """``c.ServerProxy.servers`` for this session: the page, with a launcher card whose
    title says what was granted."""
    return {
        NAME: {
            "command": [sys.executable, "-m", "budgethub_session.grant", "--port", "{port}"],
            "timeout": 20,
            "new_browser_tab": False,
            "launcher_entry": {
                "title": f"Your session: {grant_from(env).summary()}",
                "category": "Notebook",  # the launcher shows icon_url only for these
                "icon_path": str(ICON),
            },
        }
    }


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = render(grant_from(os.environ)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # the Lab tab polls nothing; nothing worth a line in the server's log


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m budgethub_session.grant")
    parser.add_argument("--port", type=int, help="serve the page on 127.0.0.1:PORT")
    parser.add_argument("--print", action="store_true", help="print the grant and exit")
    args = parser.parse_args(argv)
    grant = grant_from(os.environ)
    if args.print or args.port is None:
        print(grant.summary())
        for what, value in grant.rows():
            print(f"  {what}: {value}")
        return
    ThreadingHTTPServer(("127.0.0.1", args.port), _Page).serve_forever()


if __name__ == "__main__":
    main()
