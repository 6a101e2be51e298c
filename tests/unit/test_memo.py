"""The memo of `order.judge_all` is only a faster road to the same decisions.

In a team's turn, an entry of the same kind (`Queued.kind`: shape, protected window,
rate, units, class, resumability) and age class as one judged before, with nothing
changed since, takes that entry's answer instead of being judged. That is exact only
while every rule reads no more of an entry than its kind (docs/policy.md, "Adding a
rule"). Here every cycle of random runs is decided with the memo and without it
(``budget_policy(..., memo=False)``: every entry judged afresh), and the two must
agree in every field, verdicts included. The runs are drawn so that entries of one
kind queue together: the memo's own case. A restart cost (R9: a session is protected
for its price) is drawn too: it is not in the kind, since it changes only the
protection given at admission, never the answer the memo hands on. Two fields of the
kind change an answer only in states random runs seldom reach, so each has a built
case as well: resumability with nodes held (S3) and the class with a team slicing
itself (S6).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scheduler_core
from harness import REPO
from harness.builders import HOUR, gpu_request, gpu_scenario, only_placeable, scenarios, scheduler
from scheduler_core import model, verdict
from scheduler_core import scheduler as scheduler_module
from scheduler_core.policy import NO_MEMO_ENV, budget_policy
from scheduler_core.policy import order as order_module
from scheduler_core.scenario import Scenario, parse_scenario
from scheduler_core.simulator import Simulation, VirtualClock
from scheduler_core.view import ClusterView, Decisions

TEAMS = ["a", "b", "c"]


FIGURES: dict[str, st.SearchStrategy[Any]] = {
    "min_runtime": st.sampled_from([0, 300, 3600, 28800]),
    "resumable": st.booleans(),
    "class": st.sampled_from(["debug", "interactive", "batch", "batch"]),
    "cpus": st.sampled_from([1, 4]),
    "restart_cost": st.sampled_from([0, 0, 900]),
}
"""A request's figures besides its size, and the values drawn for each."""


@st.composite
def _sizes(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(st.sampled_from(["whole", "whole", "fraction", "mig"]))
    if size == "whole":
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        return {"gpus": gpus, "nodes": draw(st.sampled_from([1, 1, 2]))}
    if size == "fraction":
        return {"gpu_fraction": draw(st.sampled_from([0.25, 0.5]))}
    return {"mig": "1g.10gb"}


@st.composite
def same_kind_queues(draw: st.DrawFn) -> Scenario:
    """Small saturated clusters where the teams queue requests of a few kinds, each kind
    the first but for one figure (size, protection, class, resumability, CPUs), with
    their own ids, submit times and priorities; some old enough to starve or to slice
    their team, with holds, day slices and a team slicing itself in play."""
    nodes: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from([2, 4, 8]))
        node: dict[str, Any] = {"name": f"g{i}", "pool": "g", "gpus": gpus, "cpus": 64}
        if draw(st.booleans()):
            node["mig"] = {"0": ["1g.10gb"] * draw(st.integers(1, 7))}
        nodes.append(node)
    raw = [draw(st.integers(1, 10)) for _ in TEAMS[: draw(st.integers(1, len(TEAMS)))]]
    teams: list[dict[str, Any]] = [
        {"name": TEAMS[i], "share": round(w / sum(raw) * 0.99, 4)} for i, w in enumerate(raw)
    ]
    if len(teams) == 3 and draw(st.booleans()):
        teams[2].update(parent="a", share=0.5)
    usage = [
        {
            "team": t["name"],
            "pool": "g",
            "gpu_seconds": draw(st.sampled_from([0, 1e5, 1e6, 1e7])),
            "ago": draw(st.sampled_from([600, 3600, 80000])),
        }
        for t in teams
    ]
    # A few kinds, each the first but for one field: a kind that left that field out
    # would give one entry the other's answer.
    first = {**draw(_sizes()), **{field: draw(values) for field, values in FIGURES.items()}}
    kinds = [first]
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(["size", *FIGURES]))
        if field == "size":
            kinds.append({**{k: v for k, v in first.items() if k in FIGURES}, **draw(_sizes())})
        else:
            kinds.append({**first, field: draw(FIGURES[field])})
    requests: list[dict[str, Any]] = []
    for i in range(draw(st.integers(2, 40))):
        requests.append(
            {
                "id": f"r{i}",
                "user": "u",
                "team": draw(st.sampled_from([t["name"] for t in teams])),
                "submit": draw(st.integers(0, 9000)),
                "pool": "g",
                "duration": draw(st.integers(60, 30000)),
                "priority": draw(st.sampled_from([0, 0, 1])),
                **draw(st.sampled_from(kinds)),
            }
        )
    data = {
        "name": "memo",
        "horizon": 40000,
        "policy": {
            "name": "budget",
            "starvation_bound": draw(st.sampled_from([600, 3600])),
            "own_slice_after": draw(st.sampled_from([0, 1200, 3600])),
            "guaranteed_share": draw(st.sampled_from([0, 1])),
            "max_reservations_per_pool": draw(st.sampled_from([0, 1, 2])),
            "unallocated_grace": draw(st.sampled_from([0, 60])),
        },
        "pools": [{"name": "g", "kind": "gpu"}],
        "nodes": nodes,
        "teams": teams,
        "usage": usage,
        "requests": requests,
    }
    return only_placeable(data)


