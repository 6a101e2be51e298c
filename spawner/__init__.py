"""budgethub's JupyterHub side: BudgetSpawner, its embedded scheduler and node runtimes.

``hub/`` is what the Hub sees, ``runtime/`` how a session runs, ``readmodel/`` what the
pages and the budget service show; the modules here, below all three, are shared.
``BudgetSpawner`` (the ``budget`` entry point) is imported when first asked for, so
that importing any other part (the budget service, its own process, imports only the
read model) does not import the Hub's side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spawner.hub.spawner import BudgetSpawner

__all__ = ["BudgetSpawner"]


def __getattr__(name: str) -> Any:
    if name == "BudgetSpawner":
        from spawner.hub.spawner import BudgetSpawner

        return BudgetSpawner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
