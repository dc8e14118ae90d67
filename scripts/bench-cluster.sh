#!/usr/bin/env bash
# The cluster benchmark (issue 17, docs/benchmarks.md "Scale-out"): one MQTT telemetry load
# (QoS 1, one unique timestamp per message, storage lag sampled, every acknowledged point
# checked afterwards, with Kafka once the storage writers have caught up) on, in one run
# on this machine:
#   1. GridLinks embedded, side by side with Mosquitto (gridlinks-bench compare);
#   2. one GridLinks node committing to Kafka (one KRaft broker), embedded storage;
#   3. one node on Kafka with PostgreSQL time series and shared entities;
#   4. two, then three such nodes, each taking its share of the devices (a load
#      balancer's split), one generator per node;
#   5. one node on Kafka with Cassandra 5 time series (one Cassandra node, 1 GB heap).
# Server CPU is every server process's (gridlinks-bench --server-pid with several pids,
# each with the processes it started): the GridLinks nodes, the Kafka broker's JVM,
# PostgreSQL with its backends and Cassandra's JVM. The bench tool runs on the same two
# cores.
#
#   scripts/bench-cluster.sh [DEVICES] [RATE|max] [DURATION]    (default 1000 2000 20s)
#
# Results: target/bench-results/cluster/*.json and the printed summaries.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICES=${1:-1000}
RATE=${2:-2000}
DURATION=${3:-20s}
B=target/release/gridlinks-bench
G=target/release/gridlinks
OUT=target/bench-results/cluster
PW=bench-admin-password
mkdir -p "$OUT"
[ -x "$B" ] && [ -x "$G" ] || { echo "build first: cargo build --release -p gridlinks-server -p gridlinks-bench" >&2; exit 1; }

