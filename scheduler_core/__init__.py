"""budgethub's scheduler core: the pure budget policy, its simulator and its store.

Nothing in this package imports jupyterhub, tornado, docker or traitlets; the
policy modules import no I/O at all. The live scheduler (spawner package) and
the simulator drive the same `decide` function.
"""

__version__ = "0.1.0"

from scheduler_core import baselines as baselines  # registers the baseline policies
from scheduler_core import policy as policy  # registers the budget policy
