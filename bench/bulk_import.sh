#!/usr/bin/env bash
# Bulk import benchmark: N devices (default 30,000) from ThingsBoard's CSV import request
# (name, type, label, access token, one shared and one server attribute), timed end to end
# (HTTP request to response, one durable commit). Then re-imports the same file (all updates).
# Usage: bench/bulk_import.sh [DEVICES=30000]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-30000}
source bench/lib.sh
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
