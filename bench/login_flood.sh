#!/usr/bin/env bash
# Device HTTP ingest while an attacker guesses passwords (issue 12 item 3). Three runs, each
# on a fresh server: no flood; a flood of wrong REST logins at RATE/s with the default
# throttle; the same flood with the throttle effectively off (every attempt costs an argon2
# check, as from an attacker with endless addresses and user names), which shows that the
# password pool, not the throttle, keeps ingest whole.
# Usage: bench/login_flood.sh [DURATION_S=20] [RATE=100] [CONNECTIONS=100] [DEVICES=100]
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-20}; RATE=${2:-100}; CONNS=${3:-100}; DEVICES=${4:-100}
FLOOD=$(mktemp)
trap 'rm -f "$FLOOD"' EXIT
cat > "$FLOOD" <<'PY'
# Wrong logins at a fixed total rate from 8 threads; prints the answers' status counts.
import collections, http.client, json, sys, threading, time
port, rate, duration = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
counts, lock = collections.Counter(), threading.Lock()
def worker(i):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    n, start = 0, time.monotonic()
    while time.monotonic() - start < duration:
        body = json.dumps({"username": "admin" if i % 2 else f"guess{i}", "password": f"wrong{n}"})
        try:
            conn.request("POST", "/api/auth/login", body, {"Content-Type": "application/json"})
            r = conn.getresponse(); r.read(); status = r.status
        except Exception:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10); status = "error"
        with lock: counts[status] += 1
        n += 1
        time.sleep(max(0.0, start + n * 8 / rate - time.monotonic()))
threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print("login flood answers:", dict(counts), f"({sum(counts.values()) / duration:.0f}/s)")
PY
run() {
  local label=$1 flood=$2
  echo "== $label"
  (
    source bench/lib.sh
    PORT=${URL##*:}
    if [ "$flood" = yes ]; then python3 "$FLOOD" "$PORT" "$RATE" "$DURATION" & FPID=$!; fi
    # bench/http_ingest.sh's measurement, against this server.
    python3 - "$DEVICES" > "$TMP/import.json" <<'PY'
import json, sys
n = int(sys.argv[1])
csv = "\n".join(f"bench-{i},bench,BENCH{i}" for i in range(n))
print(json.dumps({"file": csv, "mapping": {"columns": [{"type": "NAME"}, {"type": "TYPE"}, {"type": "ACCESS_TOKEN"}], "delimiter": ",", "update": True, "header": False}}))
PY
    curl -sf -XPOST $URL/api/device/bulk_import -H "X-Authorization: Bearer $JWT" -H 'Content-Type: application/json' --data-binary @"$TMP/import.json" >/dev/null
    C0=$(awk '{print $14+$15}' /proc/$PID/stat)
    wrk -t1 -c$CONNS -d${DURATION}s --latency -s bench/http_telemetry.lua $URL -- $DEVICES 1 > "$TMP/wrk.txt"
    C1=$(awk '{print $14+$15}' /proc/$PID/stat)
    [ "$flood" = yes ] && wait $FPID
    ACKED=$(awk '/^ACKED/{print $2}' "$TMP/wrk.txt")
    grep -E "^ +99%|^ +50%" "$TMP/wrk.txt" | sed 's/^/  latency /'
    python3 -c "acked=$ACKED; cpu=($C1-$C0)/$(getconf CLK_TCK); print(f'  durable req/s: {acked/$DURATION:,.0f}; {acked/cpu:,.0f} per server CPU-second')"
  )
}
run "no login flood" no
run "wrong logins at $RATE/s, default throttle" yes
GRIDLINKS_AUTH_LOGIN_FREE_ATTEMPTS=1000000000 run "wrong logins at $RATE/s, throttle off (every attempt an argon2 check)" yes
