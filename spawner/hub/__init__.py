"""What the Hub sees: the spawner, the scheduler's facade, the pages and routes.

``BudgetSpawner`` (``spawner.py``) is JupyterHub's spawner class; ``BudgetScheduler``
(``embedded.py``) is the facade it talks to, which owns the scheduler core, the store
and the session actuator. The Hub's own pages and routes (``pages.py``,
``mysessions.py``, ``queuecontrol.py``, ``snapshotapi.py``), the configuration's traits
(``config.py``), restart recovery and the budget service's wiring live here too.

Imports run one way: this package uses ``spawner.runtime`` (how a session runs) and
``spawner.readmodel`` (what the pages show); neither of those imports this one.
"""
