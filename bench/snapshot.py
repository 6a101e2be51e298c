"""Preemption and restore with 1 GiB of kernel variables and 1 GiB of home files.

A real Hub (127.0.0.1, one local node of one virtual GPU, homes and snapshots on
this machine's disk) runs an unallocated session of a guest (``gus``; ``gil`` in
the hot case, so each case starts from nothing). Through the Hub's proxy (Jupyter
Server's REST and websocket API) a notebook's kernel writes eight 128 MiB files in
the home, then makes eight numpy arrays of 128 MiB. Then a funded request of
``ann`` needs the GPU: the scheduler preempts the guest's session.

* **Preemption decision -> slices free**: what the actuator logs (``slices free
  X s after the decision``: checkpoint through the agent, container stopped and
  removed, slices released), and from outside, ann's POST until the victim's container
  is gone. ``settled``: the incremental checkpoint had finished before the
  decision (an idle session); ``hot``: the decision comes right after the cell
  that made the 1 GiB, so the agent flushes the whole delta in its grace.
* **Restore start -> variables available**: the guest starts again (restore is the
  default); from the POST until a cell in the notebook's new kernel sees all eight
  arrays with their values; split into the spawn (POST -> ready) and kernel start
  plus restore. Compared with 2 x (state size / disk read bandwidth), the
  bandwidth measured with dd (O_DIRECT) on the snapshot store's file system.

Run: ``python -m bench.snapshot [--only settled|hot] [--cold]`` (needs the engine, the
images of ``make images`` with the session package, and the Hub's snapshots).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import requests
import websocket
from budgethub_session.localserver import execute_request

from bench.snapshot_cells import IMAGES, extension_present, session_image
from harness.hub import ADMIN_TOKEN, Hub, containers, start_hub

NOTEBOOK = "bench.ipynb"
HUB_NAME = f"bench-snap-{uuid.uuid4().hex[:6]}"
ARRAYS = 8
ARRAY_MIB = 128
"""8 x 128 MiB: 1 GiB of kernel variables, and the same again as files in the home."""
OPTIONS = {"profile": "bench", "gpus": 1}
FIGURES = (
    "snapshot.settled_slices_free_s",
    "snapshot.hot_slices_free_s",
    "snapshot.settled_restore_s",
    "snapshot.hot_restore_s",
    "snapshot.disk_floor_s",
    "snapshot.settled_restore_vs_disk_s",
    "snapshot.hot_restore_vs_disk_s",
)
"""The figures ``collect`` returns (bench/bars.toml): each case's only where it ran, and
none where the image lacks numpy or the session package (the run is skipped)."""


def profiles(image: str) -> list[dict[str, Any]]:
    return [
        {
            "slug": "bench",
            "display_name": "bench",
            "class": "interactive",
            "pool": "gpu",
            "image": image,
            "gpus": [1],
            "cpus": 2,
            "memory_gib": 8,
            "min_runtime": "1h",
            "max_min_runtime": "8h",
        }
    ]


def make_state(mib: int) -> str:
    """A cell that makes ARRAYS numpy arrays of ``mib`` MiB each."""
    return f"""
