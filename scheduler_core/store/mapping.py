"""Conversions between the rows of models.py and the frozen dataclasses of scheduler_core.model.

Rows are built detached, so that ``Session.merge`` can upsert a whole node (with
its GPUs and MIG instances) or team (with its shares) in one call.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from scheduler_core import model
from scheduler_core.store.models import (
    AllocationGrantRow,
    AllocationRow,
    BookedSliceRow,
    GpuRow,
    MigInstanceRow,
    NodeRow,
    PoolRow,
    RequestRow,
    TeamRow,
    TeamShareRow,
)
from scheduler_core.store.records import RequestState


def pool_row(pool: model.Pool) -> PoolRow:
    return PoolRow(name=pool.name, kind=pool.kind)


def pool_from_row(row: PoolRow) -> model.Pool:
    return model.Pool(name=row.name, kind=row.kind)


def team_row(team: model.Team) -> TeamRow:
    shares = [TeamShareRow(team=team.name, pool=pool, share=s) for pool, s in team.share.items()]
    return TeamRow(name=team.name, parent=team.parent, shares=shares)


def team_from_row(row: TeamRow) -> model.Team:
    share = MappingProxyType({s.pool: s.share for s in row.shares})
    return model.Team(name=row.name, share=share, parent=row.parent)


def node_row(node: model.Node) -> NodeRow:
    """A node row without ``engine_url``, so that merging it keeps the stored one."""
    gpus = [
        GpuRow(
            uuid=gpu.uuid,
            node=node.name,
            index=gpu.index,
            model=gpu.model,
            memory_mib=gpu.memory_mib,
            virtual=gpu.virtual,
            mig=[
                MigInstanceRow(uuid=mig.uuid, gpu_uuid=gpu.uuid, position=pos, profile=mig.profile)
                for pos, mig in enumerate(gpu.mig)
            ],
        )
        for gpu in node.gpus
    ]
    return NodeRow(
        name=node.name,
        pool=node.pool,
        cpus=node.cpus,
        memory_gib=node.memory_gib,
        labels=dict(node.labels),
        health=node.health,
        gpus=gpus,
    )


def node_from_row(row: NodeRow) -> model.Node:
    gpus = tuple(
        model.Gpu(
            uuid=gpu.uuid,
            index=gpu.index,
            model=gpu.model,
            memory_mib=gpu.memory_mib,
            mig=tuple(model.MigInstance(uuid=m.uuid, profile=m.profile) for m in gpu.mig),
            virtual=gpu.virtual,
        )
        for gpu in row.gpus
    )
    return model.Node(
        name=row.name,
        pool=row.pool,
        cpus=row.cpus,
        memory_gib=row.memory_gib,
        gpus=gpus,
        labels=model.frozen_labels(row.labels),
        health=row.health,
    )


def node_inventory(node: model.Node) -> dict[str, Any]:
    """A node's inventory as plain JSON (the event log's ``node-inventory``): its pool,
    CPUs, memory, labels, and each GPU with its MIG layout; not its health."""
    return {
        "pool": node.pool,
        "cpus": node.cpus,
        "memory_gib": node.memory_gib,
        "labels": dict(node.labels),
        "gpus": [
            {
                "uuid": gpu.uuid,
                "index": gpu.index,
                "model": gpu.model,
                "memory_mib": gpu.memory_mib,
                "virtual": gpu.virtual,
                "mig": [[m.uuid, m.profile] for m in gpu.mig],
            }
            for gpu in node.gpus
        ],
    }


def node_from_inventory(
    name: str, inventory: dict[str, Any], health: model.Health = model.Health.READY
) -> model.Node:
    """The node a ``node_inventory`` describes."""
    gpus = tuple(
        model.Gpu(
            uuid=str(gpu["uuid"]),
            index=int(gpu["index"]),
            model=str(gpu["model"]),
            memory_mib=int(gpu["memory_mib"]),
            mig=tuple(model.MigInstance(uuid=str(u), profile=str(p)) for u, p in gpu["mig"]),
            virtual=bool(gpu["virtual"]),
        )
        for gpu in inventory["gpus"]
    )
    return model.Node(
        name=name,
        pool=str(inventory["pool"]),
        cpus=float(inventory["cpus"]),
        memory_gib=float(inventory["memory_gib"]),
        gpus=gpus,
        labels=model.frozen_labels(inventory["labels"]),
        health=health,
    )


def request_spec(request: model.Request) -> dict[str, Any]:
    """The request as plain JSON, exactly as submitted."""
    return {
        "id": request.id,
        "user": request.user,
        "team": request.team,
        "pool": request.pool,
        "submit": request.submit,
        "gpus": request.gpus,
        "nodes": request.nodes,
        "gpu_milli": request.gpu_milli,
        "mig": request.mig,
        "cpus": request.cpus,
        "memory_gib": request.memory_gib,
        "labels": dict(request.labels),
        "min_runtime": request.min_runtime,
        "resumable": request.resumable,
        "priority": request.priority,
        "class": request.klass.value,
        "profile": request.profile,
        # What a preemption of it costs (the policy's price, and what a replay keeps).
        "checkpoint_every": request.checkpoint_every,
        "restart_cost": request.restart_cost,
    }


def request_row(request: model.Request, state: RequestState) -> RequestRow:
    return RequestRow(
        id=request.id,
        user_name=request.user,
        team=request.team,
        pool=request.pool,
        submit=request.submit,
        gpus=request.gpus,
        nodes=request.nodes,
        gpu_milli=request.gpu_milli,
        mig=request.mig,
        cpus=request.cpus,
        memory_gib=request.memory_gib,
        labels=dict(request.labels),
        min_runtime=request.min_runtime,
        resumable=request.resumable,
        priority=request.priority,
        klass=request.klass,
        profile=request.profile,
        state=state,
        reason=None,
        spec=request_spec(request),
    )


def request_from_row(row: RequestRow, spec: Mapping[str, Any] | None = None) -> model.Request:
    """The request as submitted; its checkpoint interval and restart cost come from its
    spec (`request_spec`; ``spec``: those two, where the caller read only them), so a
    Hub started again prices its preemption as before."""
    if spec is None:
        spec = row.spec or {}
    return model.Request(
        checkpoint_every=float(spec.get("checkpoint_every") or 0.0),
        restart_cost=float(spec.get("restart_cost") or 0.0),
        id=row.id,
        user=row.user_name,
        team=row.team,
        pool=row.pool,
        submit=row.submit,
        gpus=row.gpus,
        nodes=row.nodes,
        gpu_milli=row.gpu_milli,
        mig=row.mig,
        cpus=row.cpus,
        memory_gib=row.memory_gib,
        labels=model.frozen_labels(row.labels),
        min_runtime=row.min_runtime,
        resumable=row.resumable,
        priority=row.priority,
        klass=row.klass,
        profile=row.profile,
    )


def allocation_row(allocation: model.Allocation) -> AllocationRow:
    """The allocation with its grants and one booked-slice row per slice."""
    grants = [
        AllocationGrantRow(position=pos, node=g.node, cpus=g.cpus, memory_gib=g.memory_gib)
        for pos, g in enumerate(allocation.grants)
    ]
    slices = [
        BookedSliceRow(
            position=pos,
            node=node,
            gpu_uuid=s.gpu_uuid,
            kind=s.kind,
            milli=s.milli,
            mig_uuid=s.mig_uuid,
            mig_profile=s.mig_profile,
            device_id=s.device_id,
        )
        for pos, (node, s) in enumerate(node_slices(allocation))
    ]
    return AllocationRow(
        request_id=allocation.request.id,
        start_time=allocation.start,
        end_time=None,
        funded=allocation.funded,
        protected_until=allocation.protected_until,
        charge_rate=allocation.charge_rate,
        grants=grants,
        slices=slices,
    )


def node_slices(allocation: model.Allocation) -> list[tuple[str, model.Slice]]:
    """Every slice of an allocation with the node it is on, in grant order."""
    return [(grant.node, s) for grant in allocation.grants for s in grant.slices]


def slice_from_row(row: BookedSliceRow) -> model.Slice:
    return model.Slice(
        gpu_uuid=row.gpu_uuid,
        kind=row.kind,
        milli=row.milli,
        mig_uuid=row.mig_uuid,
        mig_profile=row.mig_profile,
    )


def allocation_from_row(row: AllocationRow) -> model.Allocation:
    """The allocation as the scheduler knows it; its slices must still be booked."""
    slices_by_node: dict[str, list[model.Slice]] = {}
    for slice_row in row.slices:
        slices_by_node.setdefault(slice_row.node, []).append(slice_from_row(slice_row))
    grants = tuple(
        model.NodeGrant(
            node=g.node,
            slices=tuple(slices_by_node.get(g.node, ())),
            cpus=g.cpus,
            memory_gib=g.memory_gib,
        )
        for g in row.grants
    )
    return model.Allocation(
        request=request_from_row(row.request),
        grants=grants,
        start=row.start_time,
        funded=row.funded,
        protected_until=row.protected_until,
        charge_rate=row.charge_rate,
    )
