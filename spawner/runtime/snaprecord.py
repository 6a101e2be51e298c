"""Snapshot recording (docs/snapshots.md): a preempted session's kernels checkpointed
through its agent, their state copied into the snapshot store and recorded, and the
oldest snapshots of a server pruned; what a snapshot keeps, in words for its user.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from scheduler_core.model import Allocation
from spawner.runtime.context import Nodes
from spawner.runtime.snapshots import (
    HOME_TARGET,
    SESSION_OWNER,
    Captured,
    SnapshotError,
    SnapshotLayout,
    capture,
    new_key,
    remove,
    session_home,
    session_owner,
    state_dir_in_home,
    tree_bytes,
    write_report,
    write_restore_notice,
)
from spawner.runtime.values import AGENT_HEADER, Agent, Checkpointed, SnapshotPolicy

LAB_NOTICE_END = "; your variables, files and packages are being saved."
LAB_NOTICES = {
    "funded": "This session is being stopped for a funded request",
    "idle": "This session is being stopped for a funded request",
    "debug": "This session is being stopped for a debug session",
    "drain": "This session is being stopped: its node is being drained",
    "time-slice": "This session is being stopped: your team has had its day's share of GPU time",
}
"""What the session's open JupyterLab pages show while it is being snapshotted, by
preemption reason (at most 140 characters: JupyterLab's limit for a notification)."""


def lab_notice(reason: str) -> str:
    return LAB_NOTICES.get(reason, "This session is being stopped") + LAB_NOTICE_END


def _kernel_entries(
    checkpoint: Mapping[str, Any] | None, manifests: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per notebook: the variables the snapshot holds (its manifest), what could not be
    saved and why, and how its kernel answered the final checkpoint."""
    by_notebook: dict[str, dict[str, Any]] = {}
    for manifest in manifests:
        notebook = str(manifest.get("notebook") or manifest.get("key"))
        variables = manifest.get("variables") or {}
        unsaved = manifest.get("unsaved") or {}
        by_notebook[notebook] = {
            "notebook": notebook,
            "key": manifest.get("key"),
            "variables": sorted(str(v) for v in variables),
            "unsaved": {str(k): str(v) for k, v in dict(unsaved).items()},
            "state": "not running" if checkpoint is not None else "not asked",
            "error": None,
            "bytes": sum(
                int(v.get("bytes", 0)) for v in dict(variables).values() if isinstance(v, dict)
            ),
        }
    for kernel in (checkpoint or {}).get("kernels") or []:
        if not isinstance(kernel, dict):
            continue
        notebook = str(kernel.get("notebook") or kernel.get("kernel_id"))
        entry = by_notebook.setdefault(
            notebook,
            {
                "notebook": notebook,
                "key": None,
                "variables": sorted(str(v) for v in kernel.get("saved") or []),
                "unsaved": {},
                "bytes": int(kernel.get("bytes") or 0),
            },
        )
        entry["state"] = str(kernel.get("state") or "failed")
        entry["error"] = kernel.get("error")
        entry["kernel_id"] = kernel.get("kernel_id")
        for name, why in dict(kernel.get("unsaved") or {}).items():
            entry["unsaved"].setdefault(str(name), str(why))
    return [by_notebook[n] for n in sorted(by_notebook)]


def snapshot_holds(report: Mapping[str, Any]) -> tuple[str, str]:
    """What a snapshot's kernel state holds, in a few words: (``4 variables of 2
    notebooks``, ``a.ipynb, work/b.ipynb``), or ("", "") when it holds none."""
    kernels = [k for k in report.get("kernels") or [] if k.get("variables")]
    variables = sum(len(k.get("variables") or []) for k in kernels)
    if not variables:
        return "", ""
    names = [str(k.get("notebook")) for k in kernels]
    shown = ", ".join(names[:3]) + (f", and {len(names) - 3} more" if len(names) > 3 else "")
    count = (
        f"{variables} variable{'s' if variables != 1 else ''} of {len(kernels)} "
        f"notebook{'s' if len(kernels) != 1 else ''}"
    )
    return count, shown


def snapshot_sentence(report: Mapping[str, Any], most: int = 8) -> str:
    """What a snapshot keeps and what it does not, in words for the user (plain text).
    How to skip it is each page's own (its controls differ)."""
    where = (
        "your files and installed packages stay in your home"
        if report.get("files") == "kept in the home"
        else f"your files and installed packages stay in your home ({report.get('files')})"
    )
    state = report.get("kernel_state")
    parts = [f"A snapshot was taken ({report.get('key')}): {where}"]
    count, notebooks = snapshot_holds(report)
    if count:
        parts[0] += f", and {count} come back when you start it again (in {notebooks})"
    parts[0] += "."
    if state == "not saved":
        parts.append(f"The kernel state was not saved at the preemption: {report.get('why')}.")
    elif state == "partial":
        parts.append(
            f"Some kernels were busy ({report.get('why')}); they keep the state of their "
            "last finished cell."
        )
    edits = list(dict(report.get("notebooks") or {}).get("edits_saved") or [])
    if edits:
        parts.append(
            "The edits you had not saved were saved from your open JupyterLab: "
            + ", ".join(str(p) for p in edits[:most])
            + (f", and {len(edits) - most} more" if len(edits) > most else "")
            + "."
        )
    unsaved = {k: v for k, v in dict(report.get("unsaved") or {}).items() if k != "kernel state"}
    if unsaved:
        shown = [f"{name} ({why})" for name, why in list(unsaved.items())[:most]]
        more = f", and {len(unsaved) - most} more" if len(unsaved) > most else ""
        parts.append("Not kept: " + ", ".join(shown) + more + ".")
    return " ".join(parts)


def unsaved_entries(kernels: list[dict[str, Any]], notebooks: Mapping[str, Any]) -> dict[str, str]:
    """What the snapshot does not keep, and why: per notebook's variable, and each open
    notebook whose edits could not be saved."""
    unsaved: dict[str, str] = {}
    for k in kernels:
        for name, why in k["unsaved"].items():
            unsaved[f"{k['notebook']}:{name}"] = str(why)
    for path, why in dict(notebooks.get("not_flushed") or {}).items():
        unsaved[f"{path} (unsaved changes)"] = str(why)
    return unsaved


def kernel_state(
    kernels: list[dict[str, Any]], store_error: str | None, why_not: str | None
) -> tuple[str, str | None]:
    """``saved``, ``partial`` (some kernels busy or failed) or ``not saved``, and why."""
    if store_error is not None:
        return "not saved", store_error
    if why_not is not None:
        return "not saved", why_not
    behind = [k for k in kernels if k["state"] not in ("saved", "not running")]
    if behind:
        return "partial", "; ".join(
            f"{k['notebook']}: {k['state']}" + (f" ({k['error']})" if k.get("error") else "")
            for k in behind
        )
    return "saved", None


@dataclass(eq=False, kw_only=True)
class SnapshotRecording:
    """Checkpoints, snapshots recorded, pruned and deleted. Owns the snapshot store's
    layout and policy; calls no other collaborator."""

    nodes: Nodes
    layout: SnapshotLayout | None
    """Where homes and snapshots live (None: named volumes, no snapshot store)."""
    policy: SnapshotPolicy

    @property
    def enabled(self) -> bool:
        """Preempted sessions are snapshotted (a policy that says so, and a store)."""
        return self.policy.enabled and self.layout is not None

    @property
    def needs_archive(self) -> bool:
        """The homes are volumes on the nodes: the kernel state must be fetched from the
        session (`fetch_state`) before it goes."""
        return self.enabled and self.layout is not None and self.layout.home_root is None

    async def checkpoint(
        self, agent: Agent, reason: str = "funded"
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Ask the agent to checkpoint every kernel within the grace, while the open
        JupyterLab pages say why and save their edits: its answer, or why there is none."""
        grace = self.policy.grace
        request = HTTPRequest(
            agent.url("checkpoint"),
            method="POST",
            headers={AGENT_HEADER: agent.secret, "Content-Type": "application/json"},
            body=json.dumps({"within": grace, "message": lab_notice(reason)}),
            connect_timeout=min(5.0, grace),
            request_timeout=grace + 5.0,
        )
        try:
            response = await asyncio.wait_for(AsyncHTTPClient().fetch(request), grace + 6.0)
            answer = json.loads(response.body)
        except HTTPClientError as error:
            if error.code == 599:
                return None, f"its agent did not answer within {grace:g} s"
            return None, f"its agent answered {error.code} {error.message}"
        except TimeoutError:
            return None, f"its agent did not answer within {grace:g} s"
        except (OSError, ValueError) as error:
            return None, f"its agent could not be asked ({error})"
        if not isinstance(answer, dict):
            return None, "its agent's answer was not understood"
        return answer, None

    async def fetch_state(self, node: str, runtime_id: str, agent: Agent | None) -> bytes | None:
        """The kernel state out of a session whose home is a volume on its node."""
        server = agent.server if agent is not None else ""
        path = f"{HOME_TARGET}/{state_dir_in_home(server)}"
        try:
            return await asyncio.wait_for(
                self.nodes.backends[node].archive(runtime_id, path), self.nodes.timeouts.engine
            )
        except Exception as error:
            self.nodes.log.warning(
                "budgethub: %s: fetching the kernel state: %s", runtime_id, error
            )
            return None

    async def record(
        self,
        allocation: Allocation,
        agent: Agent,
        node: str,
        now: float,
        reason: str,
        got: Checkpointed,
    ) -> str:
        """Copy the kernel state into the snapshot store, record it, keep the newest
        ``snapshot_keep``; its key."""
        layout = self.layout
        assert layout is not None
        user, server = agent.user, agent.server
        key = new_key(now)
        runtime = self.nodes.backends.get(node)
        home = session_home(runtime, layout, user)
        owner = session_owner(runtime, user)  # the researcher's own account on Slurm
        captured, store_error = await self._capture(
            layout, user, server, key, home, got.archive, owner
        )
        kernels = _kernel_entries(got.answer, captured.manifests if captured else [])
        notebooks = (got.answer or {}).get("notebooks") or {}
        unsaved = unsaved_entries(kernels, notebooks)
        state, why = kernel_state(kernels, store_error, got.why_not)
        if state == "not saved":
            unsaved["kernel state"] = str(why)
        home_bytes = await asyncio.to_thread(tree_bytes, home) if home is not None else None
        report: dict[str, Any] = {
            "key": key,
            "user": user,
            "server": server,
            "node": node,
            "time": now,
            "reason": reason,
            "image": agent.image,
            "kernel_state": state,
            "why": why,
            "kernels": kernels,
            "notebooks": {
                "saved": list(notebooks.get("saved") or []),
                "not_flushed": dict(notebooks.get("not_flushed") or {}),
                "edits_saved": [str(p) for p in notebooks.get("edits_saved") or []],
            },
            "unsaved": unsaved,
            "files": "kept in the home" if home is not None else f"kept in its volume on {node}",
            "skipped": captured.skipped if captured else [],
            "sizes": {"kernels": captured.kernel_bytes if captured else 0, "home": home_bytes},
            "checkpoint_elapsed": (got.answer or {}).get("elapsed"),
        }
        if captured is not None:
            await self._write_report(captured, report, owner)
        self._save(allocation, report)
        if captured is not None:
            await asyncio.to_thread(self.prune, user, server)
        return key

    async def _capture(
        self,
        layout: SnapshotLayout,
        user: str,
        server: str,
        key: str,
        home: Path | None,
        archive: bytes | None,
        owner: tuple[int, int] = SESSION_OWNER,
    ) -> tuple[Captured | None, str | None]:
        """The kernel state copied into the store (from the home, or from ``archive``);
        or None and why not."""
        try:
            captured = await asyncio.to_thread(
                capture,
                layout,
                user,
                server,
                key,
                home=home,
                state_relative=state_dir_in_home(server),
                archive=archive,
                owner=owner,
            )
        except SnapshotError as error:
            return None, str(error)
        return captured, None

    async def _write_report(
        self, captured: Captured, report: dict[str, Any], owner: tuple[int, int] = SESSION_OWNER
    ) -> None:
        """The report and the restore notice beside the snapshot's files."""
        try:
            await asyncio.to_thread(write_report, captured.path, report, owner)
            await asyncio.to_thread(write_restore_notice, captured.path, report, owner)
        except (OSError, SnapshotError) as error:
            self.nodes.log.warning("budgethub: %s: writing its report: %s", report["key"], error)

    def _save(self, allocation: Allocation, report: dict[str, Any]) -> None:
        """The snapshot's row and its event in the store, and a line in the log."""
        saved = [f"{k['notebook']}:{name}" for k in report["kernels"] for name in k["variables"]]
        key, state, why = report["key"], report["kernel_state"], report["why"]
        self.nodes.store.save_snapshot(
            allocation.id,
            report["time"],
            report["image"],
            saved=saved,
            unsaved=report["unsaved"],
            key=key,
            server=report["server"],
            node=report["node"],
            sizes=report["sizes"],
            kernels=report["kernels"],
            report=report,
        )
        self.nodes.store.append_event(
            time.time(),
            "snapshot",
            {"request": allocation.id, "key": key, "kernel_state": state, "why": why},
        )
        self.nodes.log.info(
            "budgethub: %s: snapshot %s (%s, %d variables, %d bytes of kernel state)",
            allocation.id,
            key,
            state,
            len(saved),
            report["sizes"]["kernels"],
        )

    def prune(self, user: str, server: str) -> None:
        """Keep the newest ``snapshot_keep`` snapshots of a server; delete the others."""
        layout = self.layout
        if layout is None:
            return
        kept = self.nodes.store.list_snapshots(user=user, server=server)
        old = kept[: max(0, len(kept) - self.policy.keep)]
        if not old:
            return
        for record in old:
            try:
                remove([layout.snapshot_dir(user, server, record.key)])
            except SnapshotError:
                pass
        self.nodes.store.delete_snapshots(r.key for r in old)

    def delete_snapshots(self, user: str, server: str | None) -> int:
        """Delete a server's snapshots (``server`` None: all of the user's), rows and
        files; how many."""
        records = self.nodes.store.list_snapshots(user=user, server=server)
        layout = self.layout
        if layout is not None:
            if server is None:
                remove([layout.user_dir(user)])
            else:
                remove([layout.server_dir(user, server)])
        return self.nodes.store.delete_snapshots(r.key for r in records)
