"""The JupyterHub side of budgethub (BudgetSpawner, node backends, the Hub extension).

Not built yet: see the BudgetSpawner issue. The package exists so that the
distribution's layout is the one DESIGN.md describes.
"""
