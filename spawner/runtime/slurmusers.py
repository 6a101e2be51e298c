"""Each researcher's Slurm job runs as their own Unix account (docs/slurm.md).

A Hub user maps to a Unix account (``slurm_users``: a name template, a map or a
callable; by default the same name). The job runs as that account: with ``sbatch
--uid/--gid`` where the Hub runs as root, or through ``slurm_exec_prefix`` (``sudo -n
-u {account}``, as batchspawner's ``exec_prefix``) where it does not. The session's home
and the snapshot it restores from are given to the account (0700) before the job is
submitted: the Hub writes them as the images' session user (1000:100, for Docker), and
a job running as another uid could not read them otherwise.

The home and every snapshot are the account's from their making (the runtime's
``owner_of``, which `spawner.runtime.snapshots` writes them as); ``give`` at each start
covers what an older Hub wrote as the session user.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spawner.runtime.spec import SESSION_USER

SESSION_UID, SESSION_GID = (int(part) for part in SESSION_USER.split(":"))


class NoAccount(RuntimeError):
    """A Hub user has no Unix account here: their session cannot run as themself."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int


def account_name(users: Any, user: str) -> str | None:
    """The Unix account of Hub user ``user``: ``users`` is a template (``"{user}"``), a
    map (user → account; a user not in it keeps its name) or a callable; "" or None: no
    account of their own (every job runs as the session user, 1000:100)."""
    if users is None or users == "":
        return None
    if isinstance(users, str):
        return users.format(user=user)
    if isinstance(users, Mapping):
        return str(users.get(user, user))
    if callable(users):
        found = users(user)
        return None if found is None else str(found)
    raise TypeError(f"slurm_users must be a template, a map or a callable, not {users!r}")


def lookup(users: Any, user: str) -> Account | None:
    """The account of ``user`` (None: the session user for everyone); NoAccount, in
    words for the user, when the account does not exist on this Hub."""
    name = account_name(users, user)
    if name is None:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise NoAccount(
            f"the Hub user {user!r} has no Unix account {name!r} here, and sessions on "
            "Slurm run as their user's own account (c.BudgetScheduler.slurm_users); "
            "ask an administrator to create it"
        ) from None
    if entry.pw_uid == 0:
        raise NoAccount(f"the Hub user {user!r} maps to {name!r}, which is root")
    return Account(name, entry.pw_uid, entry.pw_gid)


def submit_prefix(prefix: Sequence[str], account: Account | None) -> list[str]:
    """``slurm_exec_prefix`` with ``{account}`` filled in (nothing without an account)."""
    if account is None:
        return []
    return [word.format(account=account.name, user=account.name) for word in prefix]


def give(home: Path, restore: Path | None, account: Account) -> None:
    """The home (all of it the first time) and the snapshot to restore (and the folders
    above it up to the Hub's, which are root's) belong to ``account``, readable by it
    and the Hub only. Only root can give files away: as another user, nothing is done."""
    if os.geteuid() != 0:
        return
    _own_tree(home, account, whole=_owner(home) != account.uid)
    if restore is not None and restore.exists():
        _own_tree(restore, account, whole=True)
        for parent in restore.parents:
            if _owner(parent) not in (SESSION_UID, account.uid) or parent == parent.parent:
                break
            os.chown(parent, account.uid, account.gid, follow_symlinks=False)
            os.chmod(parent, 0o700)


def _owner(path: Path) -> int:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return -1


def _own_tree(top: Path, account: Account, *, whole: bool) -> None:
    if not top.exists() or top.is_symlink():
        return
    os.chown(top, account.uid, account.gid, follow_symlinks=False)
    os.chmod(top, 0o700)
    if not whole:
        return
    for folder, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            os.chown(os.path.join(folder, name), account.uid, account.gid, follow_symlinks=False)


UsersSetting = str | Mapping[str, str] | Callable[[str], str | None] | None
