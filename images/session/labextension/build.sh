#!/usr/bin/env bash
# Rebuild budgethub-lab into ../budgethub_session/labextension (committed: the image
# build runs no JS). Needs node and npm; the JupyterLab core it builds against comes
# from a throwaway venv with the same jupyterlab the images install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
venv="${LABBUILD_VENV:-/tmp/budgethub-labbuild}"
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "jupyterlab>=4.2,<5"
core="$("$venv/bin/python" -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')"
npm ci --no-audit --no-fund
rm -rf ../budgethub_session/labextension
JUPYTERLAB_CORE="$core" npm run build
