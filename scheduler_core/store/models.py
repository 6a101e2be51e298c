"""The store's tables as SQLAlchemy 2.0 typed models.

The schema in production always comes from the Alembic migrations; these models
must match them (a test compares the two). Requests, usage and events name teams
and pools by plain strings, not foreign keys, because history must outlive a
team or pool being removed from the configuration.
"""

from __future__ import annotations

import enum
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from scheduler_core.model import Health, PoolKind, RequestClass, SliceKind
from scheduler_core.store.records import RequestState

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ACTIVE_DEVICE_WHERE = text("kind <> 'fraction'")
"""Booked slices that own their device outright (whole GPUs and MIG instances)."""

ACTIVE_ALLOCATION_WHERE = text("end_time IS NULL")
"""Allocations that have not ended."""


def _enum(python_enum: type[enum.Enum], name: str) -> Enum:
    """A portable enum column: the member values in a VARCHAR with a CHECK constraint."""
    return Enum(
        python_enum,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=32,
        values_callable=lambda members: [member.value for member in members],
    )


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        float: Double(),
        str: String(255),
        dict[str, str]: JSON(),
        dict[str, Any]: JSON(),
        list[str]: JSON(),
    }


class PoolRow(Base):
    __tablename__ = "pools"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[PoolKind] = mapped_column(_enum(PoolKind, "pool_kind"))


class TeamRow(Base):
    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    parent: Mapped[str | None] = mapped_column(String(128), ForeignKey("teams.name"))
    shares: Mapped[list[TeamShareRow]] = relationship(
        cascade="all, delete-orphan", order_by="TeamShareRow.pool"
    )


class TeamShareRow(Base):
    __tablename__ = "team_shares"
    __table_args__ = (CheckConstraint("share >= 0 AND share <= 1", name="share_range"),)

    team: Mapped[str] = mapped_column(
        String(128), ForeignKey("teams.name", ondelete="CASCADE"), primary_key=True
    )
    pool: Mapped[str] = mapped_column(String(64), ForeignKey("pools.name"), primary_key=True)
    share: Mapped[float]


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    pool: Mapped[str] = mapped_column(String(64), ForeignKey("pools.name"))
    cpus: Mapped[float]
    memory_gib: Mapped[float]
    labels: Mapped[dict[str, str]]
    health: Mapped[Health] = mapped_column(_enum(Health, "health"))
    engine_url: Mapped[str | None] = mapped_column(Text)
    gpus: Mapped[list[GpuRow]] = relationship(cascade="all, delete-orphan", order_by="GpuRow.index")


class GpuRow(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node", "index"),)

    uuid: Mapped[str] = mapped_column(String(128), primary_key=True)
    node: Mapped[str] = mapped_column(
        String(128), ForeignKey("nodes.name", ondelete="CASCADE"), index=True
    )
    index: Mapped[int]
    model: Mapped[str] = mapped_column(String(128))
    memory_mib: Mapped[int]
    virtual: Mapped[bool]
    mig: Mapped[list[MigInstanceRow]] = relationship(
        cascade="all, delete-orphan", order_by="MigInstanceRow.position"
    )


class MigInstanceRow(Base):
    __tablename__ = "mig_instances"

    uuid: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(
        String(128), ForeignKey("gpus.uuid", ondelete="CASCADE"), index=True
    )
    position: Mapped[int]
    profile: Mapped[str] = mapped_column(String(32))


class RequestRow(Base):
    """Every field of `model.Request`, its queue state, and the request as submitted."""

    __tablename__ = "requests"
    __table_args__ = (Index(None, "state", "submit"),)

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(128))
    team: Mapped[str] = mapped_column(String(128))
    pool: Mapped[str] = mapped_column(String(64))
    submit: Mapped[float]
    gpus: Mapped[int]
    nodes: Mapped[int]
    gpu_milli: Mapped[int]
    mig: Mapped[str | None] = mapped_column(String(32))
    cpus: Mapped[float]
    memory_gib: Mapped[float]
    labels: Mapped[dict[str, str]]
    min_runtime: Mapped[float]
    resumable: Mapped[bool]
    priority: Mapped[int]
    klass: Mapped[RequestClass] = mapped_column(_enum(RequestClass, "request_class"))
    profile: Mapped[str | None]
    state: Mapped[RequestState] = mapped_column(_enum(RequestState, "request_state"))
    reason: Mapped[str | None] = mapped_column(Text)
    spec: Mapped[dict[str, Any]]
    # What the Hub forecast at submit (migration 0004; `records.RequestForecast`): kept
    # as said then, never recomputed. NULL where none was kept.
    forecast_time: Mapped[float | None]
    forecast_start: Mapped[float | None]
    forecast_starts_now: Mapped[bool | None]
    forecast_funded: Mapped[bool | None]
    forecast_protected_s: Mapped[float | None]
    forecast_position: Mapped[int | None]
    forecast_waiting: Mapped[int | None]


