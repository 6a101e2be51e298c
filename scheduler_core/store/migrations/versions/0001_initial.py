"""The initial store schema: inventory, teams, requests, allocations, usage, snapshots, events.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(length=128)
POOL = sa.String(length=64)


def _enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=32)


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("name", POOL, nullable=False),
        sa.Column("kind", _enum("pool_kind", "gpu", "cpu"), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pools")),
    )
    op.create_table(
        "teams",
        sa.Column("name", NAME, nullable=False),
        sa.Column("parent", NAME, nullable=True),
        sa.ForeignKeyConstraint(["parent"], ["teams.name"], name=op.f("fk_teams_parent_teams")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_teams")),
    )
    op.create_table(
        "team_shares",
        sa.Column("team", NAME, nullable=False),
        sa.Column("pool", POOL, nullable=False),
        sa.Column("share", sa.Double(), nullable=False),
        sa.CheckConstraint("share >= 0 AND share <= 1", name=op.f("ck_team_shares_share_range")),
        sa.ForeignKeyConstraint(["pool"], ["pools.name"], name=op.f("fk_team_shares_pool_pools")),
        sa.ForeignKeyConstraint(
            ["team"], ["teams.name"], name=op.f("fk_team_shares_team_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("team", "pool", name=op.f("pk_team_shares")),
    )
    op.create_table(
        "nodes",
        sa.Column("name", NAME, nullable=False),
        sa.Column("pool", POOL, nullable=False),
        sa.Column("cpus", sa.Double(), nullable=False),
        sa.Column("memory_gib", sa.Double(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("health", _enum("health", "ready", "draining", "down"), nullable=False),
        sa.Column("engine_url", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["pool"], ["pools.name"], name=op.f("fk_nodes_pool_pools")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )
    op.create_table(
        "gpus",
        sa.Column("uuid", NAME, nullable=False),
        sa.Column("node", NAME, nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("virtual", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node"], ["nodes.name"], name=op.f("fk_gpus_node_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("uuid", name=op.f("pk_gpus")),
        sa.UniqueConstraint("node", "index", name=op.f("uq_gpus_node_index")),
    )
    op.create_index(op.f("ix_gpus_node"), "gpus", ["node"])
    op.create_table(
        "mig_instances",
        sa.Column("uuid", NAME, nullable=False),
        sa.Column("gpu_uuid", NAME, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("profile", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(
            ["gpu_uuid"],
            ["gpus.uuid"],
            name=op.f("fk_mig_instances_gpu_uuid_gpus"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uuid", name=op.f("pk_mig_instances")),
    )
    op.create_index(op.f("ix_mig_instances_gpu_uuid"), "mig_instances", ["gpu_uuid"])
    op.create_table(
        "requests",
        sa.Column("id", NAME, nullable=False),
        sa.Column("user_name", NAME, nullable=False),
        sa.Column("team", NAME, nullable=False),
        sa.Column("pool", POOL, nullable=False),
        sa.Column("submit", sa.Double(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("mig", sa.String(length=32), nullable=True),
        sa.Column("cpus", sa.Double(), nullable=False),
        sa.Column("memory_gib", sa.Double(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("min_runtime", sa.Double(), nullable=False),
        sa.Column("resumable", sa.Boolean(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column(
            "klass",
            _enum("request_class", "debug", "interactive", "batch", "dataprep"),
            nullable=False,
        ),
        sa.Column("profile", sa.String(length=255), nullable=True),
        sa.Column(
            "state",
            _enum(
                "request_state",
                "pending",
                "admitted",
                "running",
                "finished",
                "cancelled",
                "preempted-requeued",
            ),
            nullable=False,
        ),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
    )
    op.create_index(op.f("ix_requests_state_submit"), "requests", ["state", "submit"])
    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("request_id", NAME, nullable=False),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("funded", sa.Boolean(), nullable=False),
        sa.Column("protected_until", sa.Double(), nullable=False),
        sa.Column("charge_rate", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"], ["requests.id"], name=op.f("fk_allocations_request_id_requests")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocations")),
    )
    op.create_index(op.f("ix_allocations_request_id"), "allocations", ["request_id"])
    op.create_index(
        "uq_allocations_active_request",
        "allocations",
        ["request_id"],
        unique=True,
        postgresql_where=sa.text("end_time IS NULL"),
        sqlite_where=sa.text("end_time IS NULL"),
    )
    op.create_table(
        "allocation_grants",
        sa.Column("allocation_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("node", NAME, nullable=False),
        sa.Column("cpus", sa.Double(), nullable=False),
        sa.Column("memory_gib", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["allocation_id"],
            ["allocations.id"],
            name=op.f("fk_allocation_grants_allocation_id_allocations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("allocation_id", "position", name=op.f("pk_allocation_grants")),
    )
    op.create_table(
        "booked_slices",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("allocation_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("node", NAME, nullable=False),
        sa.Column("gpu_uuid", NAME, nullable=False),
        sa.Column("kind", _enum("slice_kind", "whole", "mig", "fraction"), nullable=False),
        sa.Column("milli", sa.Integer(), nullable=False),
        sa.Column("mig_uuid", NAME, nullable=True),
        sa.Column("mig_profile", sa.String(length=32), nullable=True),
        sa.Column("device_id", NAME, nullable=False),
        sa.CheckConstraint(
            "milli > 0 AND milli <= 1000", name=op.f("ck_booked_slices_milli_range")
        ),
        sa.ForeignKeyConstraint(
            ["allocation_id"],
            ["allocations.id"],
            name=op.f("fk_booked_slices_allocation_id_allocations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["gpu_uuid"], ["gpus.uuid"], name=op.f("fk_booked_slices_gpu_uuid_gpus")
        ),
        sa.ForeignKeyConstraint(
            ["mig_uuid"],
            ["mig_instances.uuid"],
            name=op.f("fk_booked_slices_mig_uuid_mig_instances"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_booked_slices")),
    )
    op.create_index(op.f("ix_booked_slices_allocation_id"), "booked_slices", ["allocation_id"])
    op.create_index(op.f("ix_booked_slices_gpu_uuid"), "booked_slices", ["gpu_uuid"])
    # No device is booked twice: whole GPUs and MIG instances own their device_id.
    # Fractions share their GPU's id and are checked under the GPU row's lock.
    op.create_index(
        "uq_booked_slices_device",
        "booked_slices",
        ["device_id"],
        unique=True,
        postgresql_where=sa.text("kind <> 'fraction'"),
        sqlite_where=sa.text("kind <> 'fraction'"),
    )
    op.create_table(
        "usage_records",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("team", NAME, nullable=False),
        sa.Column("pool", POOL, nullable=False),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("end_time", sa.Double(), nullable=False),
        sa.Column("units", sa.Double(), nullable=False),
        sa.Column("allocation_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["allocation_id"],
            ["allocations.id"],
            name=op.f("fk_usage_records_allocation_id_allocations"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
    )
    op.create_index(
        op.f("ix_usage_records_team_pool_end_time"), "usage_records", ["team", "pool", "end_time"]
    )
    op.create_table(
        "snapshots",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("request_id", NAME, nullable=False),
        sa.Column("allocation_id", sa.Integer(), nullable=True),
        sa.Column("created", sa.Double(), nullable=False),
        sa.Column("image", sa.Text(), nullable=False),
        sa.Column("saved", sa.JSON(), nullable=False),
        sa.Column("unsaved", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["allocation_id"],
            ["allocations.id"],
            name=op.f("fk_snapshots_allocation_id_allocations"),
        ),
        sa.ForeignKeyConstraint(
            ["request_id"], ["requests.id"], name=op.f("fk_snapshots_request_id_requests")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_snapshots")),
    )
    op.create_index(op.f("ix_snapshots_request_id"), "snapshots", ["request_id"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_kind"), "events", ["kind"])
    op.create_index(op.f("ix_events_time"), "events", ["time"])


def downgrade() -> None:
    for table in (
        "events",
        "snapshots",
        "usage_records",
        "booked_slices",
        "allocation_grants",
        "allocations",
        "requests",
        "mig_instances",
        "gpus",
        "nodes",
        "team_shares",
        "teams",
        "pools",
    ):
        op.drop_table(table)
