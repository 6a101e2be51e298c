"""The test harness: a real JupyterHub with BudgetSpawner in a subprocess, kernels,
a TLS node in a network namespace, and the builders tests and benchmarks share.

It lives beside ``tests/`` and ``bench/``, not in either, so both import it and neither
imports the other's harness.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The checkout: harness/ sits at its root."""
