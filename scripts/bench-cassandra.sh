#!/usr/bin/env bash
# Cassandra warmed up (docs/benchmarks.md): one node on one Kafka broker and one
# Cassandra node, a fixed MQTT telemetry load (1,000 devices, QoS 1) for 90 s, and the CPU
# of Cassandra, Kafka and GridLinks sampled every 15 s, so the later windows show the cost
# once the JVMs have compiled their hot code (bench-cluster's stage 5 is 20 s, cold).
#
#   scripts/bench-cassandra.sh [RATE]    (default 2000 msg/s)
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-2000}
[ -x target/release/gridlinks-bench ] && [ -x target/release/gridlinks ] || { echo "build first: cargo build --release -p gridlinks-server -p gridlinks-bench" >&2; exit 1; }
W=$(mktemp -d)
NODE=
trap 'kill $NODE 2>/dev/null; scripts/services/kafka.sh stop $W/kafka >/dev/null 2>&1; scripts/services/cassandra.sh stop $W/cassandra >/dev/null 2>&1; rm -rf $W' EXIT
KAFKA=$(scripts/services/kafka.sh start $W/kafka 1 | tail -1)
CASS=$(scripts/services/cassandra.sh start $W/cassandra)
CP=$(cat $W/cassandra/pid) KP=$(cat $W/kafka/broker-1/pid)
. scripts/services/lib.sh
read -r HTTP MQTT WS COAP < <(free_ports 4)
env GRIDLINKS_ADMIN_PASSWORD=pw-bench-123 GRIDLINKS_LOG=warn GRIDLINKS_CLUSTER_QUEUE=kafka GRIDLINKS_CLUSTER_NODE_ID=n1 \
  GRIDLINKS_CLUSTER_KAFKA_BOOTSTRAP_SERVERS=$KAFKA GRIDLINKS_CLUSTER_KAFKA_REPLICATION_FACTOR=1 GRIDLINKS_CLUSTER_KAFKA_MIN_INSYNC_REPLICAS=1 \
  GRIDLINKS_CLUSTER_TIMESERIES=cassandra GRIDLINKS_CLUSTER_CASSANDRA_CONTACT_POINTS=$CASS GRIDLINKS_CLUSTER_CASSANDRA_REPLICATION_FACTOR=1 \
  target/release/gridlinks serve --data-dir $W/n --http-bind 127.0.0.1:$HTTP --mqtt-bind 127.0.0.1:$MQTT --mqtt-ws-bind 127.0.0.1:$WS --coap-bind 127.0.0.1:$COAP >$W/n.log 2>&1 &
NODE=$!
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$HTTP/readyz" >/dev/null && break
  kill -0 "$NODE" 2>/dev/null || { cat "$W/n.log" >&2; exit 1; }
  sleep 0.1
done
curl -sf "http://127.0.0.1:$HTTP/readyz" >/dev/null || { echo "the node did not become ready in 30 s" >&2; exit 1; }
cpu() { awk '{printf "%.2f", ($14+$15)/100}' /proc/$1/stat; }
( for i in $(seq 1 7); do echo "t+$((i*15-15))s cpu-s cassandra $(cpu $CP) kafka $(cpu $KP) gridlinks $(cpu $NODE)"; sleep 15; done ) &
SAMPLER=$!
target/release/gridlinks-bench mqtt-telemetry --port $MQTT --api http://127.0.0.1:$HTTP --api-password pw-bench-123 --provision \
  --devices 1000 --qos 1 --rate "$RATE" --duration 90s --storage-lag --server-pid "$NODE,$KP,$CP" 2>&1 | grep -v "^\[" | grep -E "throughput|PUBACK  |server pid|storage lag"
wait "$SAMPLER"
