"""Builders for the Hub's configuration: nodes, teams and the spawn options tests use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.hub import Hub

NODE = "bhprep"
"""The second engine's name (scripts/engine node NAME; its pid file is
/var/run/budgethub/NAME.pid)."""

ONE_GPU = {"profile": "gpu-notebook", "gpus": 1}
"""Spawn options for one whole GPU of the default GPU profile."""


FUNDED_AND_GUESTS = [
    {"name": "nlp", "share": {"gpu": 1.0, "cpu": 1.0}},
    {"name": "guests", "share": {"gpu": 0.0, "cpu": 0.0}},
]
"""nlp holds every pool; guests have no share, so their sessions run unallocated."""


def notebook_profile(
    image: str, memory_gib: int = 2, gpus: list[int] | None = None
) -> dict[str, Any]:
    """The ``notebook`` profile of the preemption and snapshot Hubs: whole GPUs, one CPU,
    protected an hour by default."""
    return {
        "slug": "notebook",
        "display_name": "Notebook",
        "description": "a GPU notebook",
        "class": "interactive",
        "pool": "gpu",
        "image": image,
        "gpus": gpus or [1, 2],
        "cpus": 1,
        "memory_gib": memory_gib,
        "min_runtime": "1h",
        "max_min_runtime": "8h",
    }


def one_gpu_profile(slug: str, **extra: Any) -> dict[str, Any]:
    """A profile of one whole GPU on the default image, one CPU and 1 GiB, protected an
    hour; ``extra`` overrides or adds fields (``resumable``, ``class``, ``image``)."""
    profile: dict[str, Any] = {
        "slug": slug,
        "display_name": slug,
        "description": slug,
        "class": "interactive",
        "pool": "gpu",
        "image": "budgethub/gpu:latest",
        "gpus": [1],
        "cpus": 1,
        "memory_gib": 1,
        "min_runtime": "1h",
        "max_min_runtime": "8h",
    }
    profile.update(extra)
    return profile


def demo_teams() -> list[dict[str, Any]]:
    """Two teams with half of each pool: nlp and vision."""
    return [
        {"name": "nlp", "share": {"gpu": 0.5, "cpu": 0.5}},
        {"name": "vision", "share": {"gpu": 0.5, "cpu": 0.5}},
    ]


def local_gpu_node(gpus: int = 2, **extra: Any) -> dict[str, Any]:
    """A GPU node on the default engine (fake GPUs: nothing here has a real one)."""
    node = {"name": "gpu-1", "pool": "gpu", "gpus": gpus, "cpus": 8, "memory_gib": 16}
    node.update(extra)
    return node


def cpu_node(storage_path: str, **extra: Any) -> dict[str, Any]:
    """A CPU node next to storage ``weka-a`` at ``storage_path``."""
    node = {
        "name": "prep-1",
        "pool": "cpu",
        "cpus": 8,
        "memory_gib": 16,
        "storage": {"weka-a": storage_path},
    }
    node.update(extra)
    return node


def preemption_hub(make_hub: Callable[..., Hub], **extra: Any) -> Hub:
    """One GPU; ann (nlp) is funded, gus (guests, no share) runs unallocated and may be
    displaced a second after he starts."""
    return make_hub(
        nodes=[local_gpu_node(gpus=1)],
        teams=FUNDED_AND_GUESTS,
        groups={"nlp": ["ann"], "guests": ["gus"]},
        extra="c.BudgetScheduler.unallocated_grace = 1.0",
        **extra,
    )
