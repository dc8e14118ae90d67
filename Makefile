# GridLinks — the two commands that matter: `make run` and `make test`.
CARGO  ?= cargo
PYTHON ?= python3
# Where cargo puts binaries (honours CARGO_TARGET_DIR like cargo itself).
TARGET := $(abspath $(or $(CARGO_TARGET_DIR),target))
VENV   := $(TARGET)/pyenv

.PHONY: run test deps rust-test compat-test bench-http bench-import bench-storage bench-mqtt

## Build and run the server on embedded defaults (data in ./data, HTTP on :8080).
run:
	$(CARGO) run --release -p gridlinks-server --bin gridlinks -- serve

## The whole test suite: Rust unit + integration tests (real binary), then the
## compatibility test with ThingsBoard's own Python REST client.
test: deps rust-test compat-test

## Debian packages the tests use as real peers (Mosquitto's clients); installed when missing.
deps:
	@command -v mosquitto_pub >/dev/null && command -v mosquitto >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq mosquitto mosquitto-clients >/dev/null; }

rust-test:
	$(CARGO) test --workspace

$(VENV)/.installed: tests/compat/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r tests/compat/requirements.txt
	touch $@

compat-test: $(VENV)/.installed
	$(CARGO) build -p gridlinks-server --bin gridlinks
	GRIDLINKS_BIN=$(TARGET)/debug/gridlinks $(VENV)/bin/python -m pytest -q tests/compat

## Benchmarks (not part of `make test`; see docs/benchmarks.md).
bench-http:
	bench/http_ingest.sh 20 100 100 1

bench-import:
	bench/bulk_import.sh 30000

bench-mqtt:
	bench/mqtt_compare.sh telemetry
	MSG_RATE=20000 bench/mqtt_compare.sh telemetry
	bench/mqtt_compare.sh idle
	bench/mqtt_compare.sh connect-rate

bench-storage:
	$(CARGO) run --release -p gridlinks-storage --example storage_bench -- 1000 10 fsync
