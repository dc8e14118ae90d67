#!/usr/bin/env bash
# Tenant isolation under a flood (issue 33): `gridlinks-bench tenant-flood` with its defaults.
# One tenant profile "limited" (transportTenantTelemetryMsgRateLimit "500:1") for two tenants:
# quiet (1,000 devices, 300 msgs/s in total) and noisy (100 devices). Phase A: the quiet tenant
# alone; phase B: the same while the noisy tenant floods at 10 x 500 msgs/s; 30 s each, MQTT 5
# QoS 1. It reports the quiet PUBACK p99 of A and B, the noisy tenant's refusals (0x97) and the
# loss check (every acknowledged point stored, no refused one). Exit code 2 on loss.
# Result: target/bench-results/tenant-flood.json. Arguments are passed to the scenario.
# Usage: bench/tenant_flood.sh [--duration 60s ...]   (builds the release binaries first)
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p gridlinks-server -p gridlinks-bench
mkdir -p "$TARGET_DIR/bench-results"
exec "$TARGET_DIR/release/gridlinks-bench" tenant-flood --json "$TARGET_DIR/bench-results/tenant-flood.json" "$@"
