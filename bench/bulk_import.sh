#!/usr/bin/env bash
# Bulk import benchmark: N devices (default 30,000) from ThingsBoard's CSV import request
# (name, type, label, access token, one shared and one server attribute), timed end to end
# (HTTP request to response, one durable commit). Then re-imports the same file (all updates).
# Usage: bench/bulk_import.sh [DEVICES=30000]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-30000}
cargo build --release -q -p gridlinks-server --bin gridlinks
BIN=target/release/gridlinks
TMP=$(mktemp -d); trap 'kill $PID 2>/dev/null && wait $PID 2>/dev/null; rm -rf "$TMP"' EXIT
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
GRIDLINKS_ADMIN_PASSWORD=bench GRIDLINKS_LOG=warn $BIN serve --data-dir "$TMP/data" --http-bind 127.0.0.1:$PORT --mqtt-bind 127.0.0.1:0 &
PID=$!
URL=http://127.0.0.1:$PORT
until curl -sf $URL/healthz >/dev/null; do sleep 0.1; done
JWT=$(curl -s -XPOST $URL/api/auth/login -d '{"username":"admin","password":"bench"}' | python3 -c 'import json,sys;print(json.load(sys.stdin)["token"])')
python3 - "$N" > "$TMP/import.json" <<'PY'
import json, sys
n = int(sys.argv[1])
rows = ["name,type,label,token,fw,site"] + [f"device-{i:06d},tracker,Truck {i},TOKEN-{i:06d},1.{i % 10},site-{i % 7}" for i in range(n)]
cols = [{"type": "NAME"}, {"type": "TYPE"}, {"type": "LABEL"}, {"type": "ACCESS_TOKEN"},
        {"type": "SHARED_ATTRIBUTE", "key": "fw"}, {"type": "SERVER_ATTRIBUTE", "key": "site"}]
print(json.dumps({"file": "\n".join(rows), "mapping": {"columns": cols, "delimiter": ",", "update": True, "header": True}}))
PY
for pass in create update; do
  curl -s -o "$TMP/out.json" -w "$pass: HTTP %{http_code} in %{time_total} s\n" -XPOST $URL/api/device/bulk_import \
    -H "X-Authorization: Bearer $JWT" -H 'Content-Type: application/json' --data-binary @"$TMP/import.json"
  python3 -c "import json;r=json.load(open('$TMP/out.json'));print('  created',r['created'],'updated',r['updated'],'errors',r['errors'])"
done
curl -s "$URL/api/tenant/devices?pageSize=1&page=0" -H "X-Authorization: Bearer $JWT" | python3 -c 'import json,sys;print("  totalElements", json.load(sys.stdin)["totalElements"])'
