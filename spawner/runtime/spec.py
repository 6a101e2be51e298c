"""What a session runs, as data (`LaunchSpec`): built here, started by the node's runtime.

Pure (no Docker client): kubespawner's ``make_pod`` split, so the rules that
keep sessions apart (exactly the granted GPUs, limits, no socket, no
privilege) are tested without an engine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_core.model import MILLI, NodeGrant, SliceKind

LABEL_PREFIX = "org.budgethub"
WORKSPACE_PATH = "/home/jovyan"
"""The whole home: a session's files, ``~/.local`` packages and conda envs live there."""
RESTORE_PATH = "/var/lib/budgethub/restore"
"""Where a restoring session sees its snapshot's kernel state, read-only."""
STORAGE_ROOT = "/mnt"
SESSION_USER = "1000:100"
"""uid:gid the session runs as (the images' ``jovyan``); never root."""

_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")


def safe_name(text: str) -> str:
    """A Docker-safe name part: characters outside [a-zA-Z0-9_.-] become ``-xx`` hex escapes."""
    return _UNSAFE.sub(lambda m: "-" + m.group(0).encode().hex(), text)


_UNSAFE_PART = re.compile(r"[^a-zA-Z0-9.-]")
DEFAULT_HUB = "budgethub"
DEFAULT_PIDS_LIMIT = 4096
"""Processes and threads a session may run at once: room for data loaders and
compilers, not for a fork bomb that takes the node's PIDs."""


def _name_part(text: str) -> str:
    """Like ``safe_name`` but escaping ``_`` too, which separates the parts of a name."""
    return _UNSAFE_PART.sub(lambda m: "-" + m.group(0).encode().hex(), text)


def session_name(user: str, server: str, hub: str = DEFAULT_HUB) -> str:
    """Unique per Hub: two Hubs sharing an engine never pick the same name."""
    return f"{_name_part(hub)}_{_name_part(user)}_{_name_part(server) if server else 'default'}"


def workspace_volume(user: str, hub: str = DEFAULT_HUB) -> str:
    """The user's home volume, per Hub (two Hubs' users of one name share nothing)."""
    return f"{safe_name(hub)}-home-{safe_name(user)}"


@dataclass(frozen=True, slots=True)
class Mount:
    source: str
    target: str
    kind: str = "volume"
    """``volume`` (a named Docker volume) or ``bind`` (a path on the node)."""
    read_only: bool = False


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a runtime needs to start one session (Docker's ``create`` arguments:
    `create_kwargs`; Slurm's job script is written from the same fields)."""

    name: str
    image: str
    command: tuple[str, ...]
    environment: Mapping[str, str]
    labels: Mapping[str, str]
    mounts: tuple[Mount, ...]
    nano_cpus: int
    mem_limit_bytes: int
    gpu_device_ids: tuple[str, ...]
    """UUIDs handed to the NVIDIA runtime; empty on nodes without real GPUs."""
    network_mode: str = "host"
    user: str = SESSION_USER
    extra_hosts: Mapping[str, str] = field(default_factory=dict)
    pids_limit: int = DEFAULT_PIDS_LIMIT
    """0: no limit."""

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for docker-py's ``containers.create``."""
        from_mounts = [
            {
                "Type": m.kind,
                "Source": m.source,
                "Target": m.target,
                "ReadOnly": m.read_only,
            }
            for m in self.mounts
        ]
        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": list(self.command),
            "name": self.name,
            "environment": dict(self.environment),
            "labels": dict(self.labels),
            "user": self.user,
            "network_mode": self.network_mode,
            "nano_cpus": self.nano_cpus,
            "mem_limit": self.mem_limit_bytes,
            # No swap beyond the limit: a session over its memory is OOM-killed, not slowed.
            "memswap_limit": self.mem_limit_bytes,
            "privileged": False,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "detach": True,
            "mounts": from_mounts,
        }
        if self.pids_limit > 0:
            kwargs["pids_limit"] = self.pids_limit
        if self.gpu_device_ids:
            kwargs["device_requests"] = [
                {
                    "driver": "nvidia",
                    "device_ids": list(self.gpu_device_ids),
                    "capabilities": [["gpu"]],
                }
            ]
        return kwargs


@dataclass(frozen=True, slots=True)
class SessionIdentity:
    user: str
    server: str
    request_id: str
    team: str
    profile: str
    hub: str
    """Which Hub owns the session (several Hubs may share a node's runtime)."""


