#!/usr/bin/env bash
# MQTT over TLS against plaintext, GridLinks beside Mosquitto with the same certificate, in
# one session: 10,000 devices at saturation and at 20,000 msgs/s, then 10,000 connections
# made and held (connection rate: TLS handshakes per second; memory per idle connection).
# Each step runs plaintext, then TLS. Results: target/bench-results/tls-vs-plain/.
# Usage: bench/tls_vs_plain.sh   (builds the release binaries first)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p gridlinks-server -p gridlinks-bench
B=target/release/gridlinks-bench
OUT=target/bench-results/tls-vs-plain
SOURCES=${SOURCES:-127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4}
mkdir -p "$OUT"
step() {
  local name=$1; shift
  for tls in "" --tls; do
    echo "=== $name ${tls:-plain}"
    $B compare $tls --against mosquitto --json "$OUT/$name${tls:+-tls}.json" "$@" --sources "$SOURCES"
  done
}
step saturation mqtt-telemetry --devices 10000 --duration 20s --verify
step rate-20k mqtt-telemetry --devices 10000 --rate 20000 --duration 20s --verify
step connect connect --connections 10000 --hold 1s
