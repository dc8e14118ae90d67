# GridLinks — the two commands that matter: `make run` and `make test`.
CARGO  ?= cargo
PYTHON ?= python3
# Where cargo puts binaries (honours CARGO_TARGET_DIR like cargo itself).
TARGET := $(abspath $(or $(CARGO_TARGET_DIR),target))
VENV   := $(TARGET)/pyenv

.PHONY: run test build-deps deps lint cluster cluster-test console rust-test test-build compat-test js-test bench-http bench-import bench-storage bench-deps bench-mqtt bench-tls bench-pubsub bench-pubsub-latency bench-presets bench-crash bench-lamp bench-coap bench-provision bench-ws bench-console bench-cluster bench-tb-gateway bench-tenant-flood

## Build and run the server on embedded defaults (data in ./data, HTTP on :8080, the web
## console at http://localhost:8080/).
run: build-deps console
	$(CARGO) run --release -p gridlinks-server --bin gridlinks -- serve

## What building needs beyond Rust: OpenSSL's headers for CoAP over DTLS (the system
## libssl); installed when missing.
build-deps:
	@pkg-config --exists openssl 2>/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq libssl-dev pkg-config >/dev/null; }

## The whole test suite: formatting and lints, Rust unit + integration tests (real binary),
## the compatibility tests with ThingsBoard's own Python clients and paho against Mosquitto,
## then MQTT.js in Node and in a real headless Chromium.
test: deps console lint rust-test compat-test js-test

## rustfmt (rustfmt.toml) and clippy with warnings as errors on every target (libraries,
## binaries, tests, examples), with the workspace's lints (Cargo.toml [workspace.lints]).
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -q -- -D warnings

## Debian packages the tests use as real peers (Mosquitto and its clients, Chromium for
## the browser test, libcoap's coap-client, openssl and curl for the TLS tests); installed
## when missing.
deps: build-deps
	@command -v mosquitto_pub >/dev/null && command -v mosquitto >/dev/null && command -v chromium >/dev/null && command -v coap-client-notls >/dev/null && command -v mvn >/dev/null && command -v java >/dev/null && command -v openssl >/dev/null && command -v curl >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq mosquitto mosquitto-clients chromium libcoap3-bin maven default-jre-headless postgresql openssl curl >/dev/null; }
	scripts/services/kafka.sh fetch
	scripts/services/cassandra.sh fetch

## A local cluster until Ctrl-C: 3 gridlinks nodes (HTTP 8080-8082, MQTT 1883-1885) on 3
## Kafka brokers, Cassandra 5 (time series) and PostgreSQL (entities) (docs/scaling.md).
cluster: deps console
	$(CARGO) build --release -p gridlinks-server
	scripts/cluster.sh

## Scale-out tests alone: real Kafka brokers (scripts/services/kafka.sh) behind gridlinks
## nodes with cluster.queue = "kafka"; the time-series conformance suite on the embedded
## store, on a real PostgreSQL (scripts/services/postgres.sh) and on a real Cassandra 5
## (scripts/services/cassandra.sh). Also part of `make test`.
cluster-test: deps
	$(CARGO) test -p gridlinks-kafka
	$(CARGO) test -p gridlinks-server --test kafka --test cluster_features
	$(CARGO) test -p gridlinks-storage --test storage_scenarios conformance
	$(CARGO) test -p gridlinks-postgres
	$(CARGO) test -p gridlinks-cassandra

## The web console (console/: TypeScript, Preact, Pico CSS, uPlot) built by npm into
## console/dist, which gridlinks-http's build.rs embeds; rebuilt only when its sources change.
CONSOLE_SRC := $(shell find console/src -type f) console/index.html console/vite.config.ts console/tsconfig.json

console/node_modules/.installed: console/package-lock.json
	cd console && npm ci --no-audit --no-fund
	touch $@

console/dist/index.html: console/node_modules/.installed $(CONSOLE_SRC)
	cd console && npm run build

console: console/dist/index.html

rust-test: console
	$(CARGO) test --workspace

## What `cargo test --workspace` builds, the gridlinks binary included (its integration
## tests run it), without running anything: a no-op after rust-test. The compatibility and
## browser tests run that same binary; `cargo build -p gridlinks-server` would build it
## again with another feature set (no dev-dependencies to unify with), i.e. a second
## compilation of the server and of the dependencies whose features differ.
test-build: console
	$(CARGO) test --workspace --no-run