import os, numpy as np
for i in range({ARRAYS}):
    globals()[f"v{{i}}"] = np.random.default_rng(i).standard_normal({mib} * 2**20 // 8)
"""


def write_home(mib: int) -> str:
    """A cell that writes ARRAYS files of ``mib`` MiB in the home (and keeps no variable)."""
    return f"""
import os, numpy as np
os.makedirs(os.path.expanduser("~/data"), exist_ok=True)
for _i in range({ARRAYS}):
    with open(os.path.expanduser(f"~/data/f{{_i}}.bin"), "wb") as _f:
        _f.write(np.random.default_rng(100 + _i).bytes({mib} * 2**20))
del _i, _f
"""


CHECKSUMS = f"""
import json
print(json.dumps({{f"v{{i}}": float(globals()[f"v{{i}}"][::4096].sum())
                  for i in range({ARRAYS}) if f"v{{i}}" in globals()}}))
"""


class Kernel:
    """A notebook's kernel in a session, through the Hub's proxy (REST + websocket)."""

    def __init__(self, hub: Hub, user: str, path: str = NOTEBOOK) -> None:
        self.hub = hub
        self.base = f"{hub.url}/user/{user}/api"
        self.user = user
        http = hub.http
        empty = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        http.put(
            f"{self.base}/contents/{path}",
            json={"type": "notebook", "format": "json", "content": empty},
            timeout=30,
        ).raise_for_status()
        response = http.post(
            f"{self.base}/sessions",
            json={"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}},
            timeout=60,
        )
        response.raise_for_status()
        self.kernel_id = response.json()["kernel"]["id"]
        self.session = uuid.uuid4().hex
        url = self.base.replace("http://", "ws://", 1)
        self.ws = websocket.create_connection(
            f"{url}/kernels/{self.kernel_id}/channels?session_id={self.session}",
            header=[f"Authorization: token {ADMIN_TOKEN}"],
            timeout=600,
        )

    def run(self, code: str, timeout: float = 600) -> str:
        """Execute a cell; its stdout. RuntimeError if the cell raised."""
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps(execute_request(msg_id, self.session, code, self.user)))
        out: list[str] = []
        replied = idle = False
        error = None
        deadline = time.monotonic() + timeout
        while not (replied and idle):
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell did not finish in {timeout} s")
            message = json.loads(self.ws.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["header"]["msg_type"]
            if kind == "stream":
                out.append(message["content"]["text"])
            elif kind == "error":
                error = f"{message['content']['ename']}: {message['content']['evalue']}"
            elif kind == "execute_reply":
                replied = True
            elif kind == "status" and message["content"]["execution_state"] == "idle":
                idle = True
        if error:
            raise RuntimeError(error)
        return "".join(out)

    def close(self) -> None:
        self.ws.close()


def disk_bandwidth(directory: Path, mib: int = 1024) -> tuple[float, float]:
    """(write, read) MB/s of ``mib`` MiB with O_DIRECT (no page cache) in ``directory``."""
    target = directory / "dd-probe.bin"

    def timed_dd(*args: str) -> float:
        t0 = time.perf_counter()
        subprocess.run(
            ["dd", *args, "bs=16M", f"count={mib // 16}", "status=none"],
            capture_output=True,
            timeout=600,
            check=True,
        )
        return mib * 2**20 / 1e6 / (time.perf_counter() - t0)

    try:
        write = timed_dd("if=/dev/zero", f"of={target}", "oflag=direct", "conv=fsync")
        read = timed_dd(f"if={target}", "of=/dev/null", "iflag=direct")
    finally:
        target.unlink(missing_ok=True)
    return write, read


def start_bench_hub(directory: Path, homes: Path, snapshots: Path, image: str) -> Hub:
    return start_hub(
        directory,
        hub_name=HUB_NAME,
        nodes=[{"name": "gpu-1", "pool": "gpu", "gpus": 1, "cpus": 8, "memory_gib": 16}],
        teams=[
            {"name": "nlp", "share": {"gpu": 1.0, "cpu": 1.0}},
            {"name": "guests", "share": {"gpu": 0.0, "cpu": 0.0}},
        ],
        groups={"nlp": ["ann"], "guests": ["gus", "gil"]},
        profiles=profiles(image),
        extra="\n".join(
            [
                "c.BudgetScheduler.unallocated_grace = 1.0",
                f"c.BudgetScheduler.home_root = {str(homes)!r}",
                f"c.BudgetScheduler.snapshot_root = {str(snapshots)!r}",
                "c.BudgetScheduler.snapshot_grace = 120.0",
                "c.BudgetScheduler.launch_timeout = 120",
                "c.JupyterHub.log_level = 'INFO'",
            ]
        ),
    )


def wait(predicate: Any, timeout: float, what: str, step: float = 0.05) -> float:
    """Seconds until ``predicate()`` holds; TimeoutError naming ``what``."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if predicate():
            return time.perf_counter() - t0
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def last_json(output: str) -> dict[str, Any]:
    """The JSON line a cell printed last (a restored kernel prints its note before it)."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"the cell printed no JSON: {output[-500:]!r}")
    found: dict[str, Any] = json.loads(lines[-1])
    return found


def manifest_names(home: Path) -> set[str]:
    names: set[str] = set()
    for path in home.glob(".budgethub/**/manifest.json"):
        try:
            names |= set(json.loads(path.read_text()).get("variables", {}))
        except (OSError, ValueError):
            pass
    return names


def drop_page_cache() -> None:
    """Write back and drop the page cache (root): the restore reads the snapshot from
    the disk, as on a node that never saw it."""
    subprocess.run(["sync"], check=True, timeout=300)
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def cycle(hub: Hub, homes: Path, hot: bool, mib: int, cold: bool = False) -> dict[str, Any]:
    """One preemption and restore of a guest's session (gus, or gil when ``hot``, so
    that each case starts from nothing); the figures."""
    victim_user = "gil" if hot else "gus"
    hub.spawn(victim_user, OPTIONS)
    hub.wait_ready(victim_user, timeout=120)
    kernel = Kernel(hub, victim_user)
    kernel.run(write_home(mib))
    time.sleep(1.2)  # past the unallocated grace
    # The state and its checksums in one cell: with ``hot`` the preemptor comes at once.
    before = last_json(kernel.run(make_state(mib) + CHECKSUMS))
    assert len(before) == ARRAYS, before
    [home] = list(homes.glob(f"*/{victim_user}")) or [homes]
    wanted = {f"v{i}" for i in range(ARRAYS)}
    settle = None
    if not hot:
        settle = wait(lambda: wanted <= manifest_names(home), 300, "the checkpoint", 0.2)
    kernel.close()
    [victim] = containers(HUB_NAME)
    log_mark = len(hub.log_path.read_text(errors="replace"))
    hub.http.post(f"{hub.api}/users/ann", timeout=10)  # the user exists before the clock starts
    # JupyterHub holds the spawn's POST up to its slow_spawn_timeout: post it aside.
    post = threading.Thread(
        target=requests.post,
        args=(hub.server_path("ann"),),
        kwargs={"json": OPTIONS, "headers": dict(hub.http.headers), "timeout": 60},
    )
    engine = docker.from_env()
    t0 = time.perf_counter()
    post.start()
    try:

        def gone() -> bool:
            try:
                engine.containers.get(victim.id)
            except docker.errors.NotFound:
                return True
            return False

        outside = wait(gone, 300, "the victim's container to go", 0.02)
    finally:
        engine.close()
    post.join(timeout=120)
    hub.wait_ready("ann", timeout=300)
    ann_ready = time.perf_counter() - t0
    hub.wait_stopped(victim_user, timeout=300)
    wait(lambda: "slices free" in hub.log_path.read_text(errors="replace")[log_mark:], 60, "log")
    logged = re.findall(
        rf"{victim_user}\S* preempted \([^)]*\): slices free ([\d.]+) s after the decision",
        hub.log_path.read_text(errors="replace")[log_mark:],
    )
    hub.stop_server("ann")

    hub.http.post(f"{hub.api}/users/{victim_user}", timeout=10)
    if cold:
        drop_page_cache()
    post = threading.Thread(
        target=requests.post,
        args=(hub.server_path(victim_user),),
        kwargs={"json": OPTIONS, "headers": dict(hub.http.headers), "timeout": 60},
    )
    t0 = time.perf_counter()
    post.start()
    wait(lambda: (hub.server_model(victim_user) or {}).get("ready"), 300, "the restore", 0.05)
    spawned = time.perf_counter() - t0
    post.join(timeout=120)
    kernel = Kernel(hub, victim_user)
    kernel_started = time.perf_counter() - t0
    got: dict[str, float] = {}

    def restored() -> bool:
        got.clear()
        got.update(last_json(kernel.run(CHECKSUMS)))
        return len(got) == ARRAYS

    wait(restored, 300, "the restored variables", 0.2)
    available = time.perf_counter() - t0
    kernel.close()
    assert got == before, (got, before)
    keys = sorted(
        (homes.parent / "snapshots").glob(f"*/{victim_user}/*/*"), key=lambda d: d.stat().st_mtime
    )
    snapshot_bytes = (
        sum(f.stat().st_size for f in keys[-1].rglob("*") if f.is_file()) if keys else 0
    )
    files = sum(f.stat().st_size for f in (home / "data").glob("f*.bin"))
    hub.stop_server(victim_user)
    return {
        "hot": hot,
        "settled_before_s": settle,
        "slices_free_logged_s": float(logged[-1]) if logged else None,
        "victim_gone_s": outside,
        "preemptor_ready_s": ann_ready,
        "restore_spawn_s": spawned,
        "restore_kernel_s": kernel_started,
        "restore_available_s": available,
        "snapshot_bytes": snapshot_bytes,
        "home_file_bytes": files,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]] | None:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot")
    parser.add_argument("--only", choices=["settled", "hot"], help="one of the two cases")
    parser.add_argument("--keep", action="store_true", help="keep the Hub's directory and log")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="drop the page cache before each restore (root; the whole machine's cache)",
    )
    parser.add_argument(
        "--image", help=f"default: the first of {IMAGES} with numpy and the extension"
    )
    parser.add_argument(
        "--array-mib", type=int, default=ARRAY_MIB, help=f"size of each of the {ARRAYS} arrays"
    )
    args = parser.parse_args(argv)
    image = args.image or session_image()
    if image is None or not extension_present(image):
        print(
            f"preempt/restore: skipped, {image or ' nor '.join(IMAGES)} has no numpy or no "
            "budgethub_session"
        )
        return None
    root = Path(tempfile.mkdtemp(prefix="bench-snapshot-", dir="/var/tmp"))
    homes, snapshots = root / "homes", root / "snapshots"
    homes.mkdir()
    snapshots.mkdir()
    load_before = os.getloadavg()[0]
    write, read = disk_bandwidth(snapshots)
    print(f"preempt/restore: {ARRAYS} arrays of {args.array_mib} MiB in {image}", flush=True)
    hub = start_bench_hub(root, homes, snapshots, image)
    results = []
    try:
        for hot in (False, True):
            if args.only and args.only != ("hot" if hot else "settled"):
                continue
            results.append(cycle(hub, homes, hot, args.array_mib, args.cold))
    finally:
        hub.stop()
        for container in containers(HUB_NAME):
            container.remove(force=True)
        if args.keep:
            print(f"preempt/restore: kept {root} (the Hub's log: {hub.log_path})")
        else:
            shutil.rmtree(root, ignore_errors=True)
    state_mb = ARRAYS * args.array_mib * 2**20 / 1e6
    aim = 2 * state_mb / read
    for r in results:
        r["disk_floor_s"] = aim
    for r in results:
        size = f"{state_mb / 1e3:.1f} GB" if state_mb >= 1e3 else f"{state_mb:.0f} MB"
        case = f"hot ({size} delta unflushed)" if r["hot"] else "settled (checkpoint done)"
        if args.cold:
            case += ", cold page cache"
        logged = r["slices_free_logged_s"]
        print(
            f"preemption, {case}: decision -> slices free "
            f"{logged if logged is not None else float('nan'):.2f} s (actuator log), "
            f"victim container gone {r['victim_gone_s']:.2f} s and preemptor ready "
            f"{r['preemptor_ready_s']:.2f} s after its POST (bar 30 s, aim 10 s); "
            f"snapshot {r['snapshot_bytes'] / 2**20:.0f} MiB, home files "
            f"{r['home_file_bytes'] / 2**20:.0f} MiB stay in the shared home"
        )
        print(
            f"restore, {case}: start -> variables available {r['restore_available_s']:.2f} s "
            f"(server ready {r['restore_spawn_s']:.2f} s, notebook's kernel started "
            f"{r['restore_kernel_s']:.2f} s, its variables there "
            f"{r['restore_available_s'] - r['restore_kernel_s']:.2f} s later); "
            f"aim 2 x {state_mb:.0f} MB / {read:.0f} MB/s = {aim:.2f} s, bar 30 s"
        )
    print(
        f"disk (snapshot store, O_DIRECT dd of 1 GiB): write {write:.0f} MB/s, "
        f"read {read:.0f} MB/s; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after (2 cores)"
    )
    return results


def figures(results: list[dict[str, Any]]) -> dict[str, float]:
    """``main``'s results as the figures of bench/bars.toml (FIGURES). A slices-free time
    the actuator did not log is NaN, which no bar holds."""
    out: dict[str, float] = {}
    for r in results:
        case = "hot" if r["hot"] else "settled"
        logged = r["slices_free_logged_s"]
        out[f"snapshot.{case}_slices_free_s"] = math.nan if logged is None else float(logged)
        out[f"snapshot.{case}_restore_s"] = float(r["restore_available_s"])
        out[f"snapshot.{case}_restore_vs_disk_s"] = float(r["restore_available_s"])
        out["snapshot.disk_floor_s"] = float(r["disk_floor_s"])
    return out


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Run as ``main`` does, printing the same; the figures (FIGURES)."""
    return figures(main(argv) or [])


if __name__ == "__main__":
    main()
