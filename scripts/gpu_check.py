#!/usr/bin/env python3
"""The prepared check for a lent GPU machine (no Docker needed); runs on CPU too.

    python3 scripts/gpu_check.py [--gib 4] [--keep DIR]

1. The inventory through pynvml, exactly as a ``gpus: "nvml"`` node reads it
   (spawner/runtime/inventory.py's nvml_gpus: UUIDs, MIG mode and MIG instances).
2. A kernel namespace holding a CUDA tensor of ``--gib`` GiB (plus a small model
   state dict and a numpy array) is checkpointed with the images' extension
   (budgethub_session.snapshot loaded into an IPython shell, one cell, the
   background save, then the agent's flush), timed.
3. It is restored into a fresh Python process twice, with the map_location the
   extension picks on this node (cuda) and with ``cpu``, each timed and checked
   value for value (a checksum of the tensor, computed on both sides).

Without pynvml/an NVIDIA driver, torch, or CUDA the matching parts print
``SKIP <why>`` and the rest runs on the CPU (a small CPU tensor, or a numpy array
when torch is missing), so the script itself is tested anywhere. Every line it
prints starts with a tag (INVENTORY, SAVE, RESTORE, SKIP, FAIL, DONE); it exits 1
on a FAIL.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "images" / "session"))
if os.environ.get("BUDGETHUB_EXTRA_SITE"):  # e.g. cloudpickle unpacked next to the tree
    sys.path.insert(0, os.environ["BUDGETHUB_EXTRA_SITE"])

FAILED = False


def say(tag: str, message: str) -> None:
    global FAILED
    FAILED = FAILED or tag == "FAIL"
    print(f"{tag} {message}", flush=True)


def inventory() -> None:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        say("SKIP", "inventory: pynvml is not installed (pip install nvidia-ml-py)")
        return
    sys.path.insert(0, str(ROOT))
    # spawner/__init__ imports the JupyterHub side; load only the inventory module.
    spec = importlib.util.spec_from_file_location("bh_inventory", ROOT / "spawner" / "inventory.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        gpus = module.nvml_gpus()
    except Exception as error:  # InventoryError: no driver here
        say("SKIP", f"inventory: {error}")
        return
    for gpu in gpus:
        migs = ", ".join(f"{m.profile} {m.uuid}" for m in gpu.mig) or "MIG off"
        say(
            "INVENTORY",
            f"gpu {gpu.index} {gpu.name} {gpu.memory_mib} MiB uuid={gpu.uuid} "
            f"virtual={gpu.virtual}: {migs}",
        )
    if not gpus:
        say("INVENTORY", "NVML answers and sees no GPU")


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def checkpoint(state: Path, gib: float) -> dict:
    """One notebook kernel's namespace, saved by the extension; what to check on restore."""
    os.environ["BUDGETHUB_STATE_DIR"] = str(state)
    os.environ["JPY_SESSION_NAME"] = "gpu-check.ipynb"
    from budgethub_session import snapshot as ext
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "budgethub_session.snapshot")
    torch = _torch()
    if torch is not None and torch.cuda.is_available():
        n = int(gib * 2**30 // 4)
        cell = (
            "import torch, numpy as np\n"
            f"big = torch.rand({n}, device='cuda')\n"
            "model = {'w': torch.randn(1024, 1024, device='cuda'),\n"
            "         'b': torch.zeros(1024, device='cuda')}\n"
            "arr = np.arange(1000)\n"
        )
        what = f"cuda tensor {n * 4 / 2**30:.2f} GiB on {torch.cuda.get_device_name(0)}"
    elif torch is not None:
        say("SKIP", "CUDA: torch.cuda.is_available() is False; a 64 MiB CPU tensor instead")
        cell = (
            "import torch, numpy as np\nbig = torch.rand(16 * 2**20)\n"
            "model = {'w': torch.randn(256, 256), 'b': torch.zeros(256)}\narr = np.arange(1000)\n"
        )
        what = "cpu tensor 64 MiB"
    else:
        say("SKIP", "torch: not installed; a 64 MiB numpy array instead of a tensor")
        cell = "import numpy as np\nbig = np.random.rand(8 * 2**20)\narr = np.arange(1000)\n"
        what = "numpy array 64 MiB"
    t0 = time.perf_counter()
    result = shell.run_cell(cell)
    cell_s = time.perf_counter() - t0
    if not result.success:
        say("FAIL", f"the cell failed: {result.error_in_exec or result.error_before_exec}")
        return {}
    t0 = time.perf_counter()
    ext._ACTIVE.worker.wait_idle(3600)
    background_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = ext._ACTIVE.flush()
    flush_s = time.perf_counter() - t0
    ns = shell.user_ns
    checksum = _checksum(ns["big"])
    size = sum(p.stat().st_size for p in state.rglob("*.pkl"))
    say(
        "SAVE",
        f"{what}: cell {cell_s:.2f} s, background save done {background_s:.2f} s after the cell, "
        f"flush {flush_s:.3f} s (state {report['state']}, saved {report['saved']}), "
        f"{size / 2**30:.2f} GiB on disk",
    )
    return {"checksum": checksum, "bytes": size}


def _checksum(value) -> float:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return float(value.double().sum().item())
    return float(value.sum())


RESTORE = """
import json, sys, time
sys.path.insert(0, {session!r})
t0 = time.perf_counter()
from budgethub_session import checkpoint
if {map!r} != "auto":
    checkpoint.MAP_LOCATION = {map!r}
ns = {{}}
result = checkpoint.load_namespace(__import__("pathlib").Path({directory!r}), ns)
big = ns["big"]
torch = sys.modules.get("torch")
if torch is not None and isinstance(big, torch.Tensor):
    if big.is_cuda:
        torch.cuda.synchronize()
    device, checksum = str(big.device), float(big.double().sum().item())
    model_device = str(ns["model"]["w"].device)
else:
    device, checksum, model_device = "numpy", float(big.sum()), "-"
print(json.dumps({{"seconds": time.perf_counter() - t0, "load_seconds": result.seconds,
                  "device": device, "model_device": model_device, "checksum": checksum,
                  "restored": result.restored, "not_restored": result.not_restored}}))
"""


def restore(directory: Path, map_location: str, expected: dict) -> None:
    code = RESTORE.format(
        session=str(ROOT / "images" / "session"), map=map_location, directory=str(directory)
    )
    env = {k: v for k, v in os.environ.items() if k != "BUDGETHUB_MAP_LOCATION"}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=1800, env=env
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        say("FAIL", f"restore ({map_location}): exit {proc.returncode}: {proc.stderr[-2000:]}")
        return
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    same = abs(r["checksum"] - expected["checksum"]) <= 1e-6 * max(1.0, abs(expected["checksum"]))
    gbps = expected["bytes"] / 2**30 / max(r["load_seconds"], 1e-9)
    say(
        "RESTORE" if same else "FAIL",
        f"map_location={map_location}: big on {r['device']} (model on {r['model_device']}), "
        f"load {r['load_seconds']:.2f} s ({gbps:.2f} GiB/s), fresh process {wall:.2f} s in all, "
        f"checksum {'equal' if same else 'DIFFERS'} ({r['checksum']:.6g}), "
        f"restored {r['restored']}, not restored {r['not_restored']}",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=4.0, help="size of the CUDA tensor (GiB)")
    p.add_argument("--keep", type=Path, help="keep the checkpoint in this directory")
    args = p.parse_args(argv)
    say("INFO", f"python {sys.version.split()[0]} on {os.uname().nodename}")
    inventory()
    try:
        import cloudpickle  # noqa: F401
        import IPython  # noqa: F401
    except ImportError as error:
        say("FAIL", f"{error.name} is missing (the images have it); set BUDGETHUB_EXTRA_SITE")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bh-gpu-check-"))
    state = args.keep or tmp / "kernels"
    try:
        expected = checkpoint(state, args.gib)
        if expected:
            from budgethub_session import notebook_key

            directory = state / notebook_key("gpu-check.ipynb")
            torch = _torch()
            if torch is not None and torch.cuda.is_available():
                restore(directory, "auto", expected)  # cuda: what the extension picks here
            else:
                say("SKIP", "restore on the GPU: no CUDA here")
            restore(directory, "cpu", expected)
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    say("DONE", "failed" if FAILED else "ok")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
