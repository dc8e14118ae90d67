#!/usr/bin/env bash
# Kafka brokers in KRaft mode on free loopback ports, from the Apache jars on Maven Central
# (fetched once by Maven into target/services/kafka/lib; scripts/services/kafka/pom.xml
# names the version). Each broker is also a controller; the brokers form one quorum.
#
#   scripts/services/kafka.sh start DIR [BROKERS]   start BROKERS (default 1) under DIR;
#                                                   prints the bootstrap servers, also in DIR/bootstrap
#   scripts/services/kafka.sh stop DIR [N]          stop every broker under DIR (or broker N, kill -9)
#   scripts/services/kafka.sh restart DIR N         start broker N again with its data
#   scripts/services/kafka.sh fetch                 only fetch the jars
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/services/lib.sh
. "$ROOT/scripts/services/lib.sh"
LIB=${KAFKA_LIB:-$ROOT/target/services/kafka/lib}
HEAP=${KAFKA_HEAP:-512m}

fetch() { fetch_jars kafka "$LIB"; }

run_broker() { # DIR N
  local dir=$1 n=$2 b="$1/broker-$2"
  # setsid: the broker gets its own process group, so stop can kill it and its children.
  setsid java -Xms128m -Xmx"$HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$dir/log4j2.properties" -Dkafka.logs.dir="$b" \
    -cp "$LIB/*" kafka.Kafka "$b/server.properties" >"$b/stdout.log" 2>&1 </dev/null &
  echo $! >"$b/pid"
}

wait_started() { # DIR N
  local b="$1/broker-$2"
  for _ in $(seq 1 600); do
    if grep -q "Kafka Server started" "$b/stdout.log" 2>/dev/null; then return 0; fi
    if ! kill -0 "$(cat "$b/pid")" 2>/dev/null; then
      echo "kafka broker $2 exited:" >&2; tail -30 "$b/stdout.log" >&2; return 1
    fi
    sleep 0.1
  done
  echo "kafka broker $2 did not start within 60 s" >&2; tail -30 "$b/stdout.log" >&2; return 1
}

start() {
  local dir=$1 brokers=${2:-1}
  fetch
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  cat >"$dir/log4j2.properties" <<'LOG'
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = info
logger.apache.name = org.apache.kafka
logger.apache.level = warn
LOG
  local voters="" bootstrap="" ports=() free
  # Every broker's two ports in one pick, so no two are the same.
  read -r -a free < <(free_ports $((2 * brokers)))
  for n in $(seq 1 "$brokers"); do
    local p=${free[$((2 * n - 2))]} c=${free[$((2 * n - 1))]}
    ports+=("$p:$c")
    voters+="${voters:+,}$n@127.0.0.1:$c"
    bootstrap+="${bootstrap:+,}127.0.0.1:$p"
  done
  local rf=$(( brokers < 3 ? brokers : 3 ))
  local isr=$(( rf > 1 ? 2 : 1 ))
  local cluster
  cluster=$(java -cp "$LIB/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
  for n in $(seq 1 "$brokers"); do
    local b="$dir/broker-$n" p=${ports[$((n-1))]%%:*} c=${ports[$((n-1))]##*:}
    mkdir -p "$b/data"
    cat >"$b/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$p,CONTROLLER://127.0.0.1:$c
advertised.listeners=PLAINTEXT://127.0.0.1:$p
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$b/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
PROPS
    java -cp "$LIB/*" kafka.tools.StorageTool format -t "$cluster" -c "$b/server.properties" >"$b/format.log" 2>&1 \
      || { cat "$b/format.log" >&2; exit 1; }
    run_broker "$dir" "$n"
  done
  for n in $(seq 1 "$brokers"); do wait_started "$dir" "$n"; done
  echo "$bootstrap" >"$dir/bootstrap"
  echo "$bootstrap"
}

stop() {
  local dir=$1 only=${2:-}
  for pidfile in "$dir"/broker-*/pid; do
    [ -f "$pidfile" ] || continue
    local n=${pidfile%/pid}; n=${n##*/broker-}
    if [ -n "$only" ] && [ "$n" != "$only" ]; then continue; fi
    local pid; pid=$(cat "$pidfile")
    if [ -n "$only" ]; then kill -9 -- "-$pid" 2>/dev/null || true
    else kill -- "-$pid" 2>/dev/null || true; fi
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 -- "-$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

restart() {
  local dir=$1 n=$2
  fetch
  : >"$dir/broker-$n/stdout.log"
  run_broker "$dir" "$n"
  wait_started "$dir" "$n"
}

case "${1:-}" in
  start) start "$2" "${3:-1}" ;;
  stop) stop "$2" "${3:-}" ;;
  restart) restart "$2" "$3" ;;
  fetch) fetch ;;
  *) sed -n '2,11p' "$0" >&2; exit 2 ;;
esac
