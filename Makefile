# The two commands a newcomer needs (README.md):
#   make up     run the whole stack on an embedded NATS and a simulated fleet
#   make test   install what is needed and run every check and test
VENV := .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: up test setup setup-run lint typecheck contracts native pytest bench clean

up: setup-run
	$(VENV)/bin/hcs up $(ARGS)

test: setup lint typecheck contracts native pytest

setup:
	scripts/setup.sh

setup-run:
	scripts/setup.sh --run

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck:
	$(VENV)/bin/mypy

contracts:
	$(VENV)/bin/lint-imports

native:
	$(MAKE) -C interceptor_c
	$(MAKE) -C ebpf

pytest:
	$(PY) -m pytest -q -p no:cacheprovider

bench:
	$(PY) -m bench.ingest
	$(PY) -m bench.extender
	$(PY) -m bench.webhook
	$(PY) -m bench.heal
	HCS_KUBE_BIN=$${HCS_KUBE_BIN:-$$(../shared/kube/unpack.sh)} $(PY) -m bench.throughput
	HCS_KUBE_BIN=$${HCS_KUBE_BIN:-$$(../shared/kube/unpack.sh)} $(PY) -m bench.gangs
	$(MAKE) -C interceptor_c bench

clean:
	$(MAKE) -C interceptor_c clean || true
	$(MAKE) -C ebpf clean || true
	rm -rf $(VENV)
