"""Checkpoint overhead per cell: one notebook of 50 cells reaching 200 MB of state, run
in a real IPython kernel in the session image, with the checkpoint extension loaded
and without it; the figure is the median over the cells of the added time per cell.

Cells are sent back to back (each as soon as the previous one is idle), so the
background checkpoint of one cell competes with the next: the worst case for the
extension. ``--pause S`` leaves S seconds between cells, as a person would. The
kernel runs in the image (``docker run``, no network) because that is where the
extension, its serializers and the kernel's packages are the ones sessions get.

Run: ``python -m bench.snapshot_cells [--reps N] [--pause S] [--image IMAGE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

IMAGE = "budgethub/gpu:latest"
EXTENSION = "budgethub_session.checkpoint"
CELLS = 50

# Runs inside the container: drives kernels with jupyter_client, prints one JSON line.
DRIVER = r"""
import json, os, sys, time, glob, tempfile
from jupyter_client.manager import KernelManager

EXT = sys.argv[1]
MODE = sys.argv[2]           # "on" or "off"
PAUSE = float(sys.argv[3])
CELLS = int(sys.argv[4])

def cells():
    out = ["import numpy as np\n"
           "try:\n    import pandas as pd\nexcept ImportError:\n    pd = None\n"
           "rng = np.random.default_rng(0)\nresults = []"]
    for i in range(1, CELLS):
        k = (i - 1) % 16
        if i == 17:
            body = ("df = pd.DataFrame(rng.standard_normal((500_000, 10)),"
                    " columns=list('abcdefghij')) if pd else rng.standard_normal((500_000, 10))")
        elif i > 17 and i % 5 == 0:
            body = ("if pd is not None:\n    df['a'] = df['a'].cumsum()\n"
                    "else:\n    df[:, 0] = df[:, 0].cumsum()")
        else:
            body = f"x{k} = np.sort(rng.standard_normal(1_250_000))"
        out.append(body + "\nm = rng.standard_normal((300, 300))\n"
                   f"results.append(float(np.linalg.eigvals(m).real.max()))\ne{i} = results[-1]")
    return out

state = tempfile.mkdtemp(prefix="bh-state-")
env = dict(os.environ, BUDGETHUB_STATE_DIR=state, JPY_SESSION_NAME="bench/cells.ipynb")
km = KernelManager(kernel_name="python3")
extra = [] if MODE == "on" else ["--IPKernelApp.extensions=[]", "--IPKernelApp.extra_extensions=[]"]
km.start_kernel(env=env, extra_arguments=extra)
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)

def run(code, timeout=300):
    t0 = time.perf_counter()
    reply = kc.execute_interactive(code, timeout=timeout, store_history=True,
                                   output_hook=lambda msg: None)
    took = time.perf_counter() - t0
    if reply["content"]["status"] != "ok":
        c = reply["content"]
        raise SystemExit(f"cell failed: {c.get('ename')}: {c.get('evalue')}")
    return took

def loaded():
    got = {}
    def hook(msg):
        if msg["msg_type"] == "stream":
            got.setdefault("text", "")
            got["text"] += msg["content"]["text"]
    kc.execute_interactive(f"print({EXT!r} in get_ipython().extension_manager.loaded)",
                           store_history=False, output_hook=hook, timeout=60)
    return got.get("text", "").strip() == "True"

error = None
if MODE == "on" and not loaded():
    kc.execute_interactive(f"%load_ext {EXT}", store_history=False, timeout=60,
                           output_hook=lambda msg: None)
ext_loaded = loaded()
times = []
try:
    for code in cells():
        times.append(run(code))
        if PAUSE:
            time.sleep(PAUSE)
except SystemExit as stop:
    error = str(stop)