$(VENV)/.installed: tests/compat/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r tests/compat/requirements.txt
	touch $@

compat-test: $(VENV)/.installed test-build
	GRIDLINKS_BIN=$(TARGET)/debug/gridlinks $(VENV)/bin/python -m pytest -q tests/compat

tests/js/node_modules/.installed: tests/js/package-lock.json
	cd tests/js && npm ci --no-audit --no-fund
	touch $@

js-test: tests/js/node_modules/.installed test-build
	cd tests/js && GRIDLINKS_BIN=$(TARGET)/debug/gridlinks npm test

## Benchmarks (not part of `make test`; see docs/benchmarks.md).
bench-http:
	bench/http_ingest.sh 20 100 100 1
	bench/http_tool.sh

bench-import:
	bench/bulk_import.sh 30000

# gridlinks-bench starts GridLinks and the peers itself (free loopback ports, one at a
# time). PEERS: mosquitto (Debian) and rumqttd (`cargo install rumqttd`, by bench-deps).
PEERS   ?= mosquitto,rumqttd
SOURCES ?= 127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4
BENCH   := $(TARGET)/release/gridlinks-bench
RESULTS := $(TARGET)/bench-results

bench-deps: deps
	@command -v rumqttd >/dev/null || test -x $(HOME)/.cargo/bin/rumqttd || $(CARGO) install rumqttd
	$(CARGO) build --release -q -p gridlinks-server -p gridlinks-bench
	mkdir -p $(RESULTS)

bench-mqtt: bench-deps
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/telemetry.json --html $(RESULTS)/telemetry.html \
	  mqtt-telemetry --devices 10000 --duration 20s --sources $(SOURCES) --verify
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/telemetry-20k.json --html $(RESULTS)/telemetry-20k.html \
	  mqtt-telemetry --devices 10000 --rate 20000 --duration 20s --sources $(SOURCES) --verify --storage-lag
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/telemetry-2k.json --html $(RESULTS)/telemetry-2k.html \
	  mqtt-telemetry --devices 10000 --rate 2000 --duration 20s --sources $(SOURCES) --verify
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/telemetry-50k.json --html $(RESULTS)/telemetry-50k.html \
	  mqtt-telemetry --devices 10000 --rate 50000 --duration 20s --sources $(SOURCES) --verify
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/idle.json --html $(RESULTS)/idle.html \
	  connect --connections 18000 --rate 2000 --hold 10s --sources $(SOURCES)
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/connect-rate.json --html $(RESULTS)/connect-rate.html \
	  connect --connections 10000 --hold 1s --sources $(SOURCES)

# bench-mqtt's three telemetry runs over MQTT over TLS: `compare --tls` makes a throwaway
# CA and server certificate (openssl) that GridLinks and each peer serve on a TLS listener.
# TLS_PEERS: mosquitto (rumqttd's TLS listener is not wired up in the tool).
TLS_PEERS ?= mosquitto
bench-tls: bench-deps
	$(BENCH) compare --tls --against $(TLS_PEERS) --json $(RESULTS)/telemetry-tls.json --html $(RESULTS)/telemetry-tls.html \
	  mqtt-telemetry --devices 10000 --duration 20s --sources $(SOURCES) --verify
	$(BENCH) compare --tls --against $(TLS_PEERS) --json $(RESULTS)/telemetry-tls-20k.json --html $(RESULTS)/telemetry-tls-20k.html \
	  mqtt-telemetry --devices 10000 --rate 20000 --duration 20s --sources $(SOURCES) --verify --storage-lag
	$(BENCH) compare --tls --against $(TLS_PEERS) --json $(RESULTS)/telemetry-tls-2k.json --html $(RESULTS)/telemetry-tls-2k.html \
	  mqtt-telemetry --devices 10000 --rate 2000 --duration 20s --sources $(SOURCES) --verify
	$(BENCH) compare --tls --against $(TLS_PEERS) --json $(RESULTS)/connect-tls.json --html $(RESULTS)/connect-tls.html \
	  connect --connections 10000 --hold 1s --sources $(SOURCES)