class AllocationRow(Base):
    """A request placed on nodes; active while ``end_time`` is NULL."""

    __tablename__ = "allocations"
    __table_args__ = (
        # A request holds at most one active allocation.
        Index(
            "uq_allocations_active_request",
            "request_id",
            unique=True,
            postgresql_where=ACTIVE_ALLOCATION_WHERE,
            sqlite_where=ACTIVE_ALLOCATION_WHERE,
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(128), ForeignKey("requests.id"), index=True)
    start_time: Mapped[float]
    end_time: Mapped[float | None]
    funded: Mapped[bool]
    protected_until: Mapped[float]
    charge_rate: Mapped[float]

    request: Mapped[RequestRow] = relationship()
    grants: Mapped[list[AllocationGrantRow]] = relationship(
        cascade="all, delete-orphan", order_by="AllocationGrantRow.position"
    )
    slices: Mapped[list[BookedSliceRow]] = relationship(
        cascade="all, delete-orphan", order_by="BookedSliceRow.position"
    )


class AllocationGrantRow(Base):
    """The part of an allocation on one node (kept after the allocation ends)."""

    __tablename__ = "allocation_grants"

    allocation_id: Mapped[int] = mapped_column(
        ForeignKey("allocations.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    cpus: Mapped[float]
    memory_gib: Mapped[float]


class BookedSliceRow(Base):
    """One slice held by an active allocation; the row is deleted when it is released.

    Whole GPUs and MIG instances are unique per device by a partial index; fractions
    of one GPU are checked under a lock of the GPU's row (see store.py).
    """

    __tablename__ = "booked_slices"
    __table_args__ = (
        Index(
            "uq_booked_slices_device",
            "device_id",
            unique=True,
            postgresql_where=ACTIVE_DEVICE_WHERE,
            sqlite_where=ACTIVE_DEVICE_WHERE,
        ),
        CheckConstraint("milli > 0 AND milli <= 1000", name="milli_range"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    allocation_id: Mapped[int] = mapped_column(
        ForeignKey("allocations.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int]
    node: Mapped[str] = mapped_column(String(128))
    gpu_uuid: Mapped[str] = mapped_column(String(128), ForeignKey("gpus.uuid"), index=True)
    kind: Mapped[SliceKind] = mapped_column(_enum(SliceKind, "slice_kind"))
    milli: Mapped[int]
    mig_uuid: Mapped[str | None] = mapped_column(String(128), ForeignKey("mig_instances.uuid"))
    mig_profile: Mapped[str | None] = mapped_column(String(32))
    device_id: Mapped[str] = mapped_column(String(128))


class UsageRow(Base):
    """Budget units charged to a team in a pool over ``[start_time, end_time]``."""

    __tablename__ = "usage_records"
    __table_args__ = (Index(None, "team", "pool", "end_time"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    team: Mapped[str] = mapped_column(String(128))
    pool: Mapped[str] = mapped_column(String(64))
    start_time: Mapped[float]
    end_time: Mapped[float]
    units: Mapped[float]
    allocation_id: Mapped[int | None] = mapped_column(
        ForeignKey("allocations.id", ondelete="SET NULL")
    )


class SnapshotRow(Base):
    """A preempted session's snapshot: ``key`` names its directory in the snapshot store
    (and is what a restore asks for); ``user_name`` and ``server`` say whose it is."""

    __tablename__ = "snapshots"
    __table_args__ = (Index(None, "user_name", "server"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    request_id: Mapped[str] = mapped_column(String(128), ForeignKey("requests.id"), index=True)
    allocation_id: Mapped[int | None] = mapped_column(ForeignKey("allocations.id"))
    user_name: Mapped[str] = mapped_column(String(128))
    server: Mapped[str]
    node: Mapped[str | None] = mapped_column(String(128))
    created: Mapped[float]
    image: Mapped[str] = mapped_column(Text)
    saved: Mapped[list[str]]
    unsaved: Mapped[dict[str, str]]
    sizes: Mapped[dict[str, Any]]
    kernels: Mapped[list[Any]] = mapped_column(JSON())
    report: Mapped[dict[str, Any]]


class EventRow(Base):
    """One entry of the append-only event log."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(index=True)
    kind: Mapped[str] = mapped_column(String(64), index=True)
    payload: Mapped[dict[str, Any]]


class AdminSettingRow(Base):
    """What an admin changed through the budget service (migration 0003), by key.

    ``teams`` (the whole hierarchy with shares), ``lookback``, ``max_min_runtime`` and
    ``drained`` (node names); at start the embedded scheduler lets these win over the
    configuration file, and it picks up a change in its next cycle.
    """

    __tablename__ = "admin_settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON(), nullable=False)
    changed: Mapped[float]
    changed_by: Mapped[str] = mapped_column(String(128))


class AuditRow(Base):
    """One admin change: who, when, what, the old and the new value."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(128))
    target: Mapped[str] = mapped_column(String(255))
    old: Mapped[Any] = mapped_column(JSON(), nullable=True)
    new: Mapped[Any] = mapped_column(JSON(), nullable=True)


class SchedulerStatusRow(Base):
    """What the embedded scheduler last reported of itself: cycles and their durations
    (histogram buckets), its effective settings, and the admin change it applied."""

    __tablename__ = "scheduler_status"

    hub: Mapped[str] = mapped_column(String(128), primary_key=True)
    updated: Mapped[float]
    cycles: Mapped[int]
    cycle_seconds_sum: Mapped[float]
    cycle_buckets: Mapped[list[Any]] = mapped_column(JSON())
    settings: Mapped[dict[str, Any]]
    applied_audit_id: Mapped[int]
