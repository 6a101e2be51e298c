"""Word when a queued session starts (issue 41): an optional hook for mail or chat.

``c.BudgetScheduler.start_hook`` is a callable (given the facts as a dict; it may be a
coroutine function) or a URL template (``{user}``, ``{server}``, ``{team}``, … filled in,
URL-quoted) to which the facts are POSTed as JSON. It is called for a session that
waited at least ``start_hook_after`` seconds in the queue, once its server answers. The
hook runs off the spawn: a slow or failing receiver is logged and never delays or fails
a start. (The browser notification of the spawn page and My sessions needs no setting.)

The traits are a base class of `BudgetScheduler` beside `SchedulerConfig`, so they are
set as ``c.BudgetScheduler.start_hook`` and listed in docs/configuration.md.
"""

from __future__ import annotations

import inspect
import json
import string
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from traitlets import Any as AnyTrait
from traitlets import Float, TraitError, validate
from traitlets.config import Configurable

FIELDS = ("user", "server", "team", "profile", "node", "request", "waited_s", "funded", "url")
"""What a hook is told (the keys of its dict, the names a URL template may use)."""


def template_fault(template: str) -> str | None:
    """Why a URL template cannot be used (None: it can)."""
    if not template.startswith(("http://", "https://")):
        return f"must be a callable or an http(s) URL template, not {template!r}"
    try:
        names = [n for _, n, _, _ in string.Formatter().parse(template) if n is not None]
    except ValueError as error:
        return f"is not a valid template ({error})"
    unknown = sorted(set(names) - set(FIELDS))
    if unknown:
        return f"uses {{{unknown[0]}}}; a template may use {', '.join(FIELDS)}"
    return None


class StartHookConfig(Configurable):
    """The start hook's traits (see the module's docstring)."""

    start_hook = AnyTrait(
        None,
        allow_none=True,
        help="""Called when a session that waited in the queue starts: a callable, given a
        dict of user, server, team, profile, node, request, waited_s, funded and url (the
        server's path on the Hub; a coroutine function is awaited), or an http(s) URL
        template, filled in with the same names (URL-quoted) and sent those facts as a
        JSON POST, e.g. 'https://chat.example.org/hooks/T0K3N?user={user}'. None: no
        hook. Failures are logged; they never hold up a start.""",
    ).tag(config=True)

    start_hook_after = Float(
        60.0,
        help="""Seconds a session must have waited in the queue for the start hook to be
        called (a session that started at once needs no word).""",
    ).tag(config=True)

    start_hook_timeout = Float(
        10.0, help="Seconds a start hook's POST may take before it is given up (logged)."
    ).tag(config=True)

    @validate("start_hook")
    def _check_start_hook(self, proposal: Any) -> Any:
        value = proposal["value"]
        if value is None or callable(value):
            return value
        if not isinstance(value, str):
            raise TraitError(
                "c.BudgetScheduler.start_hook: must be a callable or an http(s) URL "
                f"template, not {type(value).__name__}"
            )
        fault = template_fault(value)
        if fault:
            raise TraitError(f"c.BudgetScheduler.start_hook: {fault}")
        return value

    @validate("start_hook_after", "start_hook_timeout")
    def _check_seconds(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not 0 <= value < float("inf"):
            name = proposal["trait"].name
            raise TraitError(f"c.BudgetScheduler.{name}: must be 0 or more seconds, not {value}")
        return value


def hook_url(template: str, facts: Mapping[str, Any]) -> str:
    """The template filled in, each value URL-quoted."""
    return template.format_map({k: quote(str(v), safe="") for k, v in facts.items()})


async def call_hook(hook: Any, facts: Mapping[str, Any], timeout: float, log: Any) -> bool:
    """Call the hook once; True if it took the facts, False (logged) if it failed."""
    try:
        if callable(hook):
            result = hook(dict(facts))
            if inspect.isawaitable(result):
                await result
        else:
            await AsyncHTTPClient().fetch(
                HTTPRequest(
                    hook_url(str(hook), facts),
                    method="POST",
                    headers={"Content-Type": "application/json"},
                    body=json.dumps(dict(facts)),
                    request_timeout=timeout,
                    connect_timeout=timeout,
                )
            )
    except Exception as error:
        log.warning(
            "budgethub: the start hook failed for %s's server %r: %s",
            facts.get("user"),
            facts.get("server"),
            error,
        )
        return False
    log.info("budgethub: start hook told of %s's server %r", facts.get("user"), facts.get("server"))
    return True
