"""Checkpoint overhead per cell: one notebook of 50 cells reaching 200 MB of state, run
in a real IPython kernel in the session image, with the checkpoint extension loaded
and without it; the figure is the median over the cells of the added time per cell.

Cells are sent back to back (each as soon as the previous one is idle), so the
background checkpoint of one cell competes with the next: the worst case for the
extension. A cell's time is the best of the runs (execute_request -> idle), as
other work on the machine is not the extension's. ``--pause S`` leaves S seconds
between cells, as a person would. The kernel runs in the session image (``docker
run``, no network), where the extension, its serializers and the kernel's packages
are the ones sessions get; where the image lacks numpy or the extension, in this
venv with the package from images/session (the line says which). "Off" is the same
kernel with ``BUDGETHUB_CHECKPOINT=0``.

Run: ``python -m bench.snapshot_cells [--reps N] [--pause S] [--where IMAGE|venv]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

IMAGES = ("budgethub/gpu:latest", "budgethub/dataprep:latest")
"""The session images tried in turn: the first with numpy and the extension is used."""
SESSION_PACKAGE = Path(__file__).resolve().parents[1] / "images" / "session"
EXTENSION = "budgethub_session.snapshot"
CELLS = 50
FIGURES = ("snapshot_cells.added_pct",)
"""The figures ``collect`` returns (bench/bars.toml); none where no image or venv has
the extension (the run is skipped)."""

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
env = dict(os.environ, BUDGETHUB_STATE_DIR=state, JPY_SESSION_NAME="bench/cells.ipynb",
           BUDGETHUB_CHECKPOINT="1" if MODE == "on" else "0")
km = KernelManager(kernel_name="python3")
km.start_kernel(env=env)
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

def ask(code):
    got = []
    def hook(msg):
        if msg["msg_type"] == "stream":
            got.append(msg["content"]["text"])
    kc.execute_interactive(code, store_history=False, output_hook=hook, timeout=60)
    return "".join(got).strip()

def loaded():
    return ask(f"import {EXT} as _bh\nprint(_bh._ACTIVE is not None)") == "True"

error = None
if MODE == "on" and not loaded():  # not configured for every kernel (a venv, not the image)
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
on_thread = None
if MODE == "on" and error is None:
    on_thread = float(ask("print(_bh._ACTIVE.cell_seconds)"))
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
                  "settled": settled, "state_bytes": size, "on_thread": on_thread,
                  "python": sys.version.split()[0]}))
"""


def run_notebook(where: str, mode: str, pause: float, cells: int = CELLS) -> dict[str, Any]:
    """One run of the notebook; ``where`` is an image name or ``venv`` (this Python, with
    the session package from images/session)."""
    args = ["-", EXTENSION, mode, str(pause), str(cells)]
    if where == "venv":
        env = dict(os.environ, PYTHONPATH=str(SESSION_PACKAGE))
        command = [sys.executable, *args]
    else:
        env = None
        command = ["docker", "run", "--rm", "-i", "--network", "none", "--memory", "4g"]
        command += [where, "python", *args]
    done = subprocess.run(
        command,
        input=DRIVER,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env=env,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the kernel driver failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def extension_present(image: str) -> bool:
    """Does the session image hold the extension and numpy?"""
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "python", "-c"]
        + [f"import numpy, {EXTENSION}"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    return probe.returncode == 0


def session_image() -> str | None:
    """The first session image that holds numpy and the extension, if any."""
    return next((image for image in IMAGES if extension_present(image)), None)


def venv_has_extension() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", f"import numpy, ipykernel, jupyter_client, {EXTENSION}"],
        capture_output=True,
        timeout=120,
        check=False,
        env=dict(os.environ, PYTHONPATH=str(SESSION_PACKAGE)),
    )
    return probe.returncode == 0


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot_cells")
    parser.add_argument("--reps", type=int, default=5, help="paired runs (on, off) of the notebook")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between cells")
    parser.add_argument(
        "--where",
        default=None,
        help="an image (default: the first of {IMAGES} with numpy and the extension) or 'venv'",
    )
    args = parser.parse_args(argv)
    where = args.where
    if where is None:
        where = session_image() or ("venv" if venv_has_extension() else None)
    if where is None:
        print(
            f"checkpoint overhead: skipped, neither {', '.join(IMAGES)} nor this venv (with "
            f"images/session) has numpy and {EXTENSION}"
        )
        return None
    on: list[list[float]] = []
    off: list[list[float]] = []
    settled: list[float] = []
    on_thread: list[float] = []
    python = ""
    state_bytes = 0
    for _ in range(args.reps):
        for mode, into in (("off", off), ("on", on)):
            result = run_notebook(where, mode, args.pause)
            if result["error"]:
                raise RuntimeError(f"{mode}: {result['error']}")
            if result["loaded"] != (mode == "on"):
                raise RuntimeError(f"{mode}: the extension was {'not ' * (mode == 'on')}loaded")
            into.append(result["times"])
            if mode == "on":
                if result["settled"] is not None:
                    settled.append(result["settled"])
                on_thread.append(result["on_thread"] / CELLS)
                python = result["python"]
                state_bytes = result["state_bytes"]
    # Per cell: the best of the runs (what other work on the machine adds is not the
    # extension's), then on - off; the figure is the median of that over the cells.
    cell_on = [min(run[i] for run in on) for i in range(CELLS)]
    cell_off = [min(run[i] for run in off) for i in range(CELLS)]
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
        "on_kernel_thread_s": statistics.median(on_thread),
        "where": where,
    }
    settled_s = figures["settled_s"] if settled else float("nan")
    print(
        f"checkpoint overhead ({where}, Python {python}; {CELLS} cells, "
        f"{figures['state_mb']:.0f} MB checkpointed, "
        f"{args.reps} paired runs, pause {args.pause:g} s): "
        f"median cell {median_cell * 1000:.0f} ms, "
        f"median added {median_added * 1000:.1f} ms per cell = "
        f"{figures['median_added_pct']:.2f} % (aim <= 2.5 %), "
        f"p90 added {figures['p90_added_s'] * 1000:.1f} ms; on the kernel's thread "
        f"{figures['on_kernel_thread_s'] * 1000:.2f} ms per cell; whole notebook "
        f"{figures['total_on_s']:.1f} s on vs {figures['total_off_s']:.1f} s off; "
        f"last delta on disk {settled_s:.2f} s after the last cell"
    )
    return figures


def collect(argv: list[str] | None = None) -> dict[str, float]:
    """Run as ``main`` does, printing the same; the figures (FIGURES), none if skipped."""
    figures = main(argv)
    if figures is None:
        return {}
    return {"snapshot_cells.added_pct": float(figures["median_added_pct"])}


if __name__ == "__main__":
    main(sys.argv[1:])
