#!/usr/bin/env bash
# HTTP long polls: N devices each hold a GET /api/v1/{token}/rpc long poll (curl, one
# process each); the server's RSS before and while they wait gives the memory per waiter.
# Then one one-way RPC per device over REST: how long until every poll was answered.
#   N=1000 bench/long_poll.sh            (GRIDLINKS_BIN=… to use a built binary)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1000}
source bench/lib.sh
auth=(-H "X-Authorization: Bearer $JWT" -H 'Content-Type: application/json')
ids=()
for i in $(seq 1 "$N"); do
  ids+=("$(curl -s -XPOST "$URL/api/device?accessToken=LP$i" "${auth[@]}" -d "{\"name\":\"lp-$i\"}" \
    | python3 -c 'import json,sys;print(json.load(sys.stdin)["id"]["id"])')")
done
rss() { awk '/VmRSS/{print $2}' /proc/$PID/status; }
polls() { curl -s "$URL/metrics" | awk '/^gridlinks_http_long_polls /{print $2}'; }
sleep 1
before=$(rss)
mkdir -p "$TMP/out"
pollers=()
for i in $(seq 1 "$N"); do
  curl -s -o "$TMP/out/$i" -w '%{http_code}' "$URL/api/v1/LP$i/rpc?timeout=120000" > "$TMP/out/$i.code" &
  pollers+=($!)
done
until [ "$(polls)" = "$N" ]; do sleep 0.2; done
sleep 1
with=$(rss)
cpu0=$(awk '{print $14+$15}' /proc/$PID/stat)
start=$(date +%s.%N)
for id in "${ids[@]}"; do
  curl -s -o /dev/null -XPOST "$URL/api/plugins/rpc/oneway/$id" "${auth[@]}" -d '{"method":"ping","params":{}}'
done
wait "${pollers[@]}"
end=$(date +%s.%N)
cpu1=$(awk '{print $14+$15}' /proc/$PID/stat)
answered=$(cat "$TMP"/out/*.code | grep -o 200 | wc -l)
echo "long-poll waiters: $N held; server RSS ${before} KiB before, ${with} KiB while waiting:" \
  "$(( (with - before) * 1024 / N )) bytes per waiter"
echo "one-way RPC to each: $answered of $N polls answered 200 in $(python3 -c "print(f'{$end-$start:.2f}')") s" \
  "(the REST calls made one after another by curl), server CPU $(( (cpu1 - cpu0) * 10 )) ms"
