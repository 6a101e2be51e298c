# The two commands: `make demo` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint unit bench demo postgres clean

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

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check scheduler_core spawner tests bench
	$(BIN)/mypy scheduler_core spawner

test: $(STAMP) postgres lint
	$(BIN)/pytest -q

unit: $(STAMP)
	$(BIN)/pytest -q -m "not postgres and not slow"

bench: $(STAMP)
	$(BIN)/python -m bench

demo:
	@echo "make demo arrives with the BudgetSpawner (JupyterHub) issue; today budgethub is the"
	@echo "scheduler core and its simulator: try  .venv/bin/budgethub sim examples/debug-fast-start.json"
	@exit 1

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
