# The README's two quick-start commands are `make run` and `make test`;
# both set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Reinstalled when the dependencies or the version change (the package metadata holds the version).
# constraints.txt pins what the suite last passed with (a fresh machine gets the same versions;
# refresh it with `make constraints` after a green run on newer ones).
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml rsc/__init__.py constraints.txt | cksum | cut -d' ' -f1)

.PHONY: constraints setup setup-node run $(addprefix test-,$(TIERS)) clean-demo test test-fast lint bench clean

$(STAMP): pyproject.toml rsc/__init__.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# The Node.js reference client's packages (clients/node, `npm ci` from its lock file): the
# conformance tier and `make test` run it, so Node.js 20 with npm is required for the tests
# (`.ci/run` installs it where it is missing); `make run` needs only Python.
NODE_DIR := clients/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed-$(shell cat $(NODE_DIR)/package-lock.json | cksum | cut -d' ' -f1)

$(NODE_STAMP): $(NODE_DIR)/package-lock.json
	@command -v npm >/dev/null || { echo "setup: Node.js 20 with npm is required for the tests (apt-get install nodejs npm)" >&2; exit 1; }
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error && rm -f node_modules/.installed-* && touch ../../$@

setup: $(STAMP)

setup-node: $(NODE_STAMP)

# The demo's keys live under their own namespace (`make clean-demo` removes them), and its
# admin password (loopback only) is `demo` unless RSC_ADMIN_PASSWORD says otherwise.
DEMO_PREFIX ?= rsc-demo:

run: export RSC_ADMIN_PASSWORD ?= demo
run: setup
	@echo "make run: the admin is admin / $$RSC_ADMIN_PASSWORD (for /ui's audit log and the rsc admin CLI)"
	$(BIN)/rsc serve --bind 127.0.0.1:8080 --demo --key-prefix '$(DEMO_PREFIX)'

clean-demo: setup
	$(BIN)/rsc purge --key-prefix '$(DEMO_PREFIX)' --yes

# Every tier: the in-process ones on three processes (two cores: each test waits on Redis or a
# served coordinator a third of its time; three finish in 2:50 where two took 3:50, and the
# Node.js client's own tests run beside them), then the tiers of real processes (chaos,
# conformance, processes, compat, browser: the long ones first, so that they start early) four
# at a time (they mostly wait on their servers and processes, each of its own on free ports:
# 5:55 where three at a time took 7:10, with the workers' start-up halved). Every part runs;
# the target fails if any did. (Running the two pytest lines at
# once was tried: 1.8 minutes sooner, but the process tiers' timings then fail under the
# in-process tiers' load.) The process tiers wait for .ci/run's package installs (chromium,
# promtool) while their job (its pid in .ci-apt.pending, written in the last 20 minutes) runs;
# without that file, nothing waits.
test: setup setup-node
	@(cd $(NODE_DIR) && npm test --silent) > .node-test.log 2>&1 & node_job=$$!; \
	$(BIN)/pytest -n 3 tests/core tests/actors tests/http tests/clients; first=$$?; \
	wait $$node_job; node=$$?; cat .node-test.log; rm -f .node-test.log; \
	while [ -n "$$(find .ci-apt.pending -mmin -20 2>/dev/null)" ] && kill -0 "$$(cat .ci-apt.pending)" 2>/dev/null; do sleep 1; done; \
	$(BIN)/pytest -n 4 tests/chaos tests/conformance tests/processes tests/compat tests/browser; second=$$?; \
	exit $$(( first || second || node ))

# The inner loop (about a minute): the in-process tiers (core, actors, http, clients) without
# the modules tests/conftest.py marks slow, 10 examples per property, on three processes.
test-fast: setup
	$(BIN)/pytest -m "not slow" -q --hypothesis-profile=fast -n 3 tests/core tests/actors tests/http tests/clients

# One tier: make test-core, test-actors, test-http, test-clients, test-processes, test-chaos,
# test-browser, test-compat (docs/development.md says which to run when).
TIERS := core actors http clients processes chaos browser compat conformance
$(addprefix test-,$(TIERS)): test-%: setup setup-node
	$(BIN)/pytest -q tests/$*

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python bench/assignor.py
	$(BIN)/python bench/persistence.py
	command -v wrk >/dev/null || (apt-get update -q && apt-get install -y -q wrk)
	$(BIN)/python bench/heartbeat.py
	$(BIN)/python bench/churn.py
	$(BIN)/python bench/lists.py
	$(BIN)/python bench/producer.py
	$(BIN)/python bench/consumer.py     # installs FastStream into bench/.faststream-venv on first use
	$(BIN)/python bench/latency.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis bench/results

# Pin the versions in .venv (after a green `make test` on them) for every fresh machine.
constraints: setup
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^rsc' > constraints.txt
