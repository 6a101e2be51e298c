"""Checkpoint overhead per cell, measured on real kernels (bench/checkpoint.py runs it).

A notebook of ``cells`` cells over ``state_mb`` MB of state (four numpy arrays and a
DataFrame, equal shares): the first cell builds the state, each later cell does
real work on it (a sort of one array, a groupby) and changes something: a new
small variable, a slice of an array mutated in place, an array rebound. The same
cells run in two servers, with the extension off (``BUDGETHUB_CHECKPOINT=0``) and
on, ``runs`` times each, alternating; a cell's time is the client's
execute_request -> execute_reply, its best over the runs. Reported: the median over
cells of (on - off), as seconds and as a share of the median cell time; the time
spent on the kernel's thread after cells (the name analysis) and in the background
saves; the bytes written; the final flush (the agent's checkpoint) after the last
cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from budgethub_session.localserver import LocalKernel, LocalServer

__all__ = ["measure", "notebook_cells"]

STATS = (
    "(lambda a: (a.worker.wait_idle(600), [a.cell_seconds, a.checkpointer.save_seconds,"
    " a.checkpointer.written_bytes, a.checkpointer.saves])[1])"
    "(__import__('budgethub_session.snapshot', fromlist=['_ACTIVE'])._ACTIVE)"
)


def notebook_cells(cells: int = 50, state_mb: int = 200) -> list[str]:
    share = state_mb * 2**20 // 5 // 8  # float64 elements per array
    out = [
        "import numpy as np, pandas as pd\n"
        "rng = np.random.default_rng(0)\n"
        + "".join(f"a{j} = rng.random({share})\n" for j in range(4))
        + f"df = pd.DataFrame({{'k': rng.integers(0, 100, {share // 2}),"
        f" 'v': rng.random({share // 2})}})\n"
        "results = []"
    ]
    for i in range(1, cells):
        j = i % 4
        work = f"s = np.sort(a{j})[::1000].sum()\n"
        kind = i % 4
        if kind == 0:
            change = f"r{i} = float(s)"
        elif kind == 1:
            change = f"a{j}[:1000] += 1.0\nresults.append(float(s))"
        elif kind == 2:
            change = f"g{i} = df.groupby('k').v.mean()"
        else:
            change = f"a{j} = a{j} + 1.0"
        out.append(work + change)
    return out


def _run(root: Path, cells: list[str], on: bool) -> dict[str, Any]:
    with LocalServer(
        root / ("on" if on else "off"), home=root / ("home-on" if on else "home-off"), checkpoint=on
    ) as server:
        kernel = server.open_notebook("bench.ipynb")
        times = [kernel.ok(cell, timeout=600).seconds for cell in cells]
        out: dict[str, Any] = {"times": times}
        if on:
            out["stats"] = _stats(kernel)
            t0 = time.perf_counter()
            status, report = server.agent("POST", "checkpoint", {"within": 120}, timeout=180)
            out["flush_s"] = time.perf_counter() - t0
            out["flush"] = report["kernels"][0] if status == 200 else report
        return out


def _stats(kernel: LocalKernel) -> list[float]:
    msg_id = kernel.send("", silent=True, store_history=False, user_expressions={"s": STATS})
    reply = kernel.wait(msg_id, 600)
    content = next(m for m in reply.messages if m["msg_type"] == "execute_reply")["content"]
    import ast

    return list(ast.literal_eval(content["user_expressions"]["s"]["data"]["text/plain"]))


def measure(
    cells: int = 50, state_mb: int = 200, runs: int = 2, root: Path | None = None
) -> dict[str, Any]:
    code = notebook_cells(cells, state_mb)
    with tempfile.TemporaryDirectory(prefix="bh-overhead-") as tmp:
        base = Path(root or tmp)
        off_runs, on_runs = [], []
        for r in range(runs):
            off_runs.append(_run(base / f"off{r}", code, False))
            on_runs.append(_run(base / f"on{r}", code, True))
    off = [min(run["times"][i] for run in off_runs) for i in range(cells)]
    on = [min(run["times"][i] for run in on_runs) for i in range(cells)]
    work_off, work_on = off[1:], on[1:]  # the setup cell builds the state: not a work cell
    added = [b - a for a, b in zip(work_off, work_on, strict=True)]
    median_cell = statistics.median(work_off)
    last = on_runs[-1]
    cell_s, save_s, written, saves = last["stats"]
    return {
        "cells": cells,
        "state_mb": state_mb,
        "runs": runs,
        "median_cell_s_off": median_cell,
        "median_cell_s_on": statistics.median(work_on),
        "median_added_s": statistics.median(added),
        "median_added_pct": 100 * statistics.median(added) / median_cell,
        "kernel_thread_s_per_cell": cell_s / cells,
        "background_save_s_per_cell": save_s / max(saves, 1),
        "saves": saves,
        "written_mb": written / 2**20,
        "setup_cell_s": {"off": off[0], "on": on[0]},
        "final_flush_s": last["flush_s"],
        "final_flush": {k: last["flush"].get(k) for k in ("state", "bytes", "error")},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=int, default=50)
    p.add_argument("--state-mb", type=int, default=200)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = measure(args.cells, args.state_mb, args.runs)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_result(result))
    return 0


def format_result(r: dict[str, Any]) -> str:
    return (
        f"checkpoint overhead: {r['cells']} cells, {r['state_mb']} MB of state, best of "
        f"{r['runs']} runs: median cell {r['median_cell_s_off'] * 1000:.0f} ms without, "
        f"{r['median_cell_s_on'] * 1000:.0f} ms with; median added "
        f"{r['median_added_s'] * 1000:+.1f} ms per cell "
        f"({r['median_added_pct']:+.2f} %; aim <= 2.5 %)"
        f"\n  on the kernel's thread {r['kernel_thread_s_per_cell'] * 1000:.2f} ms per cell; "
        f"background save {r['background_save_s_per_cell'] * 1000:.0f} ms per save "
        f"({r['saves']} saves, {r['written_mb']:.0f} MB written); final flush "
        f"{r['final_flush_s'] * 1000:.0f} ms ({r['final_flush']['state']})"
    )


if __name__ == "__main__":
    sys.exit(main())