# Issue 5's pub/sub shapes at QoS 1 and QoS 0, as fast as acks (QoS 0: sockets) allow:
# fan-in 1,000 -> 1, fan-out 1 -> 1,000, 500 pairs.
PUBSUB_FANIN  := --groups 1 --publishers 1000 --subscribers 1
PUBSUB_FANOUT := --groups 1 --publishers 1 --subscribers 1000
PUBSUB_PAIRS  := --groups 500 --publishers 1 --subscribers 1
bench-pubsub: bench-deps
	for q in 1 0; do \
	  $(BENCH) compare --against $(PEERS) --json $(RESULTS)/fanin-q$$q.json pubsub $(PUBSUB_FANIN) --pub-qos $$q --sub-qos $$q --duration 20s && \
	  $(BENCH) compare --against $(PEERS) --json $(RESULTS)/fanout-q$$q.json pubsub $(PUBSUB_FANOUT) --pub-qos $$q --sub-qos $$q --duration 20s && \
	  $(BENCH) compare --against $(PEERS) --json $(RESULTS)/pairs-q$$q.json pubsub $(PUBSUB_PAIRS) --pub-qos $$q --sub-qos $$q --duration 20s || exit 1; \
	done

# QoS 1 latency at fixed rates: half of GridLinks' saturating rate of each shape (from
# docs/benchmarks.md; fan-out's rate is publishes, each to 1,000 subscribers) and a moderate
# rate; then persistent subscribers (durable copies) and 5,000 nearly idle subscribers.
bench-pubsub-latency: bench-deps
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/fanin-half.json pubsub $(PUBSUB_FANIN) --rate 140000 --duration 15s
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/fanout-half.json pubsub $(PUBSUB_FANOUT) --rate 315 --duration 15s
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/pairs-half.json pubsub $(PUBSUB_PAIRS) --rate 160000 --duration 15s
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/fanin-50k.json pubsub $(PUBSUB_FANIN) --rate 50000 --duration 15s
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/fanout-100k.json pubsub $(PUBSUB_FANOUT) --rate 100 --duration 15s
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/pairs-50k.json pubsub $(PUBSUB_PAIRS) --rate 50000 --duration 15s
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/fanin-persistent.json pubsub $(PUBSUB_FANIN) --persistent-subscribers --duration 15s
	$(BENCH) compare --against $(PEERS) --json $(RESULTS)/idle-5000.json pubsub --groups 1 --publishers 1 --subscribers 5000 --rate 1 --duration 10s

bench-presets: bench-deps
	$(BENCH) preset tb-2017 --against $(PEERS) --step-args "--sources $(SOURCES)" --json $(RESULTS)/tb-2017.json --html $(RESULTS)/tb-2017.html
	$(BENCH) preset tb-2021 --against $(PEERS) --step-args "--sources $(SOURCES)" --json $(RESULTS)/tb-2021.json --html $(RESULTS)/tb-2021.html
	$(BENCH) preset tbmq-fanin --against $(PEERS) --json $(RESULTS)/tbmq-fanin.json --html $(RESULTS)/tbmq-fanin.html

# Custom TCP, the single-lamp controller (docs/protocols.md): 19,000 controllers (the
# open-files limit) through the native decoder and protocols/lamp.js, as fast as replies
# allow and at fixed rates, with the loss check; then the MQTT path with the same device
# count and one message in flight, against Mosquitto, for reference.
bench-lamp: bench-deps
	$(BENCH) lamp-tcp --controllers 19000 --duration 30s --sources $(SOURCES) --verify --json $(RESULTS)/lamp.json
	$(BENCH) lamp-tcp --controllers 19000 --duration 30s --rate 20000 --sources $(SOURCES) --verify --json $(RESULTS)/lamp-20k.json
	$(BENCH) lamp-tcp --controllers 19000 --duration 30s --rate 5000 --sources $(SOURCES) --verify --json $(RESULTS)/lamp-5k.json
	$(BENCH) compare --against mosquitto --json $(RESULTS)/mqtt-19k-inflight1.json \
	  mqtt-telemetry --devices 19000 --inflight 1 --duration 30s --sources $(SOURCES) --verify

# CoAP (docs/api.md): 1,000 devices posting confirmable telemetry, one in flight each, as
# fast as ACKs allow and at 5,000/s, with the loss check; the MQTT path in the same shape
# (QoS 1, one in flight) against Mosquitto for reference.
## ThingsBoard's own performance-test tool, gateway test, with its defaults: builds the tool
## from ThingsBoard's sources on first use, then counts what GridLinks stored (none lost).
bench-tb-gateway: bench-deps
	test -f target/perftool/performance-tests/target/tb-ce-performance-tests-4.0.1-boot.jar || bench/perftool/build_perftool.sh
	GRIDLINKS_BIN=$(TARGET)/release/gridlinks bench/tb_perf_gateway.sh

