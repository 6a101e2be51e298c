"""Log filters both of budgethub's processes put on their handlers: the Hub and the budget service.

``QuietRefusalFilter`` makes a refused spawn (the user's input, answered with a 4xx that
names the field) one WARNING line instead of an ERROR with a traceback;
``chp.RedactFilter`` keeps tokens out of every line. They live below the Hub's side and
the read model's, so that the service, its own process, need not import the Hub's
configuration to use them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from spawner import chp

LOGGED_CHARS = 200
"""The most of a refusal's message that its log line repeats."""

_NOT_STARTING = re.compile(
    r"Not starting (?P<whose>.*)'s server (?P<server>.*?): (?P<status>4\d\d) "
    r"\w+\(reason=(?P<reason>[^)]*)\): (?P<message>.*)\Z",
    re.DOTALL,
)
"""JupyterHub's own line for a spawn whose ``start()`` raised a SpawnException (or a
subclass, such as the spawner's ``Refusal``) with a 4xx (``user.py``: ``Not starting
{user}'s server {name}: {exception}``)."""


def _cut(text: str, limit: int = LOGGED_CHARS) -> str:
    """One line of at most about ``limit`` characters, saying how long the text was."""
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


class QuietRefusalFilter(logging.Filter):
    """A handler filter: a refused spawn (the user's input, answered with a 4xx naming the
    field) becomes one WARNING line with the refusal's message cut short; any other
    error is left as it is. Two records are refusals:

    * the Hub's ``Failed to spawn single-user server with form`` with a 4xx HTTPError
      and its traceback (a refused form);
    * the Hub's ``Not starting ann's server : 400 SpawnException(reason=form): …`` at
      ERROR (a refused REST spawn, and the admin page's "Start Server").
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and not record.exc_info:
            return self._not_starting(record)
        if not record.exc_info or not str(record.msg).startswith("Failed to spawn"):
            return True
        error = record.exc_info[1]
        status = getattr(error, "status_code", 500)
        if not isinstance(status, int) or not 400 <= status < 500:
            return True
        message = getattr(error, "jupyterhub_message", None) or getattr(error, "log_message", "")
        record.msg, record.args = "Spawn form refused (%s): %s", (status, _cut(str(message)))
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        return True

    @staticmethod
    def _not_starting(record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if not text.startswith("Not starting "):
            return True
        if record.args:
            try:
                text = record.getMessage()
            except (TypeError, ValueError):
                return True
        found = _NOT_STARTING.match(text)
        if found is None:
            return True
        whose, server = found["whose"], found["server"]
        record.msg = "Spawn refused (%s, %s) for %s's server %r: %s"
        record.args = (
            int(found["status"]),
            found["reason"],
            _cut(whose, 60),
            _cut(server, 60),
            _cut(found["message"]),
        )
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def redact_log_handlers(loggers: Iterable[logging.Logger]) -> None:
    """Put the redaction filter on every handler of ``loggers`` that lacks it."""
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, QuietRefusalFilter) for f in handler.filters):
                handler.addFilter(QuietRefusalFilter())
            if not any(isinstance(f, chp.RedactFilter) for f in handler.filters):
                handler.addFilter(chp.RedactFilter())
