"""Where each waiting request stands: the order the policy's next cycle looks at them in.

It is the policy's own order, from a dry run of its next cycle (`forecast.dry_run`):
an order worked out here by a loop of its own (teams charged as if every request
fitted, no debug lane, no day slices) showed positions admission did not follow
(issue 40). Pure: no I/O.
"""

from __future__ import annotations

from scheduler_core.forecast import dry_run
from scheduler_core.view import ClusterView


def admission_order(view: ClusterView, now: float) -> list[str]:
    """Every waiting request the next cycle looks at, pool by pool, in the order it
    looks at them (`Decisions.order` of `decide` run dry on ``view``)."""
    return list(dry_run(view, now).order)
