#!/usr/bin/env bash
# MQTT comparison: GridLinks and Mosquitto (Debian package) driven by the same generator
# (gridlinks-bench) on the same box, one server at a time, and printed side by side.
#
# Modes:
#   bench/mqtt_compare.sh [telemetry]  DEVICES devices, each its own connection, publish ~100-byte
#                                      JSON telemetry at QoS QOS with INFLIGHT unacked per
#                                      connection for DURATION s: msgs/s, PUBACK p50/p99/max,
#                                      msgs per server CPU-second, peak RSS. MSG_RATE>0 offers
#                                      that many msgs/s in total instead (latency at a fixed load).
#   bench/mqtt_compare.sh idle         IDLE_CONNECTIONS idle connections held HOLD s: server
#                                      RSS per connection.
#   bench/mqtt_compare.sh connect-rate CONNECTIONS connects at RATE/s (0: as fast as the
#                                      generator's MAX_PENDING handshakes allow): connects/s.
#
# Env (defaults): DEVICES=10000 DURATION=20 INFLIGHT=10 QOS=1 PAYLOAD=100 CONNECT_RATE=2000 MSG_RATE=0
#   IDLE_CONNECTIONS=19000 HOLD=10 CONNECTIONS=10000 RATE=0 MAX_PENDING=64
#   SOURCES=127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4 (source addresses, ~28k ports each)
#   THREADS (generator worker threads; default one per CPU)
#   OUT (where the JSON results are kept; default $CARGO_TARGET_DIR or target, /mqtt_compare)
# GridLinks runs with its defaults (fsync'd group commit before every PUBACK); Mosquitto
# stores nothing (persistence false), with set_tcp_nodelay true.
#
# Limits: the open-files limit (`ulimit -n`, 20,000 here) applies to the generator and to
# each server, so IDLE_CONNECTIONS stays below it; both servers listen on 127.0.0.1 and
# run one after the other, never at the same time.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-telemetry}
DEVICES=${DEVICES:-10000}; DURATION=${DURATION:-20}; INFLIGHT=${INFLIGHT:-10}; QOS=${QOS:-1}
PAYLOAD=${PAYLOAD:-100}; CONNECT_RATE=${CONNECT_RATE:-2000}; MSG_RATE=${MSG_RATE:-0}
IDLE_CONNECTIONS=${IDLE_CONNECTIONS:-19000}; HOLD=${HOLD:-10}
CONNECTIONS=${CONNECTIONS:-10000}; RATE=${RATE:-0}; MAX_PENDING=${MAX_PENDING:-64}
SOURCES=${SOURCES:-127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET_DIR/mqtt_compare}

LABEL=$MODE  # names the JSON results: $OUT/$LABEL-{gridlinks,mosquitto}.json
case "$MODE" in
  telemetry) N=$DEVICES; if [ "$MSG_RATE" != 0 ]; then LABEL=telemetry-rate$MSG_RATE; fi ;;
  idle) N=$IDLE_CONNECTIONS ;;
  connect-rate) N=$CONNECTIONS ;;
  *) echo "usage: $0 [telemetry|idle|connect-rate]" >&2; exit 2 ;;
esac
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
[ -x "$MOSQUITTO" ] || { echo "mosquitto missing: apt-get install mosquitto" >&2; exit 1; }
FDS=$(ulimit -n)
if [ "$FDS" != unlimited ] && [ "$N" -ge $((FDS - 100)) ]; then
  echo "$N connections need more than the open-files limit $FDS allows (generator and server each)" >&2; exit 1
fi

cargo build --release -q -p gridlinks-server --bin gridlinks
cargo build --release -q -p gridlinks-bench
GL=$TARGET_DIR/release/gridlinks
BENCH=$TARGET_DIR/release/gridlinks-bench
mkdir -p "$OUT"
TMP=$(mktemp -d)
SERVER_PID=
stop_server() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=; fi
}
trap 'stop_server; rm -rf "$TMP"' EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# The same generator arguments for both servers; only the credentials differ.
bench() { # bench NAME CREDENTIAL-ARGS...
  local name=$1; shift
  local common=(--port "$PORT" --server-pid "$SERVER_PID" --sources "$SOURCES" --max-pending "$MAX_PENDING"
                --json "$OUT/$LABEL-$name.json" "$@")
  [ -n "${THREADS:-}" ] && common=(--threads "$THREADS" "${common[@]}")
  echo "--- $name ($MODE) ---"
  case "$MODE" in
    telemetry) "$BENCH" mqtt-telemetry "${common[@]}" --devices "$N" --duration "$DURATION" --qos "$QOS" \
                 --inflight "$INFLIGHT" --payload-bytes "$PAYLOAD" --connect-rate "$CONNECT_RATE" --rate "$MSG_RATE" ;;
    idle) "$BENCH" connect "${common[@]}" --connections "$N" --rate "$RATE" --hold "$HOLD" ;;
    connect-rate) "$BENCH" connect "${common[@]}" --connections "$N" --rate "$RATE" --hold 1 ;;
  esac
}

