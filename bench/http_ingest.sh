#!/usr/bin/env bash
# HTTP telemetry ingest benchmark: keep-alive, DEVICES devices each with its own token,
# ~120-byte JSON with 5 values and a unique ts, every 200 only after the fsync'd group commit.
# Prints durable req/s, req per server CPU-second and latency; checks that the server
# applied at least as many records as wrk saw 200s.
# Usage: bench/http_ingest.sh [DURATION_S=20] [CONNECTIONS=100] [DEVICES=100] [WRK_THREADS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-20}; CONNS=${2:-100}; DEVICES=${3:-100}; THREADS=${4:-1}
command -v wrk >/dev/null || { echo "wrk missing: apt-get install wrk" >&2; exit 1; }
source bench/lib.sh
python3 - "$DEVICES" > "$TMP/import.json" <<'PY'
import json, sys
n = int(sys.argv[1])
csv = "\n".join(f"bench-{i},bench,BENCH{i}" for i in range(n))
print(json.dumps({"file": csv, "mapping": {"columns": [{"type": "NAME"}, {"type": "TYPE"}, {"type": "ACCESS_TOKEN"}], "delimiter": ",", "update": True, "header": False}}))
PY
curl -sf -XPOST $URL/api/device/bulk_import -H "X-Authorization: Bearer $JWT" -H 'Content-Type: application/json' --data-binary @"$TMP/import.json" >/dev/null
records() { curl -s $URL/metrics | awk '/^gridlinks_storage_records_total/{print $2}'; }
cpu() { awk '{print $14+$15}' /proc/$PID/stat; }
TICK=$(getconf CLK_TCK)
R0=$(records); C0=$(cpu)
wrk -t$THREADS -c$CONNS -d${DURATION}s --latency -s bench/http_telemetry.lua $URL -- $DEVICES $THREADS > "$TMP/wrk.txt"
C1=$(cpu); R1=$(records)
cat "$TMP/wrk.txt" | grep -E "Requests/sec|Latency|ACKED|LATENCY_US|Non-2xx|Socket errors" || true
ACKED=$(awk '/^ACKED/{print $2}' "$TMP/wrk.txt")
RPS=$(awk '/Requests\/sec/{print $2}' "$TMP/wrk.txt")
CPU_S=$(python3 -c "print(($C1-$C0)/$TICK)")
RSS=$(awk '/VmHWM/{print $2}' /proc/$PID/status)
python3 - <<PY
acked=$ACKED; cpu=$CPU_S; dur=$DURATION; applied=$R1-$R0
print(f"durable req/s: {acked/dur:,.0f} (wrk total incl. non-2xx: $RPS)")
print(f"server CPU: {cpu:.2f} s over {dur} s -> {acked/cpu:,.0f} req per server CPU-second")
print(f"server peak RSS: {$RSS/1024:.1f} MiB; records applied {applied:,} >= acked {acked:,}: {applied >= acked}")
assert applied >= acked, "server acknowledged more than it applied"
PY
