"""What admins change through the budget service, its audit log, and the scheduler's status.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

``admin_settings`` holds the allocations and settings an admin changed (they win over
the configuration file at start); ``audit_log`` every change (who, when, old, new);
``scheduler_status`` what the embedded scheduler reports of its cycles for /metrics.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(length=128)


def upgrade() -> None:
    op.create_table(
        "admin_settings",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("changed", sa.Double(), nullable=False),
        sa.Column("changed_by", NAME, nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_admin_settings")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("actor", NAME, nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("old", sa.JSON(), nullable=True),
        sa.Column("new", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_time"), "audit_log", ["time"])
    op.create_table(
        "scheduler_status",
        sa.Column("hub", NAME, nullable=False),
        sa.Column("updated", sa.Double(), nullable=False),
        sa.Column("cycles", sa.Integer(), nullable=False),
        sa.Column("cycle_seconds_sum", sa.Double(), nullable=False),
        sa.Column("cycle_buckets", sa.JSON(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("applied_audit_id", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("hub", name=op.f("pk_scheduler_status")),
    )


def downgrade() -> None:
    op.drop_table("scheduler_status")
    op.drop_index(op.f("ix_audit_log_time"), table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("admin_settings")
