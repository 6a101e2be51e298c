"""Homes and the snapshot store on the Hub's side: where they live, and how a preempted
session's kernel state is copied, recorded, kept and deleted.

Homes are whole ``/home/jovyan`` directories: with ``home_root`` a bind mount of
``{home_root}/{hub}/{user}`` (shared storage, so every node sees the same home),
else the user's named volume. Packages come back with the home: the images'
``/opt/venv`` is read-only for the user, so ``pip install`` and ``%pip`` fall back
to ``~/.local`` and conda environments live in ``~/.conda``; nothing of the
container's own file system is kept, so twenty cycles cost no image layers
(``docker commit`` would pause the session, leave out volumes and stack layers).

A snapshot is ``{snapshot_root}/{hub}/{user}/{server}/{key}/`` holding ``kernels/``
(the session's state directory as the agent left it after its final checkpoint)
and ``report.json``. The Hub runs as root and the home belongs to the user, so the
copy never follows a link the user made (every directory and file is opened with
``O_NOFOLLOW`` relative to its parent), and it is written to a hidden partial
directory renamed into place only when complete: a failed copy leaves the home
and every earlier snapshot as they were.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spawner.runtime.spec import safe_name

SESSION_UID = 1000
SESSION_GID = 100
SESSION_OWNER = (SESSION_UID, SESSION_GID)
"""Who owns a session's home and snapshots unless its runtime names another owner (a
Slurm job running as the researcher's own account: `session_owner`)."""
STATE_SUBDIR = ".budgethub/servers"
"""Under the home: one kernel-state directory per server (``{server}/kernels``), so two
servers of one user, sharing the home, never mix their notebooks' state."""
RESTORE_TARGET = "/var/lib/budgethub/restore"
"""Where a restoring session sees its snapshot's kernel state (read-only)."""
HOME_TARGET = "/home/jovyan"

KEY_PATTERN = re.compile(r"^[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$")
"""A snapshot key, e.g. ``20261201T121500-1f2e3d4c``: a time and a random part."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_COPY_CHUNK = 1 << 20


class SnapshotError(RuntimeError):
    """A snapshot step that failed; the message says why, in words for the user."""


def new_key(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(4)}"


def server_part(server: str) -> str:
    return safe_name(server) if server else "default"


def state_dir_in_home(server: str) -> str:
    """The session's kernel-state directory, relative to the home."""
    return f"{STATE_SUBDIR}/{server_part(server)}/kernels"


def restored_dir_in_home(server: str) -> str:
    """Where the session marks the restores it has done, relative to the home."""
    return f"{STATE_SUBDIR}/{server_part(server)}/restored"


@dataclass(frozen=True)
class SnapshotLayout:
    """Where one Hub keeps homes (``home_root``, None: named volumes) and snapshots."""

    hub: str
    home_root: Path | None
    snapshot_root: Path

    def home(self, user: str) -> Path | None:
        if self.home_root is None:
            return None
        return self.home_root / safe_name(self.hub) / safe_name(user)

    def user_dir(self, user: str) -> Path:
        return self.snapshot_root / safe_name(self.hub) / safe_name(user)

    def server_dir(self, user: str, server: str) -> Path:
        return self.user_dir(user) / server_part(server)

    def snapshot_dir(self, user: str, server: str, key: str) -> Path:
        if not KEY_PATTERN.match(key):
            raise SnapshotError(f"{key!r} is not a snapshot key")
        return self.server_dir(user, server) / key

    def kernels_dir(self, user: str, server: str, key: str) -> Path | None:
        """The snapshot's kernel state, if it holds any."""
        path = self.snapshot_dir(user, server, key) / "kernels"
        return path if path.is_dir() and not path.is_symlink() else None


def session_home(runtime: Any, layout: SnapshotLayout, user: str) -> Path | None:
    """The user's home for a session on ``runtime``'s node: the runtime's own word where
    it has one (`SlurmRuntime.home_of`: the account's home), else the layout's."""
    own = getattr(runtime, "home_of", None)
    found = own(user) if callable(own) else None
    return found if found is not None else layout.home(user)


def session_owner(runtime: Any, user: str) -> tuple[int, int]:
    """(uid, gid) that the user's home and snapshots belong to, for a session on
    ``runtime``'s node: its own word where it has one, else the session user's."""
    own = getattr(runtime, "owner_of", None)
    found = own(user) if callable(own) else None
    return found if found is not None else SESSION_OWNER


