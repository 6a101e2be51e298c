"""scripts/gpu_check.py, the prepared GPU-machine check, runs here with its CUDA parts
skipped (and says so), checkpointing and restoring for real on the CPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import REPO

pytest.importorskip("IPython")

SCRIPT = REPO / "scripts" / "gpu_check.py"


def test_gpu_check_runs_on_cpu_and_restores_value_for_value() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--gib", "0.01"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lines[-1] == "DONE ok"
    tags = {line.split(" ", 1)[0] for line in lines}
    assert {"SAVE", "RESTORE"} <= tags and "FAIL" not in tags
    (restored,) = [line for line in lines if line.startswith("RESTORE map_location=cpu")]
    assert "checksum equal" in restored
    # Without an NVIDIA driver the inventory is skipped with the reason, not faked.
    assert any(line.startswith(("INVENTORY ", "SKIP inventory")) for line in lines)
