# budgethub: a JupyterLab launcher card that says what this session was granted
# (budgethub_session.grant, served through jupyter-server-proxy). Installed by the base
# image as /opt/venv/etc/jupyter/jupyter_server_config.py; read at every server start,
# so the card's title fits this session's grant.
import os

from budgethub_session.grant import server_proxy_servers

c = get_config()  # type: ignore[name-defined]  # noqa: F821 - provided by Jupyter Server when it loads this file
c.ServerProxy.servers = {**c.ServerProxy.get("servers", {}), **server_proxy_servers(os.environ)}
