"""Make Python's user site exist and be on sys.path at interpreter start.

Imported by ``budgethub_usersite.pth`` in the image's venv (a top-level module, so
that every Python start pays for ``os`` and ``site`` only). Python only puts
``~/.local/lib/pythonX.Y/site-packages`` on ``sys.path`` when the directory exists
when the interpreter starts; in a fresh home it does not, so the first ``%pip
install`` (which lands there, the venv being read-only) would not import until the
kernel restarts. This creates it. Errors are ignored: a read-only or missing home
must never stop Python from starting.
"""

from __future__ import annotations

import os
import site
import sys


def ensure() -> None:
    enabled = site.ENABLE_USER_SITE
    # None: still inside site.main(), which processes the venv's .pth files before it
    # decides on the user site and then adds it (it will exist by then).
    starting = enabled is None
    if starting:
        enabled = site.check_enableusersite()
    if not enabled:
        return
    try:
        path = site.getusersitepackages()
        if not os.path.isdir(path):
            os.makedirs(path, exist_ok=True)
    except OSError:
        return
    if not starting and path not in sys.path:
        site.addsitedir(path)


ensure()