last = time.time()
settled = None
if MODE == "on" and error is None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        manifests = glob.glob(os.path.join(state, "**", "manifest.json"), recursive=True)
        try:
            found = [json.load(open(p)) for p in manifests]
        except (OSError, ValueError):
            found = []
        names = set().union(*(m.get("variables", {}) for m in found)) if found else set()
        if {"x15", "df", f"e{CELLS - 1}"} <= names:
            settled = time.time() - last
            break
        time.sleep(0.05)
size = 0
for root, _dirs, files in os.walk(state):
    size += sum(os.path.getsize(os.path.join(root, f)) for f in files)
kc.stop_channels()
km.shutdown_kernel(now=True)
print(json.dumps({"mode": MODE, "loaded": ext_loaded, "times": times, "error": error,
                  "settled": settled, "state_bytes": size}))
"""


def run_notebook(image: str, mode: str, pause: float, cells: int = CELLS) -> dict[str, Any]:
    done = subprocess.run(
        ["docker", "run", "--rm", "-i", "--network", "none", "--memory", "4g", image]
        + ["python", "-", EXTENSION, mode, str(pause), str(cells)],
        input=DRIVER,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the kernel driver failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def extension_present(image: str) -> bool:
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "python", "-c"]
        + [f"import numpy, {EXTENSION}"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    return probe.returncode == 0


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot_cells")
    parser.add_argument("--reps", type=int, default=3, help="paired runs (on, off) of the notebook")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between cells")
    parser.add_argument("--image", default=IMAGE)
    args = parser.parse_args(argv)
    if not extension_present(args.image):
        print(
            f"checkpoint overhead: skipped, {args.image} has no numpy or no {EXTENSION} "
            "(images/build builds it into the session images)"
        )
        return None
    on: list[list[float]] = []
    off: list[list[float]] = []
    settled: list[float] = []
    state_bytes = 0
    for _ in range(args.reps):
        for mode, into in (("off", off), ("on", on)):
            result = run_notebook(args.image, mode, args.pause)
            if result["error"]:
                raise RuntimeError(f"{mode}: {result['error']}")
            if result["loaded"] != (mode == "on"):
                raise RuntimeError(f"{mode}: the extension was {'not ' * (mode == 'on')}loaded")
            into.append(result["times"])
            if mode == "on":
                if result["settled"] is not None:
                    settled.append(result["settled"])
                state_bytes = result["state_bytes"]
    # Per cell: the median over the runs, then on - off; the figure is the median of that.
    cell_on = [statistics.median(run[i] for run in on) for i in range(CELLS)]
    cell_off = [statistics.median(run[i] for run in off) for i in range(CELLS)]
    added = [a - b for a, b in zip(cell_on, cell_off, strict=True)]
    median_added = statistics.median(added)
    median_cell = statistics.median(cell_off)
    figures = {
        "cells": CELLS,
        "reps": args.reps,
        "pause": args.pause,
        "median_cell_s": median_cell,
        "median_added_s": median_added,
        "median_added_pct": 100 * median_added / median_cell,
        "p90_added_s": sorted(added)[int(0.9 * (CELLS - 1))],
        "total_on_s": sum(cell_on),
        "total_off_s": sum(cell_off),
        "settled_s": statistics.median(settled) if settled else None,
        "state_mb": state_bytes / 1e6,
    }
    settled_s = figures["settled_s"] if settled else float("nan")
    print(
        f"checkpoint overhead ({CELLS} cells, {figures['state_mb']:.0f} MB checkpointed, "
        f"{args.reps} paired runs, pause {args.pause:g} s): "
        f"median cell {median_cell * 1000:.0f} ms, "
        f"median added {median_added * 1000:.1f} ms per cell = "
        f"{figures['median_added_pct']:.2f} % (aim <= 2.5 %), "
        f"p90 added {figures['p90_added_s'] * 1000:.1f} ms; whole notebook "
        f"{figures['total_on_s']:.1f} s on vs {figures['total_off_s']:.1f} s off; "
        f"last delta on disk {settled_s:.2f} s after the last cell"
    )
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