def _owned_dir(path: Path, mode: int = 0o700, owner: tuple[int, int] = SESSION_OWNER) -> None:
    """``path`` exists as a real directory owned by ``owner``, with ``mode``."""
    path.mkdir(mode=mode, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise SnapshotError(f"{path} is not a directory")
    os.chown(path, *owner)
    os.chmod(path, mode)


def ensure_home(path: Path, owner: tuple[int, int] = SESSION_OWNER) -> None:
    """Create the user's home (and its ``work`` folder) if new: ``owner``'s (1000:100 by
    default), 0700; a home that was another's becomes ``owner``'s, all of it.

    The directories above it belong to the Hub (0711: passable, not listable)."""
    for parent in reversed(path.parents[:2]):
        if not parent.exists():
            parent.mkdir(parents=True, exist_ok=True)
            os.chmod(parent, 0o711)
    if path.is_symlink():
        raise SnapshotError(f"the home {path} is a link")
    created = not path.exists()
    was = None if created else os.lstat(path).st_uid
    _owned_dir(path, owner=owner)
    if created:
        _owned_dir(path / "work", 0o755, owner)
    elif was != owner[0]:
        for folder, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                os.chown(os.path.join(folder, name), *owner, follow_symlinks=False)


def _ensure_store_dirs(
    layout: SnapshotLayout, user: str, server: str, owner: tuple[int, int] = SESSION_OWNER
) -> Path:
    root = layout.snapshot_root
    hub_dir = root / safe_name(layout.hub)
    # Passable, not listable (0711), as above the homes: a session that reads its
    # restore straight from the store (a Slurm job, as the session user) must reach it.
    for made in (root, hub_dir):
        if not made.is_dir():
            made.mkdir(parents=True, exist_ok=True)
            os.chmod(made, 0o711)
    _owned_dir(layout.user_dir(user), owner=owner)
    server_dir = layout.server_dir(user, server)
    _owned_dir(server_dir, owner=owner)
    return server_dir


def _open_dir_nofollow(base: Path, relative: str) -> int:
    """A descriptor of ``base/relative`` that followed no link below ``base``."""
    fd = os.open(base, _DIR_FLAGS)
    try:
        for part in [p for p in relative.split("/") if p]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _copy_tree_fd(
    source_fd: int,
    dest: Path,
    skipped: list[str],
    prefix: str = "",
    owner: tuple[int, int] = SESSION_OWNER,
) -> int:
    """Copy the directory open at ``source_fd`` into ``dest`` (new); bytes copied.

    Regular files and directories only, opened without following links; anything
    else (links, sockets, devices) is named in ``skipped``."""
    _owned_dir(dest, owner=owner)
    total = 0
    for entry in os.scandir(source_fd):
        name = entry.name
        info = os.stat(name, dir_fd=source_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            child = os.open(name, _DIR_FLAGS, dir_fd=source_fd)
            try:
                total += _copy_tree_fd(child, dest / name, skipped, f"{prefix}{name}/", owner)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=source_fd)
            target = dest / name
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                while chunk := os.read(fd, _COPY_CHUNK):
                    os.write(out, chunk)
                    total += len(chunk)
            finally:
                os.close(fd)
                os.close(out)
            os.chown(target, *owner)
        else:
            skipped.append(prefix + name)
    return total


def _write_json(
    path: Path, data: Mapping[str, Any], owner: tuple[int, int] = SESSION_OWNER
) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchown(fd, *owner)  # the owner's before a byte is written
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=1, sort_keys=True, default=str)


def describe_os_error(error: OSError, where: str) -> str:
    if error.errno == errno.ENOSPC or error.errno == errno.EDQUOT:
        return f"the {where} is full ({error.strerror})"
    if error.errno == errno.EROFS:
        return f"the {where} is read-only ({error.strerror})"
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"the {where} cannot be written ({error.strerror})"
    return f"the {where} failed: {error.strerror or error}"


@dataclass(frozen=True)
class Captured:
    path: Path
    kernel_bytes: int
    manifests: list[dict[str, Any]]
    skipped: list[str]


