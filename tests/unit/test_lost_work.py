"""Lost work and goodput (scheduler_core.metrics): a preemption worked out by hand, and
the per-class figures against the simulator's own count on a generated week."""

from __future__ import annotations

from typing import Any

import pytest

from harness.builders import DAY, HOUR, outcome_of
from scheduler_core.research.generator import SeedLikeOptions, seed_like


def request(rid: str, team: str, submit: float, hours: float, klass: str, resumable: bool) -> Any:
    return {
        "id": rid,
        "user": f"user-{team}",
        "team": team,
        "submit": submit,
        "pool": "h100",
        "gpus": 8,
        "nodes": 1,
        "cpus": 8,
        "memory_gib": 64,
        "min_runtime": 60,
        "duration": round(hours * HOUR),
        "resumable": resumable,
        "class": klass,
    }


def preempted_notebook(resumable: bool) -> dict[str, Any]:
    """One 8-GPU node for a day. Team guest (no share) runs an 8-GPU notebook of 10 h from
    time 0, unallocated; at 2 h team owner (the whole share) asks for the node for 1 h and
    stops it. The notebook starts again at 3 h: not resumable, from the beginning (lost:
    2 h x 8 GPUs = 16 GPU-h, and it ends at 13 h); resumable, with 8 h left (ends at 11 h).
    """
    return {
        "name": "lost-work",
        "horizon": DAY,
        "policy": {"name": "budget"},
        "pools": [{"name": "h100", "kind": "gpu"}],
        "nodes": [{"name": "n1", "pool": "h100", "gpus": 8, "cpus": 96, "memory_gib": 1024}],
        "teams": [
            {"name": "owner", "share": {"h100": 1.0}},
            {"name": "guest", "share": {"h100": 0.0}},
        ],
        "usage": [],
        "requests": [
            request("nb", "guest", 0, 10, "interactive", resumable),
            request("job", "owner", 2 * HOUR, 1, "batch", True),
        ],
        "events": [],
    }


def test_a_preempted_run_that_starts_over_is_lost_and_goodput_leaves_it_out() -> None:
    out = outcome_of(preempted_notebook(resumable=False))
    notebook = next(r for r in out["requests"] if r["id"] == "nb")
    assert notebook["starts"] == [0.0, 3 * HOUR] and notebook["ends"] == [2 * HOUR, 13 * HOUR]
    metrics = out["metrics"]
    capacity = 8 * 24.0  # GPU-hours in the horizon
    assert metrics["lost_gpu_seconds"] == 16 * HOUR
    assert metrics["lost_gpu_h_by_class"] == {
        "debug": 0.0,
        "interactive": 16.0,
        "batch": 0.0,
        "dataprep": 0.0,
    }
    # Busy: the notebook 2 h + 10 h and the job 1 h, on 8 GPUs; of it 16 GPU-h are redone.
    assert metrics["occupancy"] == round(13 * 8 / capacity, 4)
    assert metrics["lost_share"] == round(16 / capacity, 4)
    assert metrics["goodput"] == round((13 * 8 - 16) / capacity, 4)


def test_a_snapshotted_run_loses_its_snapshot_and_restore_only() -> None:
    """Resumable, the notebook keeps its 2 h and loses the snapshot's taking at 2 h and
    its restore at 3 h, each scaled by its 64 GiB (model.SNAPSHOT_*, from
    `python -m bench.snapshot`): 1.58 + 3.02 x 64 s and 5.33 + 2.22 x 64 s on 8 GPUs."""
    lost = outcome_of(preempted_notebook(resumable=False))["metrics"]
    out = outcome_of(preempted_notebook(resumable=True))
    kept = out["metrics"]
    assert kept["preemptions"] == 1
    take, restore = 1.58 + 3.02 * 64, 5.33 + 2.22 * 64
    assert kept["lost_gpu_seconds"] == pytest.approx((take + restore) * 8, abs=0.1)
    assert kept["lost_gpu_h_by_class"]["interactive"] == round((take + restore) * 8 / HOUR, 2)
    notebook = next(r for r in out["requests"] if r["id"] == "nb")
    # Its second run restores first, then does the 8 h left.
    assert notebook["ends"][-1] == pytest.approx(11 * HOUR + restore, abs=1e-3)
    assert kept["goodput"] == pytest.approx(kept["occupancy"] - kept["lost_share"], abs=2e-4)
    # The same useful work either way, less the snapshot's taking, which the simulator
    # does not hold the GPUs for (so it is lost but not in occupancy).
    capacity = 8 * 24 * HOUR
    assert kept["goodput"] == pytest.approx(lost["goodput"] - take * 8 / capacity, abs=2e-4)
    assert kept["lost_share"] < lost["lost_share"]


def test_no_gpu_pool_has_no_goodput() -> None:
    data = preempted_notebook(resumable=False)
    data["pools"] = [{"name": "h100", "kind": "cpu"}]
    for item in data["requests"]:
        item["gpus"] = 0
    data["nodes"][0]["gpus"] = 0
    metrics = outcome_of(data)["metrics"]
    assert metrics["lost_share"] is None and metrics["goodput"] is None
    assert metrics["lost_gpu_seconds"] == 0.0


@pytest.mark.parametrize("restorable", [False, True])
def test_the_classes_sum_to_the_simulators_own_count(restorable: bool) -> None:
    """On a saturated generated day with notebooks, preemptions happen; the per-class
    figures (from the records) add up to what the simulator counted as it preempted."""
    options = SeedLikeOptions(
        gpus=16, days=1, seed=1, load=1.2, interactive_share=0.35, restorable=restorable
    )
    metrics = outcome_of(seed_like(options))["metrics"]
    lost_h = metrics["lost_gpu_seconds"] / HOUR
    assert metrics["preemptions"] > 0
    assert sum(metrics["lost_gpu_h_by_class"].values()) == pytest.approx(lost_h, abs=0.05)
    assert lost_h > 0
    assert metrics["goodput"] == pytest.approx(
        metrics["occupancy"] - metrics["lost_share"], abs=2e-4
    )
