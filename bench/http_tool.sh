#!/usr/bin/env bash
# HTTP device API driven by gridlinks-bench http-telemetry: DEVICES devices (own tokens, one
# keep-alive connection and one request in flight each) for DURATION, then the loss check
# (every answered point stored) and storage lag; server CPU from /proc. JSON and HTML in OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
cargo build --release -q -p gridlinks-bench
OUT=${OUT:-${CARGO_TARGET_DIR:-target}/bench-results}; mkdir -p "$OUT"
target/release/gridlinks-bench http-telemetry --api "$URL" --api-password bench --provision \
  --verify --storage-lag --devices "${DEVICES:-100}" --duration "${DURATION:-20s}" \
  --server-pid "$PID" --json "$OUT/http.json" --html "$OUT/http.html"
