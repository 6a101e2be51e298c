"""Builders of inventories and allocations for the store tests, and the two-writer race.

The race worker lives here, in an importable module, because processes started
with 'spawn' import their target by name.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Sequence
from typing import Any

from harness import builders
from scheduler_core import model
from scheduler_core.store import SliceConflict, Store

GPU_POOL = model.Pool("h100", model.PoolKind.GPU)
CPU_POOL = model.Pool("cpu", model.PoolKind.CPU)


def gpu_node(name: str, gpus: int = 8, mig: Sequence[str] = (), **fields: Any) -> model.Node:
    """A node of the h100 pool (`builders.node`: 96 CPUs, 1 TiB, H100s); GPU 0 is cut
    into ``mig`` instances when given."""
    values: dict[str, Any] = {"cpus": 96.0, "memory_gib": 1024.0} | fields
    return builders.node(
        name,
        pool=GPU_POOL.name,
        gpus=gpus,
        mig=mig,
        gpu_model="H100",
        memory_mib=81559,
        **values,
    )


def request(
    request_id: str, team: str = "olmo", submit: float = 0.0, **fields: Any
) -> model.Request:
    return model.Request(
        id=request_id, user="ann", team=team, pool=GPU_POOL.name, submit=submit, **fields
    )


def whole(gpu: model.Gpu) -> model.Slice:
    return model.Slice(gpu.uuid, model.SliceKind.WHOLE)


def fraction(gpu: model.Gpu, milli: int) -> model.Slice:
    return model.Slice(gpu.uuid, model.SliceKind.FRACTION, milli=milli)


def mig(gpu: model.Gpu, position: int) -> model.Slice:
    instance = gpu.mig[position]
    return model.Slice(
        gpu.uuid,
        model.SliceKind.MIG,
        milli=model.MILLI,
        mig_uuid=instance.uuid,
        mig_profile=instance.profile,
    )


def allocation(
    request_id: str,
    *grants: tuple[model.Node, Sequence[model.Slice]],
    start: float = 0.0,
    funded: bool = True,
    charge_rate: float = 1.0,
    team: str = "olmo",
) -> model.Allocation:
    """An allocation of a fresh request holding ``slices`` on each given node."""
    return model.Allocation(
        request=request(request_id, team=team, submit=start),
        grants=tuple(
            model.NodeGrant(node.name, tuple(slices), cpus=4.0, memory_gib=32.0)
            for node, slices in grants
        ),
        start=start,
        funded=funded,
        protected_until=start + 600.0,
        charge_rate=charge_rate,
    )


# The two-writer race.

RACE_NODES = 4
RACE_GPUS = 8
FRACTIONS = (400, 300)
"""Each writer asks for these milli on every GPU: 1400 from both cannot all fit."""


def race_nodes(round_number: int) -> list[model.Node]:
    """A fresh group of nodes per round, so that rounds never share a GPU."""
    return [gpu_node(f"race{round_number}-n{index}", gpus=RACE_GPUS) for index in range(RACE_NODES)]


def race_plan(worker: int, round_number: int) -> list[model.Allocation]:
    """Every whole GPU, two fractions of every GPU and whole pairs, in a shuffled order."""
    prefix = f"w{worker}-r{round_number}"
    plan: list[model.Allocation] = []
    for node in race_nodes(round_number):
        for gpu in node.gpus:
            plan.append(allocation(f"{prefix}-whole-{gpu.uuid}", (node, [whole(gpu)])))
            for milli in FRACTIONS:
                plan.append(
                    allocation(f"{prefix}-f{milli}-{gpu.uuid}", (node, [fraction(gpu, milli)]))
                )
        for first, second in zip(node.gpus[::2], node.gpus[1::2], strict=True):
            plan.append(
                allocation(f"{prefix}-pair-{first.uuid}", (node, [whole(first), whole(second)]))
            )
    random.Random(f"{worker}/{round_number}").shuffle(plan)
    return plan


def race_worker(url: str, worker: int, rounds: int, barrier: Any, stop: Any, out: Any) -> None:
    """Book every allocation of the plan once per round; report what was won and lost.

    Puts ``(worker, round, won, lost, error)`` on ``out`` after each round; ``error``
    is a traceback when anything but SliceConflict went wrong (then it stops).
    """
    store = Store.create(url, migrate_schema=False)
    try:
        for round_number in range(rounds):
            barrier.wait(timeout=120)
            if stop.is_set():
                return
            won: list[str] = []
            lost: list[str] = []
            error = None
            try:
                for planned in race_plan(worker, round_number):
                    try:
                        store.book(planned)
                    except SliceConflict:
                        lost.append(planned.id)
                    else:
                        won.append(planned.id)
            except Exception:
                error = traceback.format_exc()
            out.put((worker, round_number, won, lost, error))
            if error is not None:
                return
    finally:
        store.close()