# --- GridLinks: provision N devices with tokens through the bulk import API, restart (so the
# measured process starts clean, as Mosquitto does, without the import's freed memory), then run.
HTTP=$(free_port); PORT=$(free_port)
start_gridlinks() {
  GRIDLINKS_ADMIN_PASSWORD=bench GRIDLINKS_LOG=${GRIDLINKS_LOG:-warn} "$GL" serve --data-dir "$TMP/data" \
    --http-bind 127.0.0.1:$HTTP --mqtt-bind 127.0.0.1:$PORT &
  SERVER_PID=$!
  for _ in $(seq 300); do curl -sf $URL/healthz >/dev/null && break; sleep 0.1; done
}
URL=http://127.0.0.1:$HTTP
start_gridlinks
JWT=$(curl -sf -XPOST $URL/api/auth/login -H 'Content-Type: application/json' \
  -d '{"username":"admin","password":"bench"}' | python3 -c 'import json,sys;print(json.load(sys.stdin)["token"])')
python3 - "$N" "$TMP/tokens.txt" > "$TMP/import.json" <<'PY'
import json, sys
n, tokens_path = int(sys.argv[1]), sys.argv[2]
tokens = [f"BENCH-MQTT-{i:06d}" for i in range(n)]
open(tokens_path, "w").write("\n".join(tokens) + "\n")
csv = "\n".join(f"mqtt-bench-{i:06d},{t}" for i, t in enumerate(tokens))
print(json.dumps({"file": csv, "mapping": {"columns": [{"type": "NAME"}, {"type": "ACCESS_TOKEN"}],
                                           "delimiter": ",", "update": True, "header": False}}))
PY
curl -sf -XPOST $URL/api/device/bulk_import -H "X-Authorization: Bearer $JWT" -H 'Content-Type: application/json' \
  --data-binary @"$TMP/import.json" -o "$TMP/import_result.json"
python3 -c "import json;r=json.load(open('$TMP/import_result.json'));print('provisioned: created', r['created'], 'updated', r['updated'], 'errors', r['errors'])"
stop_server
start_gridlinks
bench gridlinks --tokens-file "$TMP/tokens.txt"
stop_server

# --- Mosquitto: same scenario, anonymous, one shared user name.
PORT=$(free_port)
cat > "$TMP/mosquitto.conf" <<EOF
listener $PORT 127.0.0.1
allow_anonymous true
max_connections -1
set_tcp_nodelay true
persistence false
log_dest none
EOF
"$MOSQUITTO" -c "$TMP/mosquitto.conf" &
SERVER_PID=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
bench mosquitto --username bench
stop_server

# --- Side by side.
python3 - "$MODE" "$OUT/$LABEL-gridlinks.json" "$OUT/$LABEL-mosquitto.json" <<'PY'
import json, sys
mode, paths = sys.argv[1], sys.argv[2:]
runs = [json.load(open(p)) for p in paths]
names = ["GridLinks", "Mosquitto"]
def row(label, f):
    cells = []
    for r in runs:
        try:
            cells.append(f(r))
        except (KeyError, TypeError, ZeroDivisionError):
            cells.append("-")
    print(f"{label:<30}" + "".join(f"{c:>18}" for c in cells))
ms = lambda us: f"{us / 1000:.2f} ms"
mib = lambda kib: f"{kib / 1024:.1f} MiB"
print(f"\n== {mode}: side by side ==")
print(f"{'':<30}" + "".join(f"{n:>18}" for n in names))
if mode == "telemetry":
    row("connected", lambda r: f"{r['connected']:,}/{r['devices']:,}")
    row("msgs/s (acked)", lambda r: f"{r['msgs_per_second']:,.0f}")
    row("acked / failed", lambda r: f"{r['acked']:,} / {r['failed']:,}")
    row("PUBACK p50", lambda r: ms(r['puback_latency']['p50_us']))
    row("PUBACK p99", lambda r: ms(r['puback_latency']['p99_us']))
    row("PUBACK max", lambda r: ms(r['puback_latency']['max_us']))
    row("server CPU-seconds", lambda r: f"{r['server']['cpu_seconds']:.2f}")
    row("msgs per server CPU-second", lambda r: f"{r['server']['msgs_per_cpu_second']:,.0f}")
    row("server peak RSS", lambda r: mib(r['server']['rss_peak_kib']))
    row("generator CPU-seconds", lambda r: f"{r['generator_cpu_seconds']:.2f}")
else:
    row("connected", lambda r: f"{r['connected']:,}/{r['requested']:,}")
    row("connects/s", lambda r: f"{r['connects_per_second']:,.0f}")
    row("connects per server CPU-s", lambda r: f"{r['server']['connects_per_cpu_second']:,.0f}")
    row("CONNACK p50", lambda r: ms(r['connack_latency']['p50_us']))
    row("CONNACK p99", lambda r: ms(r['connack_latency']['p99_us']))
    row("server RSS before", lambda r: mib(r['server']['rss_before_kib']))
    row("server RSS connected", lambda r: mib(r['server']['rss_connected_kib']))
    row("KiB per connection", lambda r: f"{r['server']['kib_per_connection']:.2f}")
    row("lost while held", lambda r: f"{sum(r['dropped_connections'].values()):,}")
print(f"(JSON results: {' '.join(paths)})")
PY