def capture(
    layout: SnapshotLayout,
    user: str,
    server: str,
    key: str,
    *,
    home: Path | None,
    state_relative: str,
    archive: bytes | None = None,
    owner: tuple[int, int] = SESSION_OWNER,
) -> Captured:
    """Copy the session's kernel state into the snapshot store as snapshot ``key``.

    From the shared home (``home``) when there is one, else from ``archive`` (a tar
    of the state directory fetched from the session). SnapshotError says why it
    failed; nothing is left behind then. Every folder and file belongs to ``owner`` from
    its making (the session user, or the researcher's own account on Slurm)."""
    final = layout.snapshot_dir(user, server, key)
    try:
        server_dir = _ensure_store_dirs(layout, user, server, owner)
    except OSError as error:
        raise SnapshotError(describe_os_error(error, "snapshot store")) from None
    partial = server_dir / f".{key}.partial"
    skipped: list[str] = []
    try:
        _owned_dir(partial, owner=owner)
        kernels = partial / "kernels"
        total = 0
        if home is not None:
            try:
                fd = _open_dir_nofollow(home, state_relative)
            except FileNotFoundError:
                fd = -1
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise SnapshotError("the kernel state directory is a link") from None
                raise
            if fd >= 0:
                try:
                    total = _copy_tree_fd(fd, kernels, skipped, owner=owner)
                finally:
                    os.close(fd)
        elif archive is not None:
            total = _extract(archive, kernels, skipped, owner)
        manifests = _read_manifests(kernels)
        os.rename(partial, final)
    except SnapshotError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise SnapshotError(describe_os_error(error, "snapshot store")) from None
    return Captured(final, total, manifests, skipped)


def _extract(
    archive: bytes, dest: Path, skipped: list[str], owner: tuple[int, int] = SESSION_OWNER
) -> int:
    """Unpack a tar of the state directory (as Docker's archive API gives it: one top
    directory) into ``dest``; regular files and directories only."""
    import io
    import tarfile

    _owned_dir(dest, owner=owner)
    total = 0
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")[1:]  # drop the top directory's own name
            if not parts or any(p in ("", ".", "..") for p in parts):
                continue
            target = dest.joinpath(*parts)
            if member.isdir():
                _owned_dir(target, owner=owner)
            elif member.isfile():
                _owned_dir(target.parent, owner=owner)
                source = tar.extractfile(member)
                assert source is not None
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                os.fchown(fd, *owner)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(source, out, _COPY_CHUNK)
                total += member.size
            else:
                skipped.append("/".join(parts))
    return total


def _read_manifests(kernels: Path) -> list[dict[str, Any]]:
    """Each notebook's manifest in the copied state (see docs/snapshots.md)."""
    found: list[dict[str, Any]] = []
    if not kernels.is_dir():
        return found
    for entry in sorted(kernels.iterdir()):
        manifest = entry / "manifest.json"
        if entry.is_symlink() or not manifest.is_file() or manifest.is_symlink():
            continue
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            found.append({"key": entry.name, **data})
    return found


def write_report(
    path: Path, report: Mapping[str, Any], owner: tuple[int, int] = SESSION_OWNER
) -> None:
    """``report.json`` of a captured snapshot (0600, the user's)."""
    _write_json(path / "report.json", report, owner)


RESTORE_NOTICE = "restore-notice.json"
"""Beside the kernel state (so a restoring session sees it at ``$BUDGETHUB_RESTORE_DIR``):
what the snapshot brings back, for the notice in the session's JupyterLab."""


def write_restore_notice(
    path: Path, report: Mapping[str, Any], owner: tuple[int, int] = SESSION_OWNER
) -> None:
    """``kernels/restore-notice.json`` of a captured snapshot: its key and time, each
    notebook's variables, what was not kept, and the edits saved at the preemption."""
    kernels = path / "kernels"
    try:
        _owned_dir(kernels, owner=owner)
    except OSError as error:
        raise SnapshotError(describe_os_error(error, "snapshot store")) from None
    notebooks = dict(report.get("notebooks") or {})
    _write_json(
        kernels / RESTORE_NOTICE,
        {
            "key": report.get("key"),
            "time": report.get("time"),
            "kernels": [
                {"notebook": k.get("notebook"), "variables": list(k.get("variables") or [])}
                for k in report.get("kernels") or []
                if isinstance(k, Mapping)
            ],
            "unsaved": dict(report.get("unsaved") or {}),
            "edits_saved": list(notebooks.get("edits_saved") or []),
            "files": report.get("files"),
        },
        owner,
    )


def remove(paths: Iterable[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def tree_bytes(path: Path, limit: int = 1_000_000) -> int:
    """Bytes of the regular files under ``path`` (links not followed; at most ``limit``
    entries looked at)."""
    total = 0
    seen = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files:
            seen += 1
            if seen > limit:
                return total
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
    return total
