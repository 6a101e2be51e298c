"""The Hub's proxy: JupyterHub's Node.js configurable-http-proxy, with secrets kept out of its log.

``proxy/`` holds configurable-http-proxy (the npm package JupyterHub runs by
default), pinned by ``proxy/package-lock.json`` and installed there by ``make``
(``npm ci``). It streams responses (the spawn page's progress events) and
websockets, and has no cap on concurrent backend connections.

``configure_hub`` runs it through this file, as a script::

    python -I spawner/chp.py NODE CHP_BIN [CHP options...]

which starts ``NODE CHP_BIN options`` and copies the proxy's output to its own
with secrets redacted (``redact``): URL parameters such as ``token=`` (also
inside an URL-encoded URL, as in the error page's ``?url=``) and Authorization
header values. SIGTERM, SIGINT and SIGHUP are passed on to the proxy, so that
the Hub's stop (SIGTERM to the pid it started) stops it, and the launcher exits
with the proxy's status. If the launcher itself is killed, the proxy gets
SIGTERM from the kernel (parent-death signal), so no proxy is left holding the
ports. This file needs only the standard library.
"""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REDACTED = "[redacted]"
ROOT = Path(__file__).resolve().parent.parent
"""The checkout (or the directory the package was installed from)."""
PROXY_DIR = ROOT / "proxy"
CHP_BIN = PROXY_DIR / "node_modules" / "configurable-http-proxy" / "bin" / "configurable-http-proxy"

# A URL parameter whose name holds one of these (JupyterHub scrubs the same names in
# its access log), its '?'/'&' and '=' possibly percent-encoded, once or more.
_ENC = r"%(?:25)*"
_PARAM = re.compile(
    rf"((?:^|[?&;\s]|{_ENC}3[Ff]|{_ENC}26)"
    r"[\w.\-\[\]]*(?:token|auth|key|secret|password|code|state|xsrf)[\w.\-\[\]]*"
    rf"(?:=|{_ENC}3[Dd]))"
    rf"(?!\[)((?:(?!{_ENC}26)[^\s&;#\"'<>,)\]}}])+)",
    re.IGNORECASE,
)
# An Authorization header's value, in "Authorization: token X", a dict or JSON dump.
_HEADER = re.compile(
    r"((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:(?:token|bearer|basic)\s+)?)"
    r"(?!\[)([^\s\"',}]+)",
    re.IGNORECASE,
)
# A bare "token X" / "Bearer X" (CHP logs a refused API request's header this way);
# X must look like a secret (16+ characters, a digit among them), not like a word.
_SCHEME = re.compile(
    r"\b((?:token|bearer|basic)\s+)(?=[\w.~+/=\-]*\d)([\w.~+/=\-]{16,})",
    re.IGNORECASE,
)

# JupyterHub logs the id its xsrf tokens are made from ("Setting new xsrf cookie for
# b'SESSION:HASH' {...}"): with it anyone reading the log could forge a form's token.
_XSRF_ID = re.compile(r"(xsrf cookie for )b?(['\"])[^'\"]*\2", re.IGNORECASE)

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def redact(text: str) -> str:
    """``text`` with token-like URL parameters and Authorization values replaced."""
    text = _PARAM.sub(rf"\1{REDACTED}", text)
    text = _HEADER.sub(rf"\1{REDACTED}", text)
    text = _XSRF_ID.sub(rf"\1{REDACTED}", text)
    return _SCHEME.sub(rf"\1{REDACTED}", text)


class RedactFilter(logging.Filter):
    """A logging filter (for handlers) that redacts secrets from messages and tracebacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format: let the handler report it as usual
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            if redact(text) != text:
                record.exc_text = redact(text)
        return True


def _die_with_parent() -> None:
    """In the proxy (before exec): SIGTERM when the launcher dies (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: chp.py NODE CHP_BIN [options...]", file=sys.stderr)
        return 2
    proxy = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )

    def forward(signum: int, _frame: Any) -> None:
        if proxy.poll() is None:
            proxy.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    assert proxy.stdout is not None
    out = sys.stdout.buffer
    plain = not sys.stdout.isatty()  # a log file: without the proxy's colour codes
    for line in iter(proxy.stdout.readline, b""):  # ends when the proxy closes its output
        text = line.decode("utf-8", "replace")
        try:
            out.write(redact(_COLOUR.sub("", text) if plain else text).encode("utf-8"))
            out.flush()
        except OSError:  # nowhere to log to: keep proxying all the same
            pass
    return proxy.wait()


if __name__ == "__main__":
    sys.exit(main())