bench-coap: bench-deps
	$(BENCH) coap-telemetry --devices 1000 --duration 30s --verify --json $(RESULTS)/coap.json
	$(BENCH) coap-telemetry --devices 1000 --duration 30s --rate 5000 --verify --json $(RESULTS)/coap-5k.json
	$(BENCH) compare --against mosquitto --json $(RESULTS)/mqtt-1k-inflight1.json \
	  mqtt-telemetry --devices 1000 --inflight 1 --duration 30s --verify
	$(BENCH) compare --against mosquitto --json $(RESULTS)/mqtt-1k-inflight1-5k.json \
	  mqtt-telemetry --devices 1000 --inflight 1 --rate 5000 --duration 30s --verify

## Device provisioning: 100 profiles × 300 devices through POST /api/v1/provision.
bench-provision: bench-deps
	$(BENCH) provision --profiles 100 --devices-per-profile 300 --connections 64 --json $(RESULTS)/provision.json
	$(BENCH) provision --tenants --profiles 100 --devices-per-profile 300 --connections 64 --json $(RESULTS)/provision-tenants.json

## Live telemetry over the WebSocket API (issue 16): 1,000 devices at 10 msgs/s, one session
## per device, then one session for all of them.
bench-ws: bench-deps
	$(BENCH) ws-telemetry --devices 1000 --rate 10 --duration 20s --json $(RESULTS)/ws-telemetry.json
	$(BENCH) ws-telemetry --devices 1000 --rate 10 --duration 20s --one-session --json $(RESULTS)/ws-telemetry-one.json
	$(BENCH) ws-telemetry --devices 1000 --rate 10 --duration 20s --via mqtt --json $(RESULTS)/ws-telemetry-mqtt.json
	$(BENCH) ws-telemetry --devices 1000 --rate 10 --duration 20s --via mqtt --one-session --json $(RESULTS)/ws-telemetry-mqtt-one.json

bench-storage:
	$(CARGO) run --release -p gridlinks-storage --example storage_bench -- 1000 10 fsync

# Durability under kill -9 (docs/bench-tool.md, crash-loop): 12 cycles per transport, each
# killed 3-8 s into a saturating load, then every acknowledged point must be stored (exit
# code 2 if not). MQTT: 1,000 devices x 10 publishes in flight (~200k acks/s on 2 cores);
# HTTP: 500 keep-alive devices, under GridLinks' http.max_connections (512). No peers needed.
CRASH_SEED ?= 20261123
bench-crash:
	$(CARGO) build --release -q -p gridlinks-server -p gridlinks-bench
	mkdir -p $(RESULTS)
	$(BENCH) crash-loop --transport mqtt --cycles 12 --devices 1000 --window 10 --kill-after 3s..8s \
	  --seed $(CRASH_SEED) --json $(RESULTS)/crash-mqtt.json
	$(BENCH) crash-loop --transport http --cycles 12 --devices 500 --kill-after 3s..8s \
	  --seed $(CRASH_SEED) --json $(RESULTS)/crash-http.json

## Scale-out (docs/benchmarks.md "Scale-out"): embedded + Mosquitto, Kafka, Kafka +
## PostgreSQL, two and three nodes, Kafka + Cassandra; at saturation and at 2,000 msg/s; then
## Cassandra warmed up (90 s at 2,000 msg/s). Starts Kafka, PostgreSQL and Cassandra itself.
bench-cluster: bench-deps
	scripts/bench-cluster.sh 1000 max 15s
	scripts/bench-cluster.sh 1000 2000 20s
	scripts/bench-cassandra.sh 2000

## The console's first load (gzip), time to interactive on a 1,000-device list, and a
## 30,000-row import through the page (release build, headless Chromium).
bench-console: deps console tests/js/node_modules/.installed
	$(CARGO) build --release -q -p gridlinks-server
	cd tests/js && GRIDLINKS_BIN=$(TARGET)/release/gridlinks node bench_console.mjs

## One tenant floods at 10x its tenant profile's limit while another publishes at a fixed
## rate: the quiet tenant's p99 with and without the flood, and the loss check for both.
bench-tenant-flood: deps
	bench/tenant_flood.sh
