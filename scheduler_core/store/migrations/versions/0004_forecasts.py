"""Each request's forecast at submit, kept with the request (issue 51).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07

What the Hub told the user when the request was submitted: the policy's dry run
(funded, protected for how long, starts now, its place) and its estimated start (the
scheduler run forward). Written once, with the request, and never recomputed, so that
`budgethub replay` can set it against what happened. NULL on requests stored before
this migration, and ``forecast_start`` NULL where the forward run gave no estimate.
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS: tuple[tuple[str, sa.types.TypeEngine[Any]], ...] = (
    ("forecast_time", sa.Double()),
    ("forecast_start", sa.Double()),
    ("forecast_starts_now", sa.Boolean()),
    ("forecast_funded", sa.Boolean()),
    ("forecast_protected_s", sa.Double()),
    ("forecast_position", sa.Integer()),
    ("forecast_waiting", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    # batch: SQLite drops a column by copying the table (Alembic's move and copy).
    with op.batch_alter_table("requests") as batch:
        for name, _kind in reversed(COLUMNS):
            batch.drop_column(name)
