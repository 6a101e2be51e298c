"""budgethub's scheduler core: the pure budget policy, its simulator and its store.

Nothing in this package imports jupyterhub, tornado, docker or traitlets; the
policy modules import no I/O at all. The live scheduler (spawner package) and
the simulator drive the same `decide` function. The hot modules run compiled
where `make` built them (native.py), else from this source.
"""

__version__ = "0.1.0"

from scheduler_core import native as native

BUILD = native.guard()
"""What runs: ``compiled`` (the mypyc build, native.py) or ``source`` (and why)."""

# After the guard: it decides whether the compiled modules or their source load.
from scheduler_core import baselines as baselines  # noqa: E402  (registers the baselines)
from scheduler_core import policy as policy  # noqa: E402  (registers the budget policy)
