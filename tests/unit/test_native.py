"""The compiled scheduler core (scheduler_core/native.py): it decides exactly as its
source, and a build older than the source never runs.

Each case runs in a fresh interpreter: which modules load, compiled or from source, is
settled once per process, when the package is first imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO
from scheduler_core import native

PROBE = """
import json, sys
import scheduler_core
import scheduler_core.policy.order as order
print(json.dumps({"build": scheduler_core.BUILD, "order": order.__file__}))
"""

RUN = """
import json, sys
import scheduler_core
from bench.identical import digest, one
label, requests, _ = one(("cell", "budget", 88, 1.2, 0.35, 1, 4))
print(json.dumps({"build": scheduler_core.BUILD, "digest": digest(requests),
                  "requests": len(requests)}))
"""


def run(code: str, *, root: Path = REPO, pure: bool = False) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter with ``root`` first on its path; its JSON line."""
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    if pure:
        env[native.PURE_ENV] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(REPO)])
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    found["stderr"] = done.stderr
    return found


def test_compiled_and_source_decide_the_same() -> None:
    """A saturated 88-GPU family cell (4 days, budget policy): every request's starts,
    nodes, funding, ends and preemptions are the same compiled and from source."""
    if not native.built() or native.stale_reason() is not None:
        pytest.skip("no current compiled build here (make native builds it)")
    compiled = run(RUN)
    source = run(RUN, pure=True)
    assert compiled["build"] == "compiled"
    assert str(source["build"]).startswith("source")
    assert compiled["requests"] == source["requests"] and int(str(source["requests"])) > 100
    assert compiled["digest"] == source["digest"]


def test_the_pure_switch_loads_every_module_from_source() -> None:
    found = run(PROBE, pure=True)
    assert found["build"] == f"source ({native.PURE_ENV} is set)"
    assert str(found["order"]).endswith(os.path.join("policy", "order.py"))


def copy_package(tmp_path: Path) -> Path:
    """A copy of the scheduler_core package (and no build) under ``tmp_path``."""
    shutil.copytree(
        REPO / "scheduler_core",
        tmp_path / "scheduler_core",
        ignore=shutil.ignore_patterns("*.so", "*.pyd", "native.json", "__pycache__"),
    )
    return tmp_path / "scheduler_core"


def test_a_stale_build_runs_from_source_and_says_why(tmp_path: Path) -> None:
    """An extension beside an edited source is never imported: the copy's extension is
    not even a library, so importing it would fail."""
    package = copy_package(tmp_path)
    (package / "capacity.cpython-311-x86_64-linux-gnu.so").write_bytes(b"not a library")
    hashes = {m: "0" * 64 for m in native.MODULES}
    (package / "native.json").write_text(json.dumps({"sources": hashes}))
    found = run(PROBE, root=tmp_path)
    assert str(found["build"]).startswith("source (the source of scheduler_core.capacity")
    assert str(found["order"]).startswith(str(package))
    assert "running from source, not the compiled build" in str(found["stderr"])


def test_a_build_without_its_manifest_runs_from_source(tmp_path: Path) -> None:
    package = copy_package(tmp_path)
    (package / "policy" / "order.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    found = run(PROBE, root=tmp_path)
    assert found["build"] == "source (native.json is missing or unreadable)"


def test_no_build_runs_from_source_without_a_warning(tmp_path: Path) -> None:
    copy_package(tmp_path)
    found = run(PROBE, root=tmp_path)
    assert found["build"] == "source"
    assert "compiled build" not in str(found["stderr"])