W=$(mktemp -d)
chmod 755 "$W" # PostgreSQL runs as its own user
NODES=()
cleanup() {
  for p in "${NODES[@]}"; do kill "$p" 2>/dev/null || true; done
  scripts/services/kafka.sh stop "$W/kafka" >/dev/null 2>&1 || true
  scripts/services/postgres.sh stop "$W/pg" >/dev/null 2>&1 || true
  scripts/services/cassandra.sh stop "$W/cassandra" >/dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT

# CPU seconds used so far by each kind of server process: "gridlinks kafka postgres cassandra".
cpu_now() {
  python3 - "${KAFKA_PID:-0}" "${CASSANDRA_PID:-0}" "${NODES[@]}" <<'PY'
import os, pwd, sys
tick = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / tick
    except (OSError, IndexError):
        return 0.0
def owner(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
pg_uid = pwd.getpwnam("postgres").pw_uid
pg = sum(cpu(p) for p in os.listdir("/proc") if p.isdigit() and owner(p) == pg_uid)
print(sum(cpu(p) for p in sys.argv[3:]), cpu(sys.argv[1]), pg, cpu(sys.argv[2]))
PY
}
# cpu_split BEFORE : what each kind used since BEFORE (a cpu_now), printed.
cpu_split() {
  python3 -c 'import sys; b=[float(x) for x in sys.argv[1].split()]; a=[float(x) for x in sys.argv[2].split()]
print("cpu split, s (the whole run: connect, publish, loss check): gridlinks %.2f  kafka %.2f  postgresql %.2f  cassandra %.2f" % tuple(y-x for x, y in zip(b, a)))' "$1" "$(cpu_now)"
}

# shellcheck source=scripts/services/lib.sh
. scripts/services/lib.sh
load=(--qos 1 --storage-lag --duration "$DURATION")
if [ "$RATE" != max ]; then
  load+=(--rate "$RATE")
fi

# start_node NAME ENV... : starts a node; sets PID, HTTP, MQTT.
start_node() {
  local name=$1
  shift
  local ws coap
  read -r HTTP MQTT ws coap < <(free_ports 4)
  env GRIDLINKS_ADMIN_PASSWORD=$PW GRIDLINKS_LOG=warn "$@" "$G" serve --data-dir "$W/$name" \
    --http-bind "127.0.0.1:$HTTP" --mqtt-bind "127.0.0.1:$MQTT" --mqtt-ws-bind "127.0.0.1:$ws" \
    --coap-bind "127.0.0.1:$coap" >"$W/$name.log" 2>&1 &
  PID=$!
  NODES+=("$PID")
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$HTTP/healthz" >/dev/null && return 0
    kill -0 "$PID" 2>/dev/null || { cat "$W/$name.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "node $name did not start" >&2
  exit 1
}

# import_devices HTTP FILE : creates the NAME,TOKEN lines of FILE through the bulk import.
import_devices() {
  local jwt
  jwt=$(curl -sf -H 'Content-Type: application/json' -d "{\"username\":\"admin\",\"password\":\"$PW\"}" \
    "http://127.0.0.1:$1/api/auth/login" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
  python3 - "$2" <<'PY' >"$W/import.json"
import json, sys
print(json.dumps({"file": open(sys.argv[1]).read(), "mapping": {"columns": [{"type": "NAME"}, {"type": "ACCESS_TOKEN"}],
      "delimiter": ",", "update": True, "header": False}}))
PY
  curl -sf -H 'Content-Type: application/json' -H "X-Authorization: Bearer $jwt" --data @"$W/import.json" \
    "http://127.0.0.1:$1/api/device/bulk_import" >/dev/null
}

# loss_check HTTP ACKS : the loss check, repeated until every acknowledged point is stored
# (with Kafka the storage writers may still be behind, by at most cluster.kafka.max_lag
# records); how long that took after the run.
loss_check() {
  local started=$SECONDS
  for _ in $(seq 1 120); do
    if "$B" verify --acks "$2" --api "http://127.0.0.1:$1" --api-password "$PW" >"$W/verify.out" 2>&1; then
      grep -E "loss check|LOSS" "$W/verify.out"
      echo "every acknowledged point stored $((SECONDS - started)) s (whole seconds) after the run ended"
      return 0
    fi
    sleep 1
  done
  cat "$W/verify.out"
  return 2
}

# one_node NAME PIDS : the load on the node start_node started last (MQTT, HTTP), its
# devices provisioned by the bench tool; server CPU of PIDS (the node and the services it
# uses); the CPU split and the loss check after it. Results in $OUT/NAME.json.
one_node() {
  local before
  before=$(cpu_now)
  "$B" mqtt-telemetry --port "$MQTT" --api "http://127.0.0.1:$HTTP" --api-password "$PW" --provision \
    --devices "$DEVICES" "${load[@]}" --server-pid "$2" --json "$OUT/$1.json" --save-acks "$W/acks.json"
  cpu_split "$before"
  loss_check "$HTTP" "$W/acks.json"
}

echo "== 1. embedded GridLinks and Mosquitto ($DEVICES devices, rate $RATE, $DURATION)"
"$B" compare --against mosquitto --json "$OUT/embedded.json" mqtt-telemetry --devices "$DEVICES" "${load[@]}" --verify

KAFKA=$(scripts/services/kafka.sh start "$W/kafka" 1 | tail -1)
KAFKA_PID=$(cat "$W/kafka/broker-1/pid")
kafka_env() {
  echo GRIDLINKS_CLUSTER_QUEUE=kafka GRIDLINKS_CLUSTER_NODE_ID="$1" GRIDLINKS_CLUSTER_KAFKA_BOOTSTRAP_SERVERS="$KAFKA" \
    GRIDLINKS_CLUSTER_KAFKA_PARTITIONS=12 GRIDLINKS_CLUSTER_KAFKA_REPLICATION_FACTOR=1 \
    GRIDLINKS_CLUSTER_KAFKA_MIN_INSYNC_REPLICAS=1 GRIDLINKS_CLUSTER_KAFKA_TOPIC_PREFIX="$2"
}

echo "== 2. one node on Kafka, embedded storage"
# shellcheck disable=SC2046
start_node kafka-node $(kafka_env kafka-node bench-kafka.)
one_node kafka "$PID,$KAFKA_PID"
kill "$PID"
NODES=()

scripts/services/postgres.sh start "$W/pg" >/dev/null
PG_PID=$(head -1 "$W/pg/data/postmaster.pid")
shared_env() {
  kafka_env "$1" bench-shared.
  echo GRIDLINKS_CLUSTER_TIMESERIES=postgres GRIDLINKS_CLUSTER_ENTITIES=postgres \
    GRIDLINKS_CLUSTER_POSTGRES_URL_FILE="$W/pg/url" GRIDLINKS_AUTH_JWT_SECRET=bench-cluster-jwt-secret-0123456789
}

echo "== 3. one node on Kafka and PostgreSQL (time series and entities)"
# shellcheck disable=SC2046
start_node pg-node-a $(shared_env node-a)
A_PID=$PID A_HTTP=$HTTP A_MQTT=$MQTT
one_node kafka-postgres "$A_PID,$KAFKA_PID,$PG_PID"

# split_load N : the load split over the first N nodes of NODE_PIDS/NODE_HTTP/NODE_MQTT,
# DEVICES/N devices and RATE/N each (a load balancer's split), one generator per node, at
# once. Server CPU (the first generator's figures): every node, Kafka and PostgreSQL.
split_load() {
  local n=$1 share=$((DEVICES / $1)) i before gens=() part=(--qos 1 --storage-lag --duration "$DURATION")
  [ "$RATE" != max ] && part+=(--rate $((RATE / n)))
  local pids
  pids=$(IFS=,; echo "${NODE_PIDS[*]:0:$n},$KAFKA_PID,$PG_PID")
  for i in $(seq 0 $((n - 1))); do
    for d in $(seq 0 $((share - 1))); do echo "split$n-$i-$d,split$n-token-$i-$d"; done >"$W/split$n-$i.csv"
    import_devices "${NODE_HTTP[0]}" "$W/split$n-$i.csv"
  done
  sleep 1 # the other nodes apply the devices (cluster.entities_poll is 250 ms)
  before=$(cpu_now)
  for i in $(seq 0 $((n - 1))); do
    local cpu=()
    [ "$i" = 0 ] && cpu=(--server-pid "$pids")
    "$B" mqtt-telemetry --port "${NODE_MQTT[$i]}" --api "http://127.0.0.1:${NODE_HTTP[$i]}" --api-password "$PW" \
      --tokens-file "$W/split$n-$i.csv" --devices "$share" "${part[@]}" "${cpu[@]}" \
      --json "$OUT/nodes$n-$i.json" --save-acks "$W/acks$n-$i.json" >"$W/split$n-$i.out" &
    gens+=($!)
  done
  wait "${gens[@]}"
  cpu_split "$before"
  for i in $(seq 0 $((n - 1))); do
    loss_check "${NODE_HTTP[$i]}" "$W/acks$n-$i.json"
  done
  echo "-- node 0's part (its server CPU: every node, Kafka, PostgreSQL)"
  cat "$W/split$n-0.out"
  for i in $(seq 1 $((n - 1))); do
    echo "-- node $i's part"
    cat "$W/split$n-$i.out"
  done
}

NODE_PIDS=("$A_PID") NODE_HTTP=("$A_HTTP") NODE_MQTT=("$A_MQTT")
for n in 2 3; do
  echo "== 4. $n nodes on Kafka and PostgreSQL, 1/$n of the devices each"
  # shellcheck disable=SC2046
  start_node "pg-node-$n" $(shared_env "node-$n")
  NODE_PIDS+=("$PID") NODE_HTTP+=("$HTTP") NODE_MQTT+=("$MQTT")
  split_load "$n"
done
kill "${NODE_PIDS[@]}"
NODES=()

echo "== 5. one node on Kafka and Cassandra (time series; embedded entities)"
CASSANDRA=$(scripts/services/cassandra.sh start "$W/cassandra")
CASSANDRA_PID=$(cat "$W/cassandra/pid")
# shellcheck disable=SC2046
start_node cassandra-node $(kafka_env cassandra-node bench-cassandra.) GRIDLINKS_CLUSTER_TIMESERIES=cassandra \
  GRIDLINKS_CLUSTER_CASSANDRA_CONTACT_POINTS="$CASSANDRA" GRIDLINKS_CLUSTER_CASSANDRA_REPLICATION_FACTOR=1
one_node kafka-cassandra "$PID,$KAFKA_PID,$CASSANDRA_PID"
