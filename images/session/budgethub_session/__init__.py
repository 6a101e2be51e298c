"""budgethub's in-session half of snapshot/restore (see docs/snapshots.md).

* :mod:`budgethub_session.snapshot`: an IPython extension loaded for every kernel;
  after each cell it saves, in a background thread, what changed in the user
  namespace, per group of variables that share references, under
  ``$BUDGETHUB_STATE_DIR/notebook_key(notebook)/``; on kernel start with
  ``$BUDGETHUB_RESTORE_DIR`` it loads that notebook's variables back.
* :mod:`budgethub_session.agent`: a Jupyter Server extension the spawner talks to
  (status, "checkpoint now within N seconds"), guarded by a per-session secret.
* :mod:`budgethub_session.checkpoint`: the serializer and the on-disk layout, with no
  IPython in it (the GPU check and the tests use it directly).

Installed packages stay in the home directory: ``/opt/venv`` is root-owned and not
writable by the session user, and its ``pyvenv.cfg`` says
``include-system-site-packages = true`` so that Python's user site is on.
``pip install`` and ``%pip install`` then fall back to ``~/.local`` (pip: "Defaulting
to user installation because normal site-packages is not writeable"), which is
part of the home that every restore brings back; ``budgethub_usersite`` (a .pth)
creates that directory at interpreter start so that the first ``%pip install`` in a
fresh home is importable without restarting the kernel. conda/mamba environments a
user makes live in ``~/.conda``, ``~/micromamba`` or wherever they put them under the
home, and kernels they register go to ``~/.local/share/jupyter``: all in the home.
We chose the home over ``docker commit`` because commits pause the container, leave
the home volume out and hit the layer limit after about 127 cycles.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from pathlib import Path

__all__ = ["notebook_key", "notebook_path", "restored_dir", "state_dir"]

SECRET_ENV = "BUDGETHUB_AGENT_SECRET"
STATE_ENV = "BUDGETHUB_STATE_DIR"
RESTORE_ENV = "BUDGETHUB_RESTORE_DIR"
RESTORED_ENV = "BUDGETHUB_RESTORED_DIR"
ROOT_ENV = "BUDGETHUB_SERVER_ROOT"
NOTEBOOK_ENV = "BUDGETHUB_NOTEBOOK"


def notebook_key(path: str) -> str:
    """The state subdirectory of a notebook: sha256 hex[:16] of its server-relative path."""
    return hashlib.sha256(path.encode("utf-8")).hexdigest()[:16]


def notebook_path(session_name: str | None = None) -> str | None:
    """The notebook this kernel belongs to, relative to the server root, or None.

    The one key of a notebook everywhere (kernel state, agent, report): its API path,
    normalized. The agent gives every kernel ``$BUDGETHUB_NOTEBOOK``, its notebook's
    API path (`budgethub_session.agent.session_notebook`), because
    ``JPY_SESSION_NAME`` depends on the name a client sends: Jupyter Server makes it
    ``os.path.join(<notebook's directory on disk>, name)``, so a client naming its
    session by the full relative path gave a second key (``work/work/a.ipynb``).
    ``JPY_SESSION_NAME`` is the fallback (a server without the agent); an absolute
    path is made relative to ``$BUDGETHUB_SERVER_ROOT`` (the home without it).
    """
    if session_name is None:
        name = os.environ.get(NOTEBOOK_ENV) or os.environ.get("JPY_SESSION_NAME")
    else:
        name = session_name
    if not name:
        return None
    name = name.replace(os.sep, "/")
    if os.path.isabs(name):
        root = os.environ.get(ROOT_ENV) or os.path.expanduser("~")
        rel = os.path.relpath(os.path.normpath(name), os.path.normpath(root))
        if not rel.startswith(".."):
            name = rel
    name = posixpath.normpath("/" + name.replace(os.sep, "/")).lstrip("/")
    return name or None


def state_dir() -> Path:
    """Where kernels keep their checkpoints: $BUDGETHUB_STATE_DIR or ~/.budgethub/kernels."""
    return Path(os.environ.get(STATE_ENV) or os.path.expanduser("~/.budgethub/kernels"))


def restored_dir() -> Path:
    """Markers of restores already done in this home: ~/.budgethub/restored."""
    return Path(os.environ.get(RESTORED_ENV) or os.path.expanduser("~/.budgethub/restored"))