def _fields(decisions: Decisions) -> tuple[Any, ...]:
    return (
        decisions.admissions,
        decisions.preemptions,
        dict(decisions.reservations),
        decisions.order,
        dict(decisions.funded),
        decisions.released,
        dict(decisions.verdicts),
    )


def _decided_with_and_without_memo(scenario: Scenario) -> int:
    """Run the scenario; every cycle is decided with the memo and without, the two must
    agree, and the run goes on with the memo's decisions. How many cycles were checked."""
    checked: list[int] = []

    def both(view: ClusterView, now: float) -> Decisions:
        decisions = budget_policy(view, now, memo=True)
        assert _fields(decisions) == _fields(budget_policy(view, now, memo=False))
        checked.append(1)
        return decisions

    with mock.patch.object(scheduler_module, "decide", both):
        Simulation(scenario).run()
    assert checked or not scenario.requests
    return len(checked)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(same_kind_queues())
def test_the_memo_decides_as_judging_every_entry_does(scenario: Scenario) -> None:
    _decided_with_and_without_memo(scenario)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_memo_decides_as_judging_every_entry_does_on_mixed_queues(scenario: Scenario) -> None:
    _decided_with_and_without_memo(scenario)


SOURCE = scheduler_core.BUILD.startswith("source")
"""Compiled (scheduler_core/native.py), `judge_all` calls `judge` natively, so a
patched `judge` is never called."""


@pytest.mark.skipif(not SOURCE, reason="counts calls of the policy's `judge` (source only)")
def test_without_the_memo_every_entry_is_judged() -> None:
    """Ten equal requests of one team on a draining node, where none may start: with
    the memo the first is judged and the rest take its answer; without it each is."""
    data = {
        "name": "equal",
        "horizon": 100,
        "policy": {"name": "budget"},
        "pools": [{"name": "g", "kind": "gpu"}],
        "nodes": [{"name": "g0", "pool": "g", "gpus": 2, "state": "draining"}],
        "teams": [{"name": "a", "share": 0.5}],
        "requests": [
            {
                "id": f"r{i}",
                "user": "u",
                "team": "a",
                "submit": i,
                "pool": "g",
                "gpus": 2,
                "duration": 600,
            }
            for i in range(10)
        ],
    }
    core = scheduler(data)
    for request in parse_scenario(data).requests:
        core.submit(request)
    real = order_module.judge
    calls = {True: 0, False: 0}
    for memo in (True, False):

        def counting(*args: Any, memo: bool = memo) -> Any:
            calls[memo] += 1
            return real(*args)

        with mock.patch.object(order_module, "judge", counting):
            decisions = budget_policy(core.view(20.0), 20.0, memo=memo)
        assert len(decisions.order) == 10 and not decisions.admissions
    assert calls == {True: 1, False: 10}


def test_the_environment_turns_the_memo_off() -> None:
    """``BUDGETHUB_NO_MEMO=1`` is read once, at import: the policy's default."""
    code = "from scheduler_core.policy import MEMO; print(MEMO)"
    said = {}
    for value in ("1", "0", ""):
        env = dict(os.environ, **{NO_MEMO_ENV: value})
        run = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
        )
        said[value] = run.stdout.strip()
    assert said == {"1": "False", "0": "True", "": "True"}


# Two entries that differ only in a field of their kind, side by side in one turn: the
# policy's answers differ, so a kind that left the field out would hand the second the
# first's answer with the memo on. Random runs rarely reach these answers (a field
# that only counts with nodes held, or with a team slicing itself), so each is built.

NOW = 10 * HOUR


