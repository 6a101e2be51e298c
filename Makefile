# The two commands: `make demo` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint unit integration bench demo engine images browser postgres clean

# The virtual environment is rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

# PostgreSQL is a service of this kind of machine; start it if it is down.
postgres:
	@pg_isready -q -h 127.0.0.1 -p 5432 || { \
	  command -v pg_ctlcluster >/dev/null && \
	  pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -n1) main start; } || true
	@for i in $$(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 1; done; \
	  echo "PostgreSQL at 127.0.0.1:5432 is not answering; the postgres tests will fail" >&2

# A Docker engine (installed and started if missing) and the session images.
engine:
	scripts/engine up

images: engine
	images/build

# Debian's headless Chromium for the browser test (Playwright drives it; no download).
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check scheduler_core spawner tests bench
	$(BIN)/mypy scheduler_core spawner

test: $(STAMP) postgres lint images browser
	$(BIN)/pytest -q

integration: $(STAMP) images browser
	$(BIN)/pytest -q tests/integration

unit: $(STAMP)
	$(BIN)/pytest -q -m "not postgres and not slow and not docker"

bench: $(STAMP) images
	$(BIN)/python -m bench

# The embedded default (jupyterhub_config.py) at http://127.0.0.1:8000.
demo: $(STAMP) images
	@mkdir -p .demo
	@echo
	@echo "  budgethub demo: http://127.0.0.1:8000"
	@echo "  log in as ann or bo (team nlp), cy (vision), di (robotics), eve (nlp + vision)"
	@echo "  or admin; the password is: budgethub.  Ctrl-C stops the Hub (sessions keep running;"
	@echo "  the next make demo finds them again)."
	@echo
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyterhub -f jupyterhub_config.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .demo