def build_launch_spec(
    identity: SessionIdentity,
    image: str,
    grant: NodeGrant,
    *,
    hub_env: Mapping[str, str],
    port: int,
    ip: str,
    nvidia: bool,
    storage: tuple[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    pids_limit: int = DEFAULT_PIDS_LIMIT,
    home: str | None = None,
    restore_dir: str | None = None,
) -> LaunchSpec:
    """The launch spec of one session on one node.

    ``home`` is the host path of the user's home on shared storage (bind-mounted at
    /home/jovyan); None mounts the user's named volume there. ``restore_dir`` is the
    host path of a snapshot's kernel state, mounted read-only at ``RESTORE_PATH``.

    ``hub_env`` is the Hub's environment for the server (``Spawner.get_env``);
    ``nvidia`` says whether the node's GPUs are real (the NVIDIA runtime gets the
    device ids) or virtual (only the environment names them). ``storage`` is
    ``(name, path on the node)`` for a data-prep session.
    """
    device_ids = tuple(s.device_id for s in grant.slices)
    env = dict(hub_env)
    env.update(extra_env or {})
    env.update(gpu_environment(grant, nvidia))
    env["BUDGETHUB_REQUEST"] = identity.request_id
    env["BUDGETHUB_TEAM"] = identity.team
    env["BUDGETHUB_PROFILE"] = identity.profile
    env["BUDGETHUB_NODE"] = grant.node
    env["HOME"] = "/home/jovyan"
    mounts, mount_env = session_mounts(identity, home, restore_dir, storage)
    env.update(mount_env)
    command = (
        "jupyterhub-singleuser",
        f"--ip={ip}",
        f"--port={port}",
        f"--ServerApp.root_dir={WORKSPACE_PATH}",
    )
    return LaunchSpec(
        name=session_name(identity.user, identity.server, identity.hub),
        image=image,
        command=command,
        environment=env,
        labels=session_labels(identity, device_ids, port),
        mounts=mounts,
        nano_cpus=int(grant.cpus * 1e9),
        mem_limit_bytes=int(grant.memory_gib * 2**30),
        gpu_device_ids=device_ids if nvidia else (),
        pids_limit=pids_limit,
    )


def gpu_environment(grant: NodeGrant, nvidia: bool) -> dict[str, str]:
    """The variables that show a session its granted GPUs (and only those): the device
    ids, the slices in JSON (``virtual`` where the node declares them), MPS's share."""
    device_ids = [s.device_id for s in grant.slices]
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(device_ids) if device_ids else "void",
        "CUDA_VISIBLE_DEVICES": ",".join(device_ids),
        "BUDGETHUB_GPU_SLICES": json.dumps(
            [
                {
                    "uuid": s.device_id,
                    "kind": s.kind.value,
                    "weight": round(s.weight, 4),
                    "virtual": not nvidia,  # declared in config, not a real device
                }
                for s in grant.slices
            ]
        ),
    }
    fractions = [s for s in grant.slices if s.kind is SliceKind.FRACTION and s.milli < MILLI]
    if fractions:
        # MPS caps a shared GPU's compute for this client to its fraction.
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, fractions[0].milli // 10))
    return env


def session_mounts(
    identity: SessionIdentity,
    home: str | None,
    restore_dir: str | None,
    storage: tuple[str, str] | None,
) -> tuple[tuple[Mount, ...], dict[str, str]]:
    """The home (shared storage, else the user's named volume), a snapshot's kernel state
    read-only, a data-prep storage; and the variables that say where the last two are."""
    env: dict[str, str] = {}
    if home is not None:
        mounts = [Mount(home, WORKSPACE_PATH, kind="bind")]
    else:
        mounts = [Mount(workspace_volume(identity.user, identity.hub), WORKSPACE_PATH)]
    if restore_dir is not None:
        mounts.append(Mount(restore_dir, RESTORE_PATH, kind="bind", read_only=True))
        env["BUDGETHUB_RESTORE_DIR"] = RESTORE_PATH
    if storage is not None:
        name, path = storage
        mounts.append(Mount(path, f"{STORAGE_ROOT}/{safe_name(name)}", kind="bind"))
        env["BUDGETHUB_STORAGE"] = f"{STORAGE_ROOT}/{safe_name(name)}"
    return tuple(mounts), env


def session_labels(
    identity: SessionIdentity, device_ids: tuple[str, ...], port: int
) -> dict[str, str]:
    """What the runtime keeps with the session, so a restarted Hub finds it again."""
    return {
        f"{LABEL_PREFIX}.user": identity.user,
        f"{LABEL_PREFIX}.server": identity.server,
        f"{LABEL_PREFIX}.request": identity.request_id,
        f"{LABEL_PREFIX}.team": identity.team,
        f"{LABEL_PREFIX}.profile": identity.profile,
        f"{LABEL_PREFIX}.hub": identity.hub,
        f"{LABEL_PREFIX}.gpus": ",".join(device_ids),
        f"{LABEL_PREFIX}.port": str(port),
    }
