# budgethub: every IPython kernel of the session image checkpoints its namespace
# (installed as /opt/venv/etc/ipython/ipython_kernel_config.py). Appended, so a
# user's own profile config adds to it; BUDGETHUB_CHECKPOINT=0 switches it off.
c = get_config()  # type: ignore[name-defined]  # noqa: F821
c.InteractiveShellApp.extensions.append("budgethub_session.snapshot")
