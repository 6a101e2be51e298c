"""Baseline policies the budget policy is measured against (`budgethub compare`).

Importing this package registers ``legacy``, ``fairshare``, ``quota`` and
``fifo`` in `scheduler_core.registry.POLICIES`; each shares the simulator,
placement (capacity.py), the rules of rules.py (node health, funding) and the
metrics with the budget policy.
"""

from scheduler_core.baselines import fairshare, fifo, legacy, quota

BASELINES = ("legacy", "fairshare", "quota", "fifo")

__all__ = ["BASELINES", "fairshare", "fifo", "legacy", "quota"]
