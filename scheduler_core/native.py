"""The scheduler core's compiled build: which modules `make` compiles, and the guard that
keeps a stale build from running.

The policy and the simulator are compiled with mypyc (as black and mypy ship
themselves): the same typed source, built into C extensions beside the ``.py`` files,
which Python then imports first. They decide exactly as the source does
(`python -m bench.identical`). Pure Python stays a full fallback: without a build,
or with ``BUDGETHUB_PURE_PYTHON=1``, the same code runs from source and makes the same
decisions, more slowly: a steady cycle takes about 1.8 times as long and a simulated
month about 2.5 times (docs/benchmarks/cycle.md, "Compiled against source").

Why a guard: an extension built from older source would shadow an edited ``.py``. The
build (scripts/compile_core.py) writes `MANIFEST`, the hash of every compiled module's
source; at import, if any hash differs (or the manifest is missing), every compiled
module is loaded from its source instead, with one warning. All or none: compiled
modules call each other natively, so one edited module cannot be mixed with the rest.
This module itself is never compiled.

Why the compiled modules' constants are ``Final``: compiled, a plain module global is a
dict look-up and an unboxing at every read; a ``Final`` literal is built into the code.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent
"""The scheduler_core package folder."""

MODULES: tuple[str, ...] = (
    "scheduler_core.capacity",
    "scheduler_core.kept",
    "scheduler_core.metrics",
    "scheduler_core.ledger",
    "scheduler_core.model",
    "scheduler_core.nodefree",
    "scheduler_core.preemption",
    "scheduler_core.ranking",
    "scheduler_core.rules",
    "scheduler_core.scheduler",
    "scheduler_core.settings",
    "scheduler_core.simulator",
    "scheduler_core.teams",
    "scheduler_core.verdict",
    "scheduler_core.view",
    "scheduler_core.policy",
    "scheduler_core.policy.cycle",
    "scheduler_core.policy.day",
    "scheduler_core.policy.failures",
    "scheduler_core.policy.funding",
    "scheduler_core.policy.heads",
    "scheduler_core.policy.holds",
    "scheduler_core.policy.order",
    "scheduler_core.policy.placement",
    "scheduler_core.policy.victims",
)
"""The modules compiled: the policy, what a cycle reads, the scheduler, the simulator, and
the run metrics (every replay reads a month's outcome twice: 0.46 -> 0.29 s of CPU each, seed 1)."""

GROUP = "scheduler_core.native_build"
"""The compiled group's name: its shared library is ``scheduler_core/native_build__mypyc*``."""

MANIFEST = ROOT / "native.json"
"""Written by the build: ``{"sources": {module: sha256 of its source}}``."""

PURE_ENV = "BUDGETHUB_PURE_PYTHON"


def source_of(module: str) -> Path:
    """The ``.py`` file of a compiled module."""
    parts = module.split(".")[1:]
    folder = ROOT.joinpath(*parts)
    return folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sources() -> dict[str, str]:
    """Each compiled module's source hash, as the tree is now."""
    return {module: digest(source_of(module)) for module in MODULES}


def built() -> list[Path]:
    """The compiled extensions present beside the source (none: pure Python)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    folders = {source_of(m).parent for m in MODULES}
    return sorted(p for f in folders for p in f.iterdir() if p.name.endswith(suffixes))


def stale_reason() -> str | None:
    """Why the build present may not run (None: it may, or there is none)."""
    if not built():
        return None
    try:
        recorded = json.loads(MANIFEST.read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST.name} is missing or unreadable"
    changed = sorted(m for m, h in sources().items() if recorded.get(m) != h)
    if changed:
        shown = ", ".join(changed[:3]) + (" …" if len(changed) > 3 else "")
        return f"the source of {shown} changed since the build"
    return None


class _FromSource(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' ``.py`` files, ahead of their extensions."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        source = source_of(fullname)
        locations = [str(source.parent)] if source.name == "__init__.py" else None
        return importlib.util.spec_from_file_location(
            fullname, source, submodule_search_locations=locations
        )


def guard() -> str:
    """Run the compiled build, or the source where the build is stale or unwanted.

    Called by the package's ``__init__`` before any compiled module is imported.
    Returns what runs: ``compiled``, ``source`` (no build) or ``source (…why)``."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        reason: str | None = f"{PURE_ENV} is set"
    else:
        if not built():
            return "source"
        reason = stale_reason()
        if reason is None:
            return "compiled"
        log.warning(
            "scheduler_core: running from source, not the compiled build: %s "
            "(`make native` builds it again)",
            reason,
        )
    if not any(isinstance(f, _FromSource) for f in sys.meta_path):
        sys.meta_path.insert(0, _FromSource())
    return f"source ({reason})"
