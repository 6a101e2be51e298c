"""budgethub's JupyterHub side: BudgetSpawner, its embedded scheduler and node backends."""

from spawner.spawner import BudgetSpawner

__all__ = ["BudgetSpawner"]
