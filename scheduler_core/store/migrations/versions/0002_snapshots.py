"""Snapshots of preempted sessions: whose they are, where they were taken, what they hold.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Existing rows (none were written outside tests before this revision) get their user
from their request, an empty server name and a key ``legacy-{id}``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(length=128)


def upgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("key", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("user_name", NAME, nullable=True))
        batch.add_column(sa.Column("server", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("node", NAME, nullable=True))
        batch.add_column(sa.Column("sizes", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("kernels", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("report", sa.JSON(), nullable=True))
    op.execute(
        "UPDATE snapshots SET key = 'legacy-' || CAST(id AS VARCHAR(20)), "
        "user_name = (SELECT requests.user_name FROM requests "
        "WHERE requests.id = snapshots.request_id), "
        "server = '', sizes = '{}', kernels = '[]', report = '{}'"
    )
    with op.batch_alter_table("snapshots") as batch:
        for column, kind in (
            ("key", sa.String(length=64)),
            ("user_name", NAME),
            ("server", sa.String(length=255)),
            ("sizes", sa.JSON()),
            ("kernels", sa.JSON()),
            ("report", sa.JSON()),
        ):
            batch.alter_column(column, existing_type=kind, nullable=False)
        batch.create_unique_constraint(batch.f("uq_snapshots_key"), ["key"])
        batch.create_index(batch.f("ix_snapshots_user_name_server"), ["user_name", "server"])


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_index(batch.f("ix_snapshots_user_name_server"))
        batch.drop_constraint(batch.f("uq_snapshots_key"), type_="unique")
        for column in ("report", "kernels", "sizes", "node", "server", "user_name", "key"):
            batch.drop_column(column)
