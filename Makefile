# promptbus developer and CI entry points. `make test` is what .ci/run runs.
#
#   make venv          create .venv (if missing) and install promptbus with dev extras;
#                      re-installs when pyproject.toml changes; then the local model server,
#                      promtool/prometheus, helm, tinyproxy and toxiproxy when missing
#   make lint          ruff check + mypy
#   make test          venv, start the local Kafka broker unless KAFKA_BOOTSTRAP_SERVERS is
#                      set and the local Schema Registry unless SCHEMA_REGISTRY_URL is, run
#                      lint and pytest, stop what it started (always)
#   make broker-start  start the 1-node local broker (deploy/kafka-local/kafka start)
#   make broker-stop   stop it
#   make broker-status show it
#
# PYTEST_ARGS passes extra pytest arguments, e.g. make test PYTEST_ARGS='-k broker -x';
# PYTEST_WORKERS the number of pytest-xdist workers (0: none, in this process).

PYTHON ?= python3
VENV := .venv
VENV_STAMP := $(VENV)/.promptbus-installed
PY := $(VENV)/bin/python
KAFKA := deploy/kafka-local/kafka
REGISTRY := deploy/schema-registry/registry
PYTEST_ARGS ?=
# the suite mostly waits, so more workers than cores pay off; the slowest tests show in every
# log (--durations), and the tests of a server of their own share one worker (--dist loadgroup)
PYTEST_WORKERS ?= 4
PYTEST_RUN := -ra --durations=25 -n $(PYTEST_WORKERS) --dist loadgroup

.PHONY: venv lint test broker-start broker-stop broker-status registry-start registry-stop

# The local-model tests need llama-cpp-python's server (the `local` extra), which has no
# prebuilt wheel: deploy/local-model/build-llama-cpp.sh builds it once per machine into a
# wheel cache and installs it; when it is installed already it returns in about a second.
LOCAL_MODEL_SETUP := deploy/local-model/build-llama-cpp.sh

# The alert-rule and Prometheus-scrape tests need `promtool` and `prometheus`: installed from
# the distribution's package when missing (needs root; returns at once when present).
PROMETHEUS_SETUP := deploy/prometheus/install.sh

# The proxy tests need a real HTTP proxy, `tinyproxy`: installed from the distribution's
# package when missing (needs root; returns at once when present).
TINYPROXY_SETUP := deploy/tinyproxy/install.sh

# The Helm chart's tests (helm lint, helm template) need Helm 4: built once per machine from
# its Go module with the Go toolchain when missing (returns at once when present).
HELM_SETUP := deploy/helm/install.sh

# The network fault tests (tests/netfaults/) need Toxiproxy's server: built once per machine
# from its Go module with the Go toolchain when missing (returns at once when present).
TOXIPROXY_SETUP := deploy/toxiproxy/install.sh

venv: $(VENV_STAMP)
	@if [ -x $(LOCAL_MODEL_SETUP) ]; then $(LOCAL_MODEL_SETUP) $(PY); fi
	@$(PROMETHEUS_SETUP) || echo "make venv: no promtool/prometheus; their tests will fail" >&2
	@$(HELM_SETUP) || echo "make venv: no helm; the chart's tests will fail" >&2
	@$(TINYPROXY_SETUP) || echo "make venv: no tinyproxy; the proxy tests will fail" >&2
	@$(TOXIPROXY_SETUP) >/dev/null || echo "make venv: no toxiproxy; the network fault tests will fail" >&2

$(VENV_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "promptbus needs Python 3.11 or newer (PYTHON=$(PYTHON) is older)" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy tests/conftest.py $(wildcard tests/integration/test_broker_*.py)

# One shell for the whole recipe so that the EXIT trap stops the broker this run started,
# whether lint or the tests fail or the run is interrupted; the exit code is kept. The
# 3-node cluster (the cluster tests' and the one-minute soak's) is its fixture's to stop,
# but a killed pytest cannot, so it is stopped here too when it was not running before.
CLUSTER_HOME := .local/kafka-cluster
test: venv
	@started=0; cluster_was_up=0; registry_started=0; \
	KAFKA_LOCAL_HOME=$(CLUSTER_HOME) $(KAFKA) status >/dev/null 2>&1 && cluster_was_up=1; \
	stop_started() { \
		if [ "$$started" = 1 ]; then $(KAFKA) stop; fi; \
		if [ "$$registry_started" = 1 ]; then $(REGISTRY) stop; fi; \
		if [ "$$cluster_was_up" = 0 ] && KAFKA_LOCAL_HOME=$(CLUSTER_HOME) $(KAFKA) status >/dev/null 2>&1; then \
			KAFKA_LOCAL_HOME=$(CLUSTER_HOME) $(KAFKA) stop; fi; \
	}; \
	trap stop_started EXIT; trap 'exit 130' INT TERM; \
	if [ -z "$${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then \
		$(KAFKA) status >/dev/null 2>&1 || started=1; \
		out=$$($(KAFKA) start) || exit $$?; \
		KAFKA_BOOTSTRAP_SERVERS=$$(printf '%s\n' "$$out" | tail -n 1); \
		export KAFKA_BOOTSTRAP_SERVERS; \
	fi; \
	echo "make test: Kafka at $$KAFKA_BOOTSTRAP_SERVERS"; \
	if [ -z "$${SCHEMA_REGISTRY_URL:-}" ]; then \
		$(REGISTRY) status >/dev/null 2>&1 || registry_started=1; \
		out=$$($(REGISTRY) start) || exit $$?; \
		SCHEMA_REGISTRY_URL=$$(printf '%s\n' "$$out" | tail -n 1); \
		export SCHEMA_REGISTRY_URL; \
	fi; \
	echo "make test: Schema Registry at $$SCHEMA_REGISTRY_URL"; \
	lint_rc=0; $(MAKE) --no-print-directory lint || lint_rc=$$?; \
	test_rc=0; $(PY) -m pytest $(PYTEST_RUN) $(PYTEST_ARGS) || test_rc=$$?; \
	if [ "$$test_rc" != 0 ]; then exit $$test_rc; fi; \
	exit $$lint_rc

broker-start:
	@$(KAFKA) start

registry-start:
	@$(REGISTRY) start

registry-stop:
	@$(REGISTRY) stop

broker-stop:
	@$(KAFKA) stop

broker-status:
	@$(KAFKA) status

# `make demo`: the main job end to end (examples/demo.py). DEMO_PROVIDER=simulator skips the
# local model and uses the provider simulator instead.
.PHONY: demo schemas
demo: venv
	$(PY) examples/demo.py

# Regenerate schemas/*.json from the message and tier-file models, the chart's
# values.schema.json from them and the settings, the tables of docs/configuration.md, and
# deploy/k8s/ from the chart (tests fail on drift of any).
schemas: venv
	$(PY) -m consumer.schemas
	$(PY) -m consumer.docs_tables
	$(PY) -m consumer.testing.chart