def _view_at_now(
    data: dict[str, Any], running: tuple[str, ...]
) -> tuple[ClusterView, dict[str, model.Request]]:
    """The cluster of ``data`` at ``NOW``: the ``running`` requests funded since 0 and
    protected for 8 h on n-0's GPUs in turn, the others waiting; and the requests."""
    parsed = parse_scenario(data)
    core = scheduler(parsed, clock=VirtualClock(NOW))
    requests = {r.id: r for r in parsed.requests}
    gpus = iter(core.nodes["n-0"].gpus)
    for request_id in running:
        request = requests[request_id]
        slices = tuple(
            model.Slice(next(gpus).uuid, model.SliceKind.WHOLE) for _ in range(request.gpus)
        )
        core.adopt(
            model.Allocation(
                request=request,
                grants=(model.NodeGrant("n-0", slices, request.cpus, 0.0),),
                start=0.0,
                funded=True,
                protected_until=8 * HOUR,
                charge_rate=float(request.gpus),
            )
        )
    for request in requests.values():
        if request.id not in running:
            core.submit(request)
    return dataclasses.replace(core.view(NOW), index=None), requests


def _answers_alike_with_and_without_memo(view: ClusterView) -> dict[str, tuple[bool, str, str]]:
    """Each entry's (funded, ground, placement), the memo on and off agreeing."""
    with_memo = budget_policy(view, NOW, memo=True)
    without = budget_policy(view, NOW, memo=False)
    assert _fields(with_memo) == _fields(without)
    return {r: (v.funded, v.ground, v.reason) for r, v in without.verdicts.items()}


def _only_differ_in(first: model.Request, second: model.Request, field: str) -> bool:
    """The two are alike but for ``field`` (and id, user and submit time, which no kind
    holds)."""
    same = {"id": second.id, "user": second.user, "submit": second.submit}
    return dataclasses.replace(first, **same, **{field: getattr(second, field)}) == second


def test_the_memo_tells_resumable_work_from_other_work_beside_held_nodes() -> None:
    """S3: b (no share of the pool) asks twice for one GPU beside the nodes held for
    a's starving job, first not resumable, then resumable: the first may not backfill
    the held node's free GPUs, the second does."""
    data = gpu_scenario(
        [
            gpu_request("busy", "a", 0, 2, "interactive", min_runtime=8 * HOUR),
            gpu_request("big", "a", 60, 4, "batch"),
            gpu_request("x", "b", NOW - 200, 1, "batch", resumable=False),
            gpu_request("y", "b", NOW - 100, 1, "batch", resumable=True),
        ],
        nodes=1,
        gpus=4,
        teams=[{"name": "a", "share": {"gpu": 1.0}}, {"name": "b", "share": {"gpu": 0.0}}],
    )
    view, requests = _view_at_now(data, ("busy",))
    assert _only_differ_in(requests["x"], requests["y"], "resumable")
    view = dataclasses.replace(view, reservations={"big": ("n-0",)})
    said = _answers_alike_with_and_without_memo(view)
    assert said["big"][2] == verdict.HOLDING
    assert said["x"] == (False, verdict.NO_SHARE, verdict.NO_ROOM)
    assert said["y"] == (False, verdict.NO_SHARE, verdict.BACKFILLED)


def test_the_memo_tells_batch_work_from_interactive_work_while_a_team_slices_itself() -> None:
    """S6: a's job larger than its share has waited past ``own_slice_after`` beside a's
    protected session, so a's batch work is held back this pass; a's interactive
    request of the same size right after it is funded and placed. The batch request,
    unfunded and unable to resume (dear to reclaim, R11), borrows after the teams'
    turns what the interactive one's victim left."""
    data = gpu_scenario(
        [
            gpu_request("busy", "a", 0, 1, "interactive", min_runtime=8 * HOUR),
            # It checkpoints: stopping it throws away less than R8 allows.
            gpu_request(
                "fill", "b", 0, 7, "interactive", min_runtime=8 * HOUR, checkpoint_every=600
            ),
            gpu_request("big", "a", 60, 8, "batch"),
            gpu_request("x", "a", NOW - 200, 1, "batch"),
            gpu_request("y", "a", NOW - 100, 1, "interactive"),
        ],
        nodes=1,
        gpus=8,
        guaranteed_share=1.0,
        own_slice_after=1200,
        starvation_bound=100 * HOUR,
    )
    view, requests = _view_at_now(data, ("busy", "fill"))
    assert _only_differ_in(requests["x"], requests["y"], "klass")
    said = _answers_alike_with_and_without_memo(view)
    assert said["x"][:2] == (False, verdict.TEAM_SLICING) and said["x"][2] == verdict.PLACED
    assert said["y"][:2] == (True, verdict.SHARE) and said["y"][2] in verdict.PLACED_REASONS
