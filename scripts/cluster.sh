#!/usr/bin/env bash
# A local GridLinks cluster (`make cluster`, docs/scaling.md): three Kafka brokers (KRaft,
# replication factor 3, two in sync), one Cassandra 5 node for the time series, PostgreSQL
# for the shared entities, and three gridlinks nodes on them, all on loopback. Runs until
# Ctrl-C, then stops everything and removes its data.
#
#   scripts/cluster.sh [DIR]     (default: a temporary directory)
#
# Node N (1-3) serves HTTP and the web console on 127.0.0.1:808N-1 (8080, 8081, 8082) and
# MQTT on 1883+N-1 (1883, 1884, 1885); the administrator is admin / GRIDLINKS_ADMIN_PASSWORD
# (default: printed). A device or user made on one node works on every node.
set -euo pipefail
cd "$(dirname "$0")/.."
G=target/release/gridlinks
[ -x "$G" ] || { echo "build first: cargo build --release -p gridlinks-server" >&2; exit 1; }
KEEP=${1:-} # a directory given is kept
W=${1:-$(mktemp -d)}
mkdir -p "$W"
W=$(cd "$W" && pwd)
chmod 755 "$W" # PostgreSQL runs as its own user
PW=${GRIDLINKS_ADMIN_PASSWORD:-$(head -c 12 /dev/urandom | base64 | tr -d '/+=')}
SECRET=$(head -c 32 /dev/urandom | base64 | tr -d '/+=')
NODES=()
cleanup() {
  for p in "${NODES[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/services/kafka.sh stop "$W/kafka" >/dev/null 2>&1 || true
  scripts/services/cassandra.sh stop "$W/cassandra" >/dev/null 2>&1 || true
  scripts/services/postgres.sh stop "$W/pg" >/dev/null 2>&1 || true
  [ -n "$KEEP" ] || rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "starting 3 Kafka brokers, Cassandra and PostgreSQL under $W" >&2
KAFKA=$(scripts/services/kafka.sh start "$W/kafka" 3 | tail -1)
CASSANDRA=$(scripts/services/cassandra.sh start "$W/cassandra")
scripts/services/postgres.sh start "$W/pg" >/dev/null

for n in 1 2 3; do
  http=$((8079 + n)) mqtt=$((1882 + n))
  env GRIDLINKS_ADMIN_PASSWORD="$PW" GRIDLINKS_AUTH_JWT_SECRET="$SECRET" \
    GRIDLINKS_CLUSTER_QUEUE=kafka GRIDLINKS_CLUSTER_NODE_ID="node-$n" \
    GRIDLINKS_CLUSTER_KAFKA_BOOTSTRAP_SERVERS="$KAFKA" GRIDLINKS_CLUSTER_KAFKA_REPLICATION_FACTOR=3 \
    GRIDLINKS_CLUSTER_KAFKA_MIN_INSYNC_REPLICAS=2 \
    GRIDLINKS_CLUSTER_TIMESERIES=cassandra GRIDLINKS_CLUSTER_CASSANDRA_CONTACT_POINTS="$CASSANDRA" \
    GRIDLINKS_CLUSTER_CASSANDRA_REPLICATION_FACTOR=1 \
    GRIDLINKS_CLUSTER_ENTITIES=postgres GRIDLINKS_CLUSTER_POSTGRES_URL_FILE="$W/pg/url" \
    "$G" serve --data-dir "$W/node-$n" --http-bind "127.0.0.1:$http" --mqtt-bind "127.0.0.1:$mqtt" \
    --mqtt-ws-bind "127.0.0.1:$((8182 + n))" --coap-bind "127.0.0.1:$((5682 + n))" >"$W/node-$n.log" 2>&1 &
  NODES+=("$!")
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$http/readyz" >/dev/null && break
    kill -0 "${NODES[-1]}" 2>/dev/null || { cat "$W/node-$n.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "node-$n: http://127.0.0.1:$http  mqtt 127.0.0.1:$mqtt  log $W/node-$n.log" >&2
done
echo "admin password: $PW   (Ctrl-C stops the cluster)" >&2
wait
