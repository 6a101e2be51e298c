"""budgethub's embedded default (``make demo``): one machine, the local Docker engine.

A SQLite store, virtual GPUs declared here (clearly marked virtual inside every
session), a CPU data-prep node next to a storage directory, demo teams and users,
and the Node.js proxy from proxy/ (make installs it). Log in at http://127.0.0.1:8000 as any
demo user with the password ``budgethub`` (admin: ``budgethub-admin-demo-password-0001``).

Both nodes are served by the one local engine here; in production each node is
its own engine (``'engine': 'tcp://node:2376'`` with ``'tls'``), GPU nodes read
their inventory with ``'gpus': 'nvml'``, and ``store_url`` names PostgreSQL.
"""

import os
from pathlib import Path

from spawner.hubconfig import configure_hub

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

STATE = Path(os.environ.get("BUDGETHUB_STATE", Path(__file__).parent / ".demo")).resolve()
STORAGE = STATE / "storage" / "weka-a"
STORAGE.mkdir(parents=True, exist_ok=True)
STORAGE.chmod(0o777)
README = STORAGE / "README.txt"
if not README.exists():
    README.write_text("The shared storage 'weka-a', mounted into data-prep sessions.\n")

configure_hub(c)

# -- the Hub ------------------------------------------------------------------
c.JupyterHub.bind_url = "http://127.0.0.1:8000"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.db_url = f"sqlite:///{STATE}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.cleanup_servers = False  # sessions outlive a Hub restart and are found again
c.JupyterHub.allow_named_servers = True

# Demo users log in with the password "budgethub"; admin, whose password gives admin
# rights, with "budgethub-admin-demo-password-0001" (JupyterHub's shared-password
# authenticator wants 32 characters or more for it, and a different one).
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = "budgethub"
c.SharedPasswordAuthenticator.admin_password = "budgethub-admin-demo-password-0001"
c.Authenticator.allowed_users = {"ann", "bo", "cy", "di", "eve", "admin"}
c.Authenticator.admin_users = {"admin"}

# Teams are JupyterHub groups; their allocations live in the scheduler's store.
c.JupyterHub.load_groups = {
    "nlp": {"users": ["ann", "bo", "eve"]},
    "vision": {"users": ["cy", "eve"]},
    "robotics": {"users": ["di"]},
    "budget-admins": {"users": ["admin"]},  # custom:budget:admin in the budget service
}
c.BudgetScheduler.teams = [
    {"name": "nlp", "share": {"gpu": 0.5, "cpu": 0.4}},
    {"name": "vision", "share": {"gpu": 0.3, "cpu": 0.3}},
    {"name": "robotics", "share": {"gpu": 0.2, "cpu": 0.3}},
]

# -- the cluster --------------------------------------------------------------
c.BudgetScheduler.store_url = f"sqlite:///{STATE}/budgethub.sqlite"
# Whole homes on a path every node reaches (here: .demo/homes/budgethub/USER), and the
# snapshots of preempted sessions beside them; a restore then works on any node.
c.BudgetScheduler.home_root = str(STATE / "homes")
c.BudgetScheduler.snapshot_root = str(STATE / "snapshots")
c.BudgetScheduler.pools = [{"name": "gpu", "kind": "gpu"}, {"name": "cpu", "kind": "cpu"}]
c.BudgetScheduler.nodes = [
    {
        # Four virtual GPUs; GPU 3 is MIG-partitioned into seven 1g.10gb instances.
        "name": "gpu-1",
        "pool": "gpu",
        "gpus": 4,
        "gpu_model": "virtual H100",
        "mig": {"3": ["1g.10gb"] * 7},
        "cpus": 8,
        "memory_gib": 16,
    },
    {
        "name": "prep-1",
        "pool": "cpu",
        "cpus": 4,
        "memory_gib": 8,
        "storage": {"weka-a": str(STORAGE)},
    },
]

c.BudgetSpawner.profile_list = [
    {
        "slug": "gpu-notebook",
        "display_name": "GPU notebook",
        "description": "JupyterLab with whole GPUs",
        "class": "interactive",
        "pool": "gpu",
        "image": "budgethub/gpu:latest",
        "gpus": [1, 2],
        "cpus": 1,
        "memory_gib": 2,
        "min_runtime": "1h",
        "max_min_runtime": "8h",
    },
    {
        "slug": "debug",
        "display_name": "Debug session",
        "description": "a MIG instance or a quarter GPU; starts fast",
        "class": "debug",
        "pool": "gpu",
        "image": "budgethub/gpu:latest",
        "slices": [{"mig": "1g.10gb"}, {"gpu_fraction": 0.25}, {"gpus": 1}],
        "cpus": 1,
        "memory_gib": 1,
        "min_runtime": "15m",
        "max_min_runtime": "15m",
    },
    {
        "slug": "dataprep",
        "display_name": "Data-prep session",
        "description": "CPU only, next to the weka-a storage (pandas, pyarrow, duckdb)",
        "class": "dataprep",
        "pool": "cpu",
        "image": "budgethub/dataprep:latest",
        "cpus": 1,
        "memory_gib": 2,
        "storage": ["weka-a"],
        "min_runtime": "1h",
        "max_min_runtime": "8h",
    },
]
c.BudgetScheduler.cycle_tick = 5.0
