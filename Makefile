# The two commands: `make demo` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROXY_STAMP := proxy/node_modules/.installed
# The compiled scheduler core (scheduler_core/native.py): rebuilt when its source changes.
NATIVE_STAMP := scheduler_core/native.json
NATIVE_SOURCES := $(wildcard scheduler_core/*.py scheduler_core/policy/*.py)

.PHONY: test lint unit integration bench demo engine images browser proxy postgres clean packages setup session-env native

# pytest-xdist workers. The suite mostly waits (on containers, kernels, the Hub), so
# more workers than cores pay off; each worker has its own Hubs, ports and state folders.
# Four on two cores: pytest took 577 s with four against 656 s with three, at 355fa9e on
# this 2-core VM after setup (BUDGETHUB_TIMELINE showed every worker busy to the end
# either way, so the gain is overlap of waits, not balance).
WORKERS ?= 4
XDIST := -n $(WORKERS)

# Debian packages for the engine, the image base, the proxy and the Slurm test cluster
# (slurmctld, slurmd, munge, sudo for jobs submitted as each researcher, and Debian's
# Python for the session environment), in one
# apt-get call when any is missing. Chromium comes in `browser`, beside the image build
# (mmdebstrap and debootstrap do not take the host's apt lock), so its download is off the longest path.
packages:
	@missing=""; \
	  command -v dockerd >/dev/null || missing="$$missing docker.io"; \
	  command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
	  command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	  { command -v node >/dev/null && command -v npm >/dev/null; } || missing="$$missing nodejs npm"; \
	  for pair in slurmctld:slurmctld slurmd:slurmd slurmdbd:slurmdbd munged:munge; do \
	    test -x /usr/sbin/$${pair%%:*} || missing="$$missing $${pair#*:}"; done; \
	  command -v sbatch >/dev/null || missing="$$missing slurm-client"; \
	  command -v sudo >/dev/null || missing="$$missing sudo"; \
	  /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	  if [ -n "$$missing" ]; then \
	    echo "installing$$missing with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  fi

# Everything the suite needs, the independent parts at once: the venv and lint, the
# proxy, PostgreSQL, and the engine with the images (the longest, from mmdebstrap's root fs).
setup: packages
	$(MAKE) --no-print-directory -j4 --output-sync=target lint $(NATIVE_STAMP) $(PROXY_STAMP) postgres images browser session-env


# The virtual environment is rebuilt when pyproject.toml changes. The session images'
# package (images/session) goes in too: its tests run real kernels on this venv.
# rfc3987-syntax comes with jupyter_events' jsonschema[format-nongpl] and builds its
# Lark parsers when imported: about 1 s of CPU each time a Hub starts (JupyterHub
# imports jupyter_events), half its start. jsonschema only uses it for the "iri" and
# "iri-reference" formats, which no schema of JupyterHub, jupyter_server or
# jupyter_events names, so it goes (`pip check` stays clean; docs/operations.md).
$(STAMP): pyproject.toml images/session/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pip install --quiet -e images/session
	$(BIN)/pip uninstall --quiet --yes rfc3987-syntax
	@touch $(STAMP)

# The policy, the scheduler and the simulator compiled with mypyc, beside their source
# (scripts/compile_core.py). Without a C compiler the build fails and `make` goes on.
# From source the core makes the same decisions, more slowly: a steady cycle takes about
# 1.8 times as long and a simulated month about 2.5 times
# (docs/benchmarks/cycle.md, "Compiled against source").
native: $(NATIVE_STAMP)
$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES) scripts/compile_core.py
	@$(BIN)/python scripts/compile_core.py || echo "make: the scheduler core runs from source"

# The Hub's proxy: JupyterHub's Node.js configurable-http-proxy, exactly as pinned by
# proxy/package-lock.json (npm ci), reinstalled when that changes. Node.js and npm come
# from apt if missing; a TLS-intercepting proxy's CA ($PIP_CERT) is trusted for npm.
$(PROXY_STAMP): proxy/package.json proxy/package-lock.json
	@command -v node >/dev/null && command -v npm >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 18 ? 1 : 0)' || \
	  { echo "configurable-http-proxy needs Node.js 18 or later, not $$(node --version)" >&2; exit 1; }
	cd proxy && $(if $(PIP_CERT),NODE_EXTRA_CA_CERTS=$(PIP_CERT)) npm ci --no-audit --no-fund
	@touch $(PROXY_STAMP)

proxy: $(PROXY_STAMP)

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

# The session environment Slurm nodes run sessions from (images/session-env; the Slurm
# tests' nodes share this machine's disk). A second run with nothing changed does nothing.
SESSION_ENV ?= /var/cache/budgethub/session-env
session-env:
	images/session-env $(SESSION_ENV)

# Debian's headless Chromium for the browser test (Playwright drives it; no download).
# Without recommends: they pull in a desktop's worth of packages (printing, Mesa's LLVM)
# that a headless browser never loads.
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	  chromium fonts-liberation; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check scheduler_core spawner tests bench harness
	$(BIN)/mypy scheduler_core spawner harness

# The 20 slowest tests are listed at the end, so a run's log says where its time went.
test: setup
	$(BIN)/pytest -q $(XDIST) --durations=20

integration: setup
	$(BIN)/pytest -q $(XDIST) tests/integration

unit: $(STAMP) $(NATIVE_STAMP)
	$(BIN)/pytest -q -n 2 -m "not postgres and not slow and not docker"

# Every benchmark, then each figure against its bar in bench/bars.toml: exits 1 when one
# falls outside, 2 when one is missing. `make bench ONLY=cycle,month` runs a subset.
bench: $(STAMP) $(NATIVE_STAMP) $(PROXY_STAMP) images
	$(BIN)/python -m bench $(if $(ONLY),--only $(ONLY))

# The embedded default (jupyterhub_config.py) at http://127.0.0.1:8000.
demo: $(STAMP) $(NATIVE_STAMP) $(PROXY_STAMP) images
	@mkdir -p .demo
	@echo
	@echo "  budgethub demo: http://127.0.0.1:8000"
	@echo "  log in as ann or bo (team nlp), cy (vision), di (robotics), eve (nlp + vision)"
	@echo "  with the password budgethub, or as admin with budgethub-admin-demo-password-0001."
	@echo "  Ctrl-C stops the Hub (sessions keep running; the next make demo finds them again)."
	@echo
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyterhub -f jupyterhub_config.py

clean:
	-$(BIN)/python scripts/compile_core.py --clean
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .demo proxy/node_modules
