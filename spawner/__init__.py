"""budgethub's JupyterHub side: BudgetSpawner, its embedded scheduler and node backends."""

from spawner.hub.spawner import BudgetSpawner

__all__ = ["BudgetSpawner"]
